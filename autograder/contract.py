"""An exercise's contract in words: the clauses its statement shows and its visible tests exercise.

Each chapter module declares a ``Contract`` per exercise (``autograder.exercises.shared``). Here it
becomes text: ``clauses`` gives one sentence per clause, keyed (``dtype``, ``gradients``, ``modes``,
``inputs``, ``random``, ``attributes``, ``init`` and the exercise's own rule keys), and ``make chapters``
writes them at the end of the exercise's statement between two HTML comments (``place``), so the text
states what the grader checks and nothing drifts. A visible test exercises each clause and says so
with a comment ``# contract: <key>[, <key> ...]`` (``marked``); the self-tests check both.

The Chinese course shows the same clauses in Chinese (``markdown(exercise, "zh")``), generated here too:
a translation covers only the hand-written part of a statement (``hand_written``), so a change of the
contract never makes a translation stale and translators never touch it. The sentences an exercise
declares itself (its dtype, init, rules ...) are looked up in ``ZH``, keyed by their English: a sentence
changed in a grading module and not here has no Chinese, which ``missing_zh`` names.
"""

from __future__ import annotations

import re

from autograder.exercises.shared import Exercise

START = "<!-- contract: written by make chapters from the exercise's grading module -->"
END = "<!-- end of contract -->"
MARKER = re.compile(r"#\s*contract:\s*([\w\- ,]+)")

_INPUTS = ("every tensor passed in is left as it was, bit for bit: no in-place operation on an argument "
           "(`x -= ...`, `mask.unsqueeze_(1)`, `masked_fill_`), because the caller may still need it")
_RANDOM = "torch's, Python's and NumPy's global random generators are left exactly as they were"
_INPUTS_ZH = ("传入的每个张量都保持原样，逐位不变：不对参数做原地（in-place）操作（`x -= ...`、`mask.unsqueeze_(1)`、"
              "`masked_fill_`），因为调用者可能还要用它")
_RANDOM_ZH = "torch、Python 和 NumPy 的全局随机数生成器都保持原样"

#: The Chinese of the sentences the grading modules declare (``Contract.dtype``, ``init``, ``rules`` ...), by
#: their English. Chapters whose statements are translated need every one of theirs.
ZH: dict[str, str] = {
    "the result has the table's dtype: float32 as built, float64 after `.double()`":
        "结果的 dtype 与嵌入表相同：按原样构建时为 float32，`.double()` 之后为 float64",
    "the result has the dtype of `vectors` (float32 in, float32 out; float64 in, float64 out)":
        "结果的 dtype 与 `vectors` 相同（输入 float32 则输出 float32；输入 float64 则输出 float64）",
    "the table is a float32 tensor (computed in float64 or not: both are within the tolerance)":
        "位置表是 float32 张量（是否用 float64 计算都可以：两者都在容差之内）",
    "the result has the dtype of `x` (bfloat16 stays bfloat16; float64, in a module converted with `.double()`, "
    "stays float64)":
        "结果的 dtype 与 `x` 相同（bfloat16 仍是 bfloat16；在用 `.double()` 转换过的模块里，float64 仍是 float64）",
    "as built, the buffer `pe` holds `positional_encoding(max_len, d_model)` with a leading axis of 1 (the grader "
    "compares it before loading any weights)":
        "构建之后，缓冲区 `pe` 存的就是 `positional_encoding(max_len, d_model)`，前面多一个长度为 1 的轴（评分器在载入"
        "任何权重之前比较它）",
    "the matrix is a float64 tensor": "矩阵是 float64 张量",
    "`output` and `p_attn` have the dtype of `query` (float32 in, float32 out; float64 in, float64 out)":
        "`output` 和 `p_attn` 的 dtype 与 `query` 相同（输入 float32 则输出 float32；输入 float64 则输出 float64）",
    "the result has the dtype of `query` (float32 in, float32 out; float64 in, float64 out)":
        "结果的 dtype 与 `query` 相同（输入 float32 则输出 float32；输入 float64 则输出 float64）",
    "a bool tensor of shape (1, size, size)": "形状为 (1, size, size) 的 bool 张量",
    "`src_mask` and `tgt_mask` are bool tensors; `ntokens` is a 0-dim int64 tensor (what `.sum()` of a bool tensor "
    "gives); `src`, `tgt` and `tgt_y` keep the ids' dtype":
        "`src_mask` 和 `tgt_mask` 是 bool 张量；`ntokens` 是 0 维 int64 张量（即对 bool 张量 `.sum()` 得到的结果）；"
        "`src`、`tgt` 和 `tgt_y` 保持词元 id 的 dtype",
    "the result has the dtype of `scores` (float16, bfloat16, float32 and float64 alike)":
        "结果的 dtype 与 `scores` 相同（float16、bfloat16、float32 和 float64 都一样）",
    "the result has the dtype of `x`":
        "结果的 dtype 与 `x` 相同",
    "the output has the dtype of the module and of the inputs: float32, or float64 after `.double()`":
        "输出的 dtype 与模块和输入相同：float32，或 `.double()` 之后的 float64",
    "after a call, `self.attn` holds the attention weights `(batch, h, len_q, len_k)` (after dropout in "
    "training mode); `self.h` and `self.d_k` are the number and width of the heads":
        "一次调用之后，`self.attn` 存着注意力权重 `(batch, h, len_q, len_k)`（训练模式下是 dropout 之后的）；`self.h` 和 `self.d_k` 是头的个数和宽度",
    "the output has the dtype of the module and of `x`: float32, or float64 after `.double()`":
        "输出的 dtype 与模块和 `x` 相同：float32，或 `.double()` 之后的 float64",
    "`x` and the weights are float32, and so is the result (the grader uses no other dtype)":
        "`x` 和权重都是 float32，结果也是（评分器不用其他 dtype）",
    "the call may draw random numbers (building `nn.Conv1d` layers draws their initial weights from "
    "torch's generator before you overwrite them); the result must not depend on them":
        "调用可以抽取随机数（构建 `nn.Conv1d` 层时，会先从 torch 的生成器抽取初始权重，然后你再覆盖它们）；结果不能依赖于这些随机数",
    "the result has the dtype of `x` (float32, float64 and bfloat16 alike)":
        "结果的 dtype 与 `x` 相同（float32、float64 和 bfloat16 都一样）",
    "the result has the dtype of `x` (float32 in, float32 out; float64 in, float64 out)":
        "结果的 dtype 与 `x` 相同（输入 float32 则输出 float32；输入 float64 则输出 float64）",
    "as built, `a_2` is all ones and `b_2` all zeros (the grader compares them before loading any "
    "weights)":
        "构建之后，`a_2` 全为 1，`b_2` 全为 0（评分器在载入任何权重之前比较它们）",
    "as built, `norm.a_2` is all ones and `norm.b_2` all zeros (what `LayerNorm(size)` builds)":
        "构建之后，`norm.a_2` 全为 1，`norm.b_2` 全为 0（即 `LayerNorm(size)` 构建出的样子）",
    "float32, the dtype of the sublayers it is given (the grader uses no other)":
        "float32，即传给它的子层的 dtype（评分器不用其他 dtype）",
    "`self.size` is the `size` given (the provided `Encoder` reads it)":
        "`self.size` 是传入的 `size`（提供的 `Encoder` 会读取它）",
    "as built, the norms of both SublayerConnections have `a_2` all ones and `b_2` all zeros (what "
    "`SublayerConnection(size, dropout)` builds)":
        "构建之后，两个 SublayerConnection 中的归一化层的 `a_2` 全为 1、`b_2` 全为 0（即 `SublayerConnection(size, dropout)` 构建出的样子）",
    "`self.size` is the `size` given (the provided `Decoder` reads it)":
        "`self.size` 是传入的 `size`（提供的 `Decoder` 会读取它）",
    "as built, the norms of the three SublayerConnections have `a_2` all ones and `b_2` all zeros (what "
    "`SublayerConnection(size, dropout)` builds)":
        "构建之后，三个 SublayerConnection 中的归一化层的 `a_2` 全为 1、`b_2` 全为 0（即 `SublayerConnection(size, dropout)` 构建出的样子）",
    "float32, the dtype of the layer it is given (the grader uses no other)":
        "float32，即传给它的层的 dtype（评分器不用其他 dtype）",
    "as built, the final norm has `a_2` all ones and `b_2` all zeros, and each of the N layers starts as "
    "a copy of `layer` (its norms' ones and zeros included)":
        "构建之后，最后的归一化层的 `a_2` 全为 1、`b_2` 全为 0，N 个层中的每一层都从 `layer` 的一份副本开始（包括其归一化层的 1 和 0）",
    "the model is float32 (the grader uses no other dtype)":
        "模型是 float32（评分器不用其他 dtype）",
    "the initial weights are drawn from torch's global generator as the caller left it: two seeds give "
    "two models, so never reseed it inside (`torch.manual_seed`)":
        "初始权重从 torch 的全局生成器中抽取，且生成器保持调用者留下的状态：两个种子给出两个模型，所以绝不要在内部重新设种子（`torch.manual_seed`）",
    "as built, every matrix (a parameter with more than one dimension) is Xavier-uniform, finite and its "
    "own draw; every norm's `a_2` is all ones and `b_2` all zeros; the positional-encoding tables are "
    "chapter 2's":
        "构建之后，每个矩阵（维数大于一的参数）都是 Xavier 均匀初始化的、有限的，并且各自独立抽取；每个归一化层的 `a_2` 全为 1、`b_2` 全为 0；位置编码表是第 2 章的",
    "`x` holds float32 log-probabilities; the loss is a 0-dim float32 tensor, `true_dist` float32 too":
        "`x` 存的是 float32 的对数概率；损失是一个 0 维的 float32 张量，`true_dist` 也是 float32",
    "after a call, `self.true_dist` holds the `(n, size)` smoothed target of that call (the notes keep it "
    "for plotting)":
        "一次调用之后，`self.true_dist` 存着这次调用的 `(n, size)` 平滑目标（笔记保留它用于画图）",
    "a Python `float`, computed in float64 arithmetic; the grader accepts a relative difference of 1e-12 "
    "(another order of the same operations)":
        "一个 Python `float`，用 float64 算术计算；评分器接受 1e-12 的相对差（同样的运算换一种顺序）",
    "the number of optimizer steps, a Python `int`; the model trains in the dtype it has":
        "优化器的步数，一个 Python `int`；模型以它本身的 dtype 训练",
    "it changes the model's parameters, the optimizer's and the scheduler's state, as training does; the "
    "batches are read once and left as they are":
        "它会像训练那样改变模型的参数以及优化器和调度器的状态；各个批次只读一遍，并保持原样",
    "the result has the dtype of `logits` (float32 in, float32 out; float64 in, float64 out)":
        "结果的 dtype 与 `logits` 相同（输入 float32 则输出 float32；输入 float64 则输出 float64）",
    "every token whose logit is at least the `top_k`-th largest stays, so tokens tied with the k-th are "
    "all kept":
        "logit 不小于第 `top_k` 大的那个值的词元都会保留，所以与第 k 个打平的词元全部保留",
    "a token stays exactly when the probability of the more probable tokens before it is below `top_p`: "
    "where it equals `top_p` the token goes":
        "一个词元恰好在排在它前面、概率更大的那些词元的概率之和小于 `top_p` 时保留：等于 `top_p` 时该词元被去掉",
    "among tokens of equal probability the order is yours: any choice that keeps the right number of them "
    "is accepted":
        "概率相等的词元之间的顺序由你决定：只要保留的个数正确，任何选择都接受",
    "`new_scores` has the dtype of `scores + log_probs`, or float64 if you score in float64 (both are "
    "accepted); `parents` and `tokens` are `long`":
        "`new_scores` 的 dtype 与 `scores + log_probs` 相同，若你用 float64 打分也可以是 float64（两者都接受）；`parents` 和 `tokens` 是 `long`",
    "no two candidates of a sentence tie in the graded cases, so the order is unique":
        "在评分用例中，同一个句子的任意两个候选都不会打平，所以顺序是唯一的",
    "`out`, `k` and `v` have the dtype of the module and of `x`: float32, or float64 after `.double()`":
        "`out`、`k` 和 `v` 的 dtype 与模块和 `x` 相同：float32，或 `.double()` 之后的 float64",
    "a Python `int`, whether `dtype` is a torch dtype or a number of bytes (an int or a float)":
        "一个 Python `int`，无论 `dtype` 是 torch 的 dtype 还是字节数（int 或 float）",
    "`dtype` may be a torch dtype (`torch.float16`: 2 bytes, `torch.int8`: 1) or the bytes one number "
    "takes; the grader passes both":
        "`dtype` 可以是 torch 的 dtype（`torch.float16`：2 字节，`torch.int8`：1 字节），也可以是一个数占的字节数；评分器两种都会传",
}


def clauses(exercise: Exercise, language: str = "en") -> list[tuple[str, str]]:
    """``(key, sentence)`` for every clause of the exercise's contract, in the order the text shows them;
    ``language`` "zh" gives the Chinese sentences (``KeyError`` for a declared sentence ``ZH`` lacks)."""
    contract = exercise.contract
    if contract is None:
        raise ValueError(f"{exercise.id} has no contract")
    zh = language == "zh"
    say = (lambda text: ZH[text]) if zh else (lambda text: text)
    words = _words_zh if zh else _words
    found = [("dtype", say(contract.dtype))]
    if contract.gradients:
        names, outputs = words(contract.gradients), exercise.return_names
        if zh:
            reach = (f"梯度经由结果传到 {names}" if not outputs else
                     f"梯度经由每个依赖于它的结果（{words(outputs)}）传到 {names} 中的每一个")
            found.append(("gradients", f"{reach}：请用可微的 torch 运算计算（途中不用 `.detach()`、`.data`、"
                                       "`torch.no_grad()` 或 `torch.tensor(...)`）；评分器把它们与参考实现的梯度比较"))
        else:
            reach = (f"gradients reach {names} through the result" if not outputs else
                     f"gradients reach each of {names} through every result that depends on it ({words(outputs)})")
            found.append(("gradients", f"{reach}: compute with differentiable torch operations (no `.detach()`, "
                                       "`.data`, `torch.no_grad()` or `torch.tensor(...)` on the way); the grader "
                                       "compares them with the reference's"))
    if contract.modes:
        if zh:
            stand_in = ("在训练模式下，每一次 dropout 调用（`nn.Dropout` 或 `F.dropout`）都换成同一个固定的替身，你的模块"
                        "和参考实现用的是同一个，所以 dropout 必须恰好作用在正文所说的位置，只作用一次，用给定的比率；"
                        if exercise.has_dropout else "在训练模式下，")
            found.append(("modes", f"在 eval 模式和训练模式下都评分。{stand_in}输出以及传到输入和每个参数的梯度都与参考实现"
                                   "的比较"))
        else:
            stand_in = (" In training mode every dropout call (`nn.Dropout` or `F.dropout`) is one fixed stand-in, "
                        "the same in your module and in the reference, so dropout must act exactly where the text "
                        "puts it, once, at the rate given;" if exercise.has_dropout else " In training mode")
            found.append(("modes", f"graded in eval mode and in training mode.{stand_in} the output and the gradients "
                                   "reaching the inputs and every parameter are compared with the reference's"))
    found.append(("inputs", (_INPUTS_ZH if zh else _INPUTS) if contract.pure else say(contract.pure_text)))
    if contract.draws:
        found.append(("random", say(contract.draws_text)))
    elif zh:
        found.append(("random", f"{'除了 dropout，' if exercise.has_dropout else ''}一次调用不抽取任何随机数：{_RANDOM_ZH}"))
    else:
        found.append(("random", f"{'apart from dropout, ' if exercise.has_dropout else ''}a call draws no random "
                                f"numbers: {_RANDOM}"))
    if contract.attributes:
        found.append(("attributes", say(contract.attributes_text)))
    if contract.init:
        found.append(("init", say(contract.init)))
    found += [(key, say(text)) for key, text in contract.rules]
    return found


def _words(names: tuple[str, ...]) -> str:
    """The names in backticks, joined by commas and a last "and"."""
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _words_zh(names: tuple[str, ...]) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else "、".join(quoted[:-1]) + " 和 " + quoted[-1]


#: The Chinese label of each clause key (the visible tests' ``# contract: <key>`` comments keep the English key).
LABELS_ZH: dict[str, str] = {
    "dtype": "数据类型", "gradients": "梯度", "modes": "模式", "inputs": "输入", "random": "随机数",
    "attributes": "属性", "init": "初始值", "boundary": "边界", "dtype-argument": "dtype 参数",
    "order": "顺序", "ties": "并列",
}


def markdown(exercise: Exercise, language: str = "en") -> str:
    """The contract as the statement shows it, between ``START`` and ``END`` (in Chinese for "zh")."""
    if language == "zh":
        bullets = "\n".join(f"- **{LABELS_ZH[key]}**（{key}）：{text}。" for key, text in clauses(exercise, "zh"))
        return (f"{START}\n**约定（contract）。** 除了数值，评分器还用新的输入在每份提交上检查下面每一条；"
                f"可见测试逐条演示了它们。\n\n{bullets}\n{END}")
    bullets = "\n".join(f"- **{key}**: {text}." for key, text in clauses(exercise))
    return (f"{START}\n**Contract.** Besides the values, the grader checks each point below on every "
            f"submission, with fresh inputs; the visible tests exercise each one.\n\n{bullets}\n{END}")


def missing_zh(exercise: Exercise) -> list[str]:
    """The sentences the exercise's contract declares that ``ZH`` has no Chinese for."""
    contract = exercise.contract
    declared = [contract.dtype, *(t for _, t in contract.rules)]
    declared += [t for t, used in ((contract.pure_text, not contract.pure), (contract.draws_text, contract.draws),
                                   (contract.attributes_text, bool(contract.attributes)),
                                   (contract.init, bool(contract.init))) if used]
    return [t for t in declared if t not in ZH] + [
        f"the label of clause {key!r} (LABELS_ZH)" for key, _ in clauses(exercise) if key not in LABELS_ZH]


def hand_written(source: str) -> str:
    """A statement's source without the contract ``make chapters`` wrote at its end: what translators translate."""
    return source.split(START, 1)[0].rstrip() if START in source else source


def written_contract(source: str) -> str:
    """The contract block at the end of a statement's source (``""`` if it has none)."""
    return source[source.index(START):].rstrip() if START in source else ""


def localized(block: str, language: str) -> str | None:
    """The contract ``block`` (English, as ``markdown`` wrote it) in ``language``: ``None`` when no exercise
    of the registry has that contract now (a stale notebook) or when ``ZH`` lacks one of its sentences."""
    from autograder.registry import REGISTRY

    for exercise in REGISTRY:
        if exercise.contract is not None and markdown(exercise) == block:
            return None if missing_zh(exercise) else markdown(exercise, language)
    return None


def with_contract(statement: str, exercise: Exercise) -> str:
    """``statement`` (an exercise's Markdown) ending with its current contract, replacing an older one."""
    if START in statement:
        head, rest = statement.split(START, 1)
        if END not in rest:
            raise ValueError(f"{exercise.id}: the contract in the statement has no end marker")
        statement = (head + rest.split(END, 1)[1]).rstrip()
    return f"{statement.rstrip()}\n\n{markdown(exercise)}"


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def statement_index(cells: list, exercise: Exercise) -> int | None:
    """The index of the Markdown cell that states the exercise: the last one before its answer cell."""
    answer = next((i for i, c in enumerate(cells) if _grade_id(c) == exercise.solution_grade_id), None)
    if answer is None:
        return None
    return next((i for i in range(answer - 1, -1, -1) if cells[i].get("cell_type") == "markdown"), None)


def visible_cells(cells: list, exercise: Exercise) -> list:
    """The code cells between the exercise's answer cell and its graded cell: its visible tests."""
    ids = [_grade_id(c) for c in cells]
    if exercise.solution_grade_id not in ids or exercise.test_grade_id not in ids:
        return []
    start, end = ids.index(exercise.solution_grade_id), ids.index(exercise.test_grade_id)
    return [c for c in cells[start + 1:end] if c.get("cell_type") == "code"]


def marked(cells: list) -> set[str]:
    """The clause keys that ``# contract: ...`` comments in these cells name."""
    found: set[str] = set()
    for cell in cells:
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        for match in MARKER.finditer(source):
            found.update(k.strip() for k in match.group(1).split(",") if k.strip())
    return found


def place(cells: list, exercise: Exercise) -> list[str]:
    """Write the exercise's contract into its statement cell (in place); the problems found."""
    index = statement_index(cells, exercise)
    if index is None:
        return [f"{exercise.id}: no Markdown cell states the exercise before its answer cell"]
    cells[index]["source"] = with_contract(cells[index]["source"], exercise)
    return []
