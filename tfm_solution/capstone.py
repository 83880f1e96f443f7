"""Chapter 12 — the capstone (综合项目): a Transformer built from the student's own chapters, trained
on a task that needs attention and graded on what it can do.

The task is **reversal** (逆序): the source is a sequence of symbols followed by ``</s>``, the
target ``<s>``, the same symbols in reverse order, ``</s>``. Output position ``t`` must read
source position ``n - 1 - t``, where ``n`` is the source's length: which position that is depends
on the length, not on what the symbols are, so the model needs the positional encoding (without
it the encoder sees an unordered set) and cross-attention (without it the decoder never sees
the source).

``run_reversal(parts, task)`` trains and evaluates a model built only from ``parts``: a mapping
that holds the student's ``make_model``, ``Batch``, ``LabelSmoothing``, ``SimpleLossCompute``,
``rate``, ``train_with_accumulation``, ``greedy_decode`` and ``greedy_decode_cached``. The
notebook passes its own ``globals()``; the grader runs the same function in its sandbox, on the
submission's namespace, so a student's run in the notebook and the grader's run train the same
model step for step (one thread, the same seeds). This module's shipped functions use only
``torch`` and each other: the grader sends them to its worker as compiled code.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from .decoding import beam_search


@dataclass(frozen=True)
class ReversalTask:
    """The capstone's task, model size and training budget (Part A), all fixed by the course.

    Sequences of ``min_len .. max_len`` symbols drawn from ``symbols`` ordinary ids
    (``4 .. 4 + symbols - 1``; ids 0-3 are the notes' ``<s>``, ``</s>``, ``<blank>``, ``<unk>``).
    The model is ``make_model(vocab, vocab, layers, d_model, d_ff, heads, dropout)``, trained for
    ``steps`` optimizer steps of ``accum_iter`` micro-batches of ``batch_size`` pairs with Adam
    (0.9, 0.98, 1e-9) and ``rate(step, d_model, factor, warmup)``, in ``chunks`` calls of the
    training loop (a held-out loss after each); the weights kept are those of the chunk with the
    lowest held-out loss, as Part B keeps its best epoch. Training stops early once it has used
    ``cpu_budget_s`` CPU seconds. ``held_out`` sequences, none of them seen in training, are
    decoded greedily for the exact-match accuracy.
    """

    symbols: int = 10
    min_len: int = 4
    max_len: int = 10
    layers: int = 2
    d_model: int = 32
    d_ff: int = 64
    heads: int = 4
    dropout: float = 0.0
    steps: int = 600
    batch_size: int = 32
    accum_iter: int = 2
    factor: float = 0.5
    warmup: int = 100
    smoothing: float = 0.0
    chunks: int = 30
    held_out: int = 500
    seed: int = 0
    cpu_budget_s: float = 90.0
    bos: int = 0
    eos: int = 1
    pad: int = 2

    @property
    def vocab(self) -> int:
        """Ids 0-3 are the specials, then the symbols."""
        return 4 + self.symbols


ACCURACY_BANDS = (0.5, 0.8, 0.93)
"""Part A's grading: a case per band of held-out exact match; full marks from 93%, at least three points below the
worst of the correct courses of ``assets/capstone_seeds.json`` (20 training seeds each,
``scripts/capstone_seeds.py``)."""


@dataclass
class Trained:
    """A model trained on the task (``train_reversal``): the model (holding the weights of its best chunk), the
    optimizer steps taken of those planned (counted as the optimizer takes them, whatever the student's loop says:
    fewer when the CPU budget ran out or the loop skipped them), the CPU seconds they took, the loss curve: (steps
    due so far, held-out loss per token) after each chunk of training, the steps due when the kept weights were
    reached, the share of the model's parameters (elements) those weights changed from the initial ones, and the
    parameter tensors they left exactly as initialised (no gradient ever reached them), each as
    ``"name (Class)"`` with the innermost of the student's classes that holds it, and, where there are such
    tensors, the student's classes that cut the graph (``cut_by``)."""

    model: Any
    steps: int
    planned_steps: int
    train_cpu_s: float
    curve: list[tuple[int, float]] = field(default_factory=list)
    kept_step: int = 0
    changed: float = 0.0
    unchanged: tuple[str, ...] = ()
    cut_by: tuple[str, ...] = ()


@dataclass
class Evaluation:
    """What the student's model and decoders made of held-out sequences (``evaluate_reversal``).

    ``pairs``: the held-out (source, target) pairs; ``greedy``: the ids the course's greedy loop
    (``course_greedy``) gets from the student's model ``(sequences, T)``, the graded accuracy;
    ``cached`` and ``theirs``: the ids of the student's ``greedy_decode_cached`` and ``greedy_decode``,
    which must agree token for token; ``forced``: the model's most likely next token at every target
    position when fed the whole target (teacher forcing, with masks made here) ``(sequences, target
    length - 1)``; generated tokens per CPU second of the student's two decoders. ``scores`` turns
    them into shares. ``repeatable``: whether the model, built again with dropout 0.1 and holding the trained
    weights, gives the same log-probabilities twice in evaluation mode (``None`` when it could not be built so).
    """

    pairs: list[tuple[list[int], list[int]]]
    greedy: torch.Tensor
    cached: torch.Tensor
    forced: torch.Tensor
    tokens_per_s: float
    uncached_tokens_per_s: float
    theirs: torch.Tensor | None = None
    repeatable: bool | None = None


PART_A_NAMES = ("make_model", "Batch", "LabelSmoothing", "SimpleLossCompute", "rate", "train_with_accumulation",
                "greedy_decode", "greedy_decode_cached")
"""What Part A calls from the student's code (the model's pieces are called by their ``make_model``)."""


def held_out(symbols: Sequence[int]) -> bool:
    """Whether a symbol sequence belongs to the held-out tenth of all sequences: never trained on, only evaluated.

    A fixed rule rather than a drawn set, so that every evaluation seed draws unseen sequences."""
    return sum((i + 1) * s for i, s in enumerate(symbols)) % 10 == 0


def reversal_pairs(count: int, task: ReversalTask, generator: torch.Generator, evaluation: bool = False
                   ) -> list[tuple[list[int], list[int]]]:
    """``count`` pairs ``(symbols + [</s>], [<s>] + reversed symbols + [</s>])``: held-out sequences
    (``held_out``) for an evaluation, the others for training."""
    pairs: list[tuple[list[int], list[int]]] = []
    while len(pairs) < count:
        length = int(torch.randint(task.min_len, task.max_len + 1, (1,), generator=generator))
        symbols = torch.randint(4, task.vocab, (length,), generator=generator).tolist()
        if held_out(symbols) == evaluation:
            pairs.append((symbols + [task.eos], [task.bos] + symbols[::-1] + [task.eos]))
    return pairs


def padded(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    """``(len(rows), longest)`` long tensor, each row followed by ``pad``."""
    longest = max(len(r) for r in rows)
    return torch.tensor([list(r) + [pad] * (longest - len(r)) for r in rows], dtype=torch.long)


def forced_predictions(model: nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad: int
                       ) -> torch.Tensor:
    """``model``'s most likely next token at every position of each whole target (teacher forcing),
    ``(len(pairs), longest target - 1)``.

    The masks are made here, not by the student's ``Batch``: padded source keys hidden, and each
    target position sees itself and the positions before it. A greedy decoder that works gets exactly
    the targets whose every next token is right here, so the two measures differ only when the
    decoding is at fault.
    """
    src = padded([s for s, _ in pairs], pad)
    tgt_in = padded([t for _, t in pairs], pad)[:, :-1]
    causal = torch.ones(1, tgt_in.size(1), tgt_in.size(1), dtype=torch.bool).tril()
    with torch.no_grad():
        out = model(src, tgt_in, (src != pad).unsqueeze(-2), (tgt_in != pad).unsqueeze(-2) & causal)
        return model.generator(out).argmax(-1)


def course_greedy(model: nn.Module, src: torch.Tensor, src_mask: torch.Tensor, max_len: int, bos: int, eos: int,
                  pad: int) -> torch.Tensor:
    """The course's greedy loop over any model with the notes' ``forward`` and ``generator``: ``(batch, src_len)``
    -> ids ``(batch, <= max_len)`` from ``bos``, ``pad`` after a sequence's ``eos``. No cache and masks made here
    (each target position sees itself and those before it), so what it gets is what the model learned."""
    ys = torch.full((src.size(0), 1), bos, dtype=torch.long)
    ended = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len - 1):
        causal = torch.ones(1, ys.size(1), ys.size(1), dtype=torch.bool).tril()
        out = model(src, ys, src_mask, causal)
        chosen = model.generator(out[:, -1]).argmax(-1)
        chosen = torch.where(ended, torch.full_like(chosen, pad), chosen)
        ys = torch.cat([ys, chosen[:, None]], dim=1)
        ended |= chosen == eos
        if bool(ended.all()):
            break
    return ys


def scores(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], greedy: torch.Tensor, cached: torch.Tensor,
           forced: torch.Tensor, pad: int, theirs: torch.Tensor | None = None) -> tuple[float, float, float]:
    """``(accuracy, forced accuracy, agreement)``: the shares of ``pairs`` whose target the greedy ids
    hold exactly (``<s>`` to ``</s>``), whose every next token teacher forcing gets right, and whose
    cached ids equal the uncached ones (``theirs``, the student's own uncached decoder, else ``greedy``)."""
    targets = [list(t) for _, t in pairs]
    if greedy.dim() != 2 or forced.dim() != 2 or len(greedy) != len(targets) or len(forced) != len(targets):
        raise ValueError(f"expected one row per held-out sequence ({len(targets)}), got {tuple(greedy.shape)} "
                         f"and {tuple(forced.shape)}")
    exact = [row[:len(t)] == t for row, t in zip(greedy.tolist(), targets)]
    right = [row[:len(t) - 1] == t[1:] for row, t in zip(forced.tolist(), targets)]
    uncached = greedy if theirs is None else theirs
    agree = same_rows(cached, uncached, pad) if cached.dim() == 2 == uncached.dim() and \
        len(cached) == len(targets) == len(uncached) else [False]
    n = len(targets)
    return sum(exact) / n, sum(right) / n, sum(agree) / n


def same_rows(a: torch.Tensor, b: torch.Tensor, pad: int) -> list[bool]:
    """Row by row, whether two id tensors hold the same tokens once the narrower is padded with ``pad``."""
    width = max(a.size(1), b.size(1))

    def widen(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t.long(), torch.full((t.size(0), width - t.size(1)), pad, dtype=torch.long)], dim=1)

    return (widen(a) == widen(b)).all(dim=1).tolist()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one thread: the same sums in the same order on every machine, so the same result."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _needs(parts: Mapping[str, Any], names: Sequence[str] = ("make_model", "Batch", "LabelSmoothing",
                                                             "SimpleLossCompute", "rate", "train_with_accumulation")
           ) -> None:
    """Stop with the notebook's own kind of error, naming every missing piece, before anything runs (by default:
    what a training run, of Part A or B, takes from the student's code)."""
    missing = [name for name in names if name not in parts]
    if missing:
        raise NameError(f"name {missing[0]!r} is not defined: this runs your own "
                        + ", ".join(f"`{name}`" for name in missing) + " (the first cell loads your chapters' "
                        "answers; or write them in this notebook)")


def train_reversal(parts: Mapping[str, Any], task: ReversalTask,
                   on_chunk: Callable[[int, float, nn.Module], None] | None = None) -> Trained:
    """Train ``parts["make_model"]``'s model on the reversal task with the student's loop.

    Everything the model and its training compute comes from ``parts`` (``make_model``, ``Batch``,
    ``LabelSmoothing``, ``SimpleLossCompute``, ``rate``, ``train_with_accumulation``); this function
    only draws the data, makes Adam and ``LambdaLR``, and counts. One thread and ``task.seed`` for the
    weights and the data: the same code trains the same model. ``on_chunk(step, loss, model)`` is called
    after each chunk with the held-out loss per token.
    """
    _needs(parts)
    with one_thread():
        return _train_reversal(parts, task, on_chunk)


def _train_reversal(parts: Mapping[str, Any], task: ReversalTask,
                    on_chunk: Callable[[int, float, nn.Module], None] | None) -> Trained:
    watch = reversal_pairs(64, task, torch.Generator().manual_seed(task.seed + 1), evaluation=True)
    torch.manual_seed(task.seed)
    model = parts["make_model"](task.vocab, task.vocab, task.layers, task.d_model, task.d_ff, task.heads,
                                task.dropout)
    Batch = parts["Batch"]  # noqa: N806 - the student's class
    loss_compute = parts["SimpleLossCompute"](model.generator, parts["LabelSmoothing"](task.vocab, task.pad,
                                                                                      task.smoothing))
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    taken = [0]  # optimizer steps as the optimizer takes them, not as the student's loop reports them
    optimizer.register_step_post_hook(lambda *_: taken.__setitem__(0, taken[0] + 1))
    rate = parts["rate"]
    scheduler = LambdaLR(optimizer, lambda step: rate(step, task.d_model, task.factor, task.warmup))
    data = torch.Generator().manual_seed(task.seed)
    watched = Batch(padded([s for s, _ in watch], task.pad), padded([t for _, t in watch], task.pad), task.pad)

    def held_out_loss() -> float:
        model.eval()
        with torch.no_grad():
            out = model(watched.src, watched.tgt, watched.src_mask, watched.tgt_mask)
            total, _ = loss_compute(out, watched.tgt_y, watched.ntokens)
        return float(total) / max(int(watched.ntokens), 1)

    curve = [(0, held_out_loss())]
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    best: tuple[float, int, dict | None] = (math.inf, 0, None)
    start, steps = time.process_time(), 0
    per_chunk = math.ceil(task.steps / task.chunks)
    while steps < task.steps and time.process_time() - start < task.cpu_budget_s:
        count = min(per_chunk, task.steps - steps)
        micro = []
        for _ in range(count * task.accum_iter):
            pairs = reversal_pairs(task.batch_size, task, data)
            micro.append(Batch(padded([s for s, _ in pairs], task.pad), padded([t for _, t in pairs], task.pad),
                               task.pad))
        parts["train_with_accumulation"](model, iter(micro), loss_compute, optimizer, scheduler, task.accum_iter)
        steps += count
        curve.append((steps, held_out_loss()))
        if curve[-1][1] < best[0]:
            # A late spike of the loss (a rate still high for so small a model) must not decide the grade.
            best = (curve[-1][1], steps, copy.deepcopy(model.state_dict()))
        if on_chunk is not None:
            on_chunk(*curve[-1], model)
    train_cpu_s = time.process_time() - start
    if best[2] is not None:
        model.load_state_dict(best[2])
    differs = {name: int((p.detach() != initial[name]).sum()) for name, p in model.named_parameters()}
    unchanged = tuple(f"{name} ({_holder(model, name)})" for name, count in differs.items() if not count)
    return Trained(model, taken[0], task.steps, train_cpu_s, curve, kept_step=best[1],
                   changed=sum(differs.values()) / max(sum(p.numel() for p in initial.values()), 1),
                   unchanged=unchanged, cut_by=_cut_by(model, watched) if unchanged else ())


def _cut_by(model: nn.Module, batch: Any) -> tuple[str, ...]:
    """The student's classes that cut the graph in one forward pass of ``batch``: the innermost modules whose
    output carries no gradient back to inputs that have one (a ``.detach()`` inside), or that run a module of
    theirs with gradients switched off (a ``torch.no_grad()`` around it)."""
    cut: list[nn.Module] = []
    entered: list[tuple[nn.Module, bool]] = []

    def enter(module: nn.Module, inputs: tuple) -> None:
        grad = torch.is_grad_enabled()
        if not grad and entered and entered[-1][1]:
            cut.append(entered[-1][0])  # the caller switched gradients off around this module
        entered.append((module, grad))

    def leave(module: nn.Module, inputs: tuple, output: Any) -> None:
        entered.pop()
        ins = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        outs = [t for t in (output if isinstance(output, (tuple, list)) else (output,))
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad]
        if not torch.is_grad_enabled() or not ins:
            return
        grads = (torch.autograd.grad(sum(t.sum() for t in outs), ins, allow_unused=True, retain_graph=True)
                 if outs else [None])
        if all(g is None for g in grads):
            cut.append(module)

    theirs = [m for m in model.modules() if not type(m).__module__.startswith("torch.")]
    hooks = [h for m in theirs for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        with torch.enable_grad():
            model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    finally:
        for hook in hooks:
            hook.remove()
    # A module holding a cut one is cut too: keep the innermost.
    inner = [m for m in cut if not any(o is not m and any(o is d for d in m.modules()) for o in cut)]
    return tuple(dict.fromkeys(type(m).__name__ for m in inner))


def _holder(model: nn.Module, name: str) -> str:
    """The class name of the innermost module on the dotted path of parameter ``name`` that is not one of
    PyTorch's own (``nn.Linear``, ``nn.ModuleList``): the class whose code decides whether it learns."""
    path = name.split(".")[:-1]
    while path:
        module = model.get_submodule(".".join(path))
        if not type(module).__module__.startswith("torch."):
            return type(module).__name__
        path.pop()
    return type(model).__name__


def evaluate_reversal(parts: Mapping[str, Any], model: nn.Module, task: ReversalTask, eval_seed: int) -> Evaluation:
    """``task.held_out`` unseen sequences drawn from ``eval_seed``, decoded from the student's model by the course's
    greedy loop (the graded accuracy: a decoder cannot answer for a model that did not learn), and by the student's
    ``greedy_decode`` and ``greedy_decode_cached`` (which must agree token for token)."""
    _needs(parts, ("greedy_decode", "greedy_decode_cached"))
    with one_thread():
        return _evaluate_reversal(parts, model, task, eval_seed)


def _evaluate_reversal(parts: Mapping[str, Any], model: nn.Module, task: ReversalTask, eval_seed: int) -> Evaluation:
    pairs = reversal_pairs(task.held_out, task, torch.Generator().manual_seed(eval_seed), evaluation=True)
    model.eval()
    src = padded([s for s, _ in pairs], task.pad)
    src_mask = (src != task.pad).unsqueeze(-2)
    longest = task.max_len + 2
    with torch.no_grad():
        begin = time.process_time()
        greedy = parts["greedy_decode"](model, src, src_mask, longest, task.bos, task.eos, task.pad)
        uncached_s = time.process_time() - begin
        begin = time.process_time()
        cached = parts["greedy_decode_cached"](model, src, src_mask, longest, task.bos, task.eos, task.pad)
        cached_s = time.process_time() - begin
        course = course_greedy(model, src, src_mask, longest, task.bos, task.eos, task.pad)
    return Evaluation(pairs, course, cached, forced_predictions(model, pairs, task.pad),
                      tokens_per_s=float((cached[:, 1:] != task.pad).sum()) / max(cached_s, 1e-9),
                      uncached_tokens_per_s=float((greedy[:, 1:] != task.pad).sum()) / max(uncached_s, 1e-9),
                      theirs=greedy, repeatable=repeatable(parts, model, task, pairs[:64]))


def repeatable(parts: Mapping[str, Any], model: nn.Module, task: ReversalTask,
               pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> bool | None:
    """Whether ``model``'s architecture, built again by the student's ``make_model`` with dropout 0.1 and given the
    trained weights, returns the same log-probabilities twice for ``pairs`` in evaluation mode: dropout must be off
    there. Part A trains at dropout 0, where a dropout left on in evaluation changes nothing; this is where it shows.
    ``None`` when the model cannot be built or loaded so (then nothing is judged)."""
    try:
        torch.manual_seed(task.seed)
        twin = parts["make_model"](task.vocab, task.vocab, task.layers, task.d_model, task.d_ff, task.heads, 0.1)
        twin.load_state_dict(model.state_dict())
    except Exception:  # noqa: BLE001 - a model that cannot be rebuilt so is judged by its accuracy alone
        return None
    twin.eval()
    src = padded([s for s, _ in pairs], task.pad)
    tgt = padded([t for _, t in pairs], task.pad)[:, :-1]
    causal = torch.ones(1, tgt.size(1), tgt.size(1), dtype=torch.bool).tril()
    masks = ((src != task.pad).unsqueeze(-2), (tgt != task.pad).unsqueeze(-2) & causal)
    with torch.no_grad():
        first, second = (twin.generator(twin(src, tgt, *masks)) for _ in range(2))
    return bool(torch.equal(first, second))


# ----------------------------------------------------------------------------- Part B: translation

@dataclass(frozen=True)
class TranslationTask:
    """Part B: German to English at the course model's size, decoded as the course model's card is.

    The model is ``make_model(src_vocab, tgt_vocab, layers, d_model, d_ff, heads, dropout)`` (the
    course model's dimensions, with its shared 5000-piece vocabulary); sentences are translated in
    batches of ``batch_size``, in the given order, with beams of ``beam_size``, length penalty
    ``alpha`` and at most ``max_extra`` ids more than the batch's longest source. Batches stop once
    ``cpu_budget_s`` CPU seconds are spent: the course model translates the 1,000 sentences of test_2016 in about
    80, and a model that never ends its sentences would take ten times that.
    """

    src_vocab: int = 5000
    tgt_vocab: int = 5000
    layers: int = 3
    d_model: int = 128
    d_ff: int = 512
    heads: int = 4
    dropout: float = 0.1
    beam_size: int = 4
    alpha: float = 0.6
    max_extra: int = 50
    batch_size: int = 64
    cpu_budget_s: float = 200.0
    bos: int = 0
    eos: int = 1
    pad: int = 2


def weight_names(names: Sequence[str]) -> tuple[str, ...]:
    """The names of the weights that travel with them to the grader's worker (in the same order)."""
    return tuple(str(n) for n in names)


class WithYourMask(nn.Module):
    """The student's model, decoding with the student's own causal mask.

    The course's beam-search loop (chapter 10) builds a causal mask and calls
    ``model.decode(memory, src_mask, ys, mask)``; this wrapper passes ``subsequent_mask(len)`` of the
    student's code instead, so every tensor of the search is computed by the student's code.
    """

    def __init__(self, model: nn.Module, subsequent_mask: Callable[[int], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.subsequent_mask = subsequent_mask

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        return self.model.encode(src, src_mask)

    def decode(self, memory: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor, tgt_mask: torch.Tensor
               ) -> torch.Tensor:
        return self.model.decode(memory, src_mask, tgt, self.subsequent_mask(tgt.size(1)))

    def generator(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.generator(x)


def load_weights(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> nn.Module:
    """``model`` with ``weights`` loaded (as float32), after checking that their names and shapes are
    exactly those of the model's own ``state_dict``; a ``ValueError`` names every difference.

    The positional encodings' sinusoid tables (buffers named ``*.pe``) are no weights: an export leaves
    them out (``tfm_solution.checkpoint.rebuilt_buffers``), so the model keeps the tables its own
    ``PositionalEncoding`` built, rounded to the file's precision like every tensor in it.
    """
    own = model.state_dict()
    rebuilt = {name for name, _ in model.named_buffers() if name.endswith(".pe") and name not in weights}
    missing = [k for k in own if k not in weights and k not in rebuilt]
    extra = [k for k in weights if k not in own]
    shapes = [f"{k} {tuple(weights[k].shape)} (your model: {tuple(own[k].shape)})" for k in own
              if k in weights and tuple(weights[k].shape) != tuple(own[k].shape)]
    if missing or extra or shapes:
        lines = ([f"missing from the file: {', '.join(missing[:10])}"] if missing else []) + (
            [f"not in your model: {', '.join(extra[:10])}"] if extra else []) + (
            [f"other shapes: {', '.join(shapes[:10])}"] if shapes else [])
        raise ValueError("the weights do not fit your model built at the course model's size: " + "; ".join(lines))
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    exported_as = next(iter(weights.values())).dtype if weights else torch.float32
    with torch.no_grad():
        for name in rebuilt:
            model.get_buffer(name).copy_(model.get_buffer(name).to(exported_as))
    return model


def translate_part_b(parts: Mapping[str, Any], weights: Mapping[str, torch.Tensor], sources: torch.Tensor,
                     task: TranslationTask) -> torch.Tensor:
    """Part B: the student's model (their ``make_model`` at the course's size) holding ``weights``,
    translating ``sources`` ``(sentences, longest)`` (ids, padded) with the course's beam search over
    their model, their ``subsequent_mask`` and their ``beam_step``. Returns the best hypothesis of
    each sentence, ``(sentences, longest output)`` ids from ``<s>`` to ``</s>``, padded; the sentences left when
    ``task.cpu_budget_s`` ran out are rows of ``pad`` alone (no ``<s>``)."""
    _needs(parts, ("make_model", "subsequent_mask", "beam_step"))
    with one_thread():
        torch.manual_seed(0)
        model = parts["make_model"](task.src_vocab, task.tgt_vocab, task.layers, task.d_model, task.d_ff,
                                    task.heads, task.dropout)
        model = WithYourMask(load_weights(model, weights).eval(), parts["subsequent_mask"])
        rows: list[list[int]] = []
        begin = time.process_time()
        for start in range(0, sources.size(0), task.batch_size):
            if time.process_time() - begin > task.cpu_budget_s:
                rows += [[task.pad]] * (sources.size(0) - start)
                break
            src = sources[start:start + task.batch_size]
            src = src[:, : int((src != task.pad).sum(1).max())]
            src_mask = (src != task.pad).unsqueeze(-2)
            found = beam_search(model, src, src_mask, src.size(1) + task.max_extra, task.bos, task.eos,
                                beam_size=task.beam_size, alpha=task.alpha, use_cache=False,
                                step_fn=parts["beam_step"])
            rows += [best[0].tokens for best in found]
    return padded(rows, task.pad)


@dataclass
class Translator:
    """What ``train_multi30k`` gives back: the model (with its best epoch's weights), the epochs and optimizer
    steps it trained, its CPU seconds, and (epoch, validation loss per token) after each epoch."""

    model: Any
    epochs: int
    steps: int
    train_cpu_s: float
    curve: list[tuple[int, float]] = field(default_factory=list)


def train_multi30k(parts: Mapping[str, Any], task: TranslationTask, epochs: int = 10, data_dir: Any = None,
                   max_steps: int | None = None, seed: int = 0, on_epoch: Callable[[int, float], None] | None = None,
                   device: str | torch.device | None = None) -> Translator:
    """Part B's training: the student's model at the course model's size on Multi30k, with the course
    model's recipe and the student's code (``make_model``, ``Batch``, ``LabelSmoothing`` with smoothing
    0.1, ``SimpleLossCompute``, ``rate`` with factor 0.5 and 800 warm-up steps, ``train_with_accumulation``).

    The course's shared tokenizer and its batching (pairs of at most 100 ids, batches of at most 3000
    tokens, reshuffled every epoch); the validation loss after each epoch decides which weights are
    kept. ``max_steps`` stops early (a short run); ``on_epoch(epoch, validation loss)`` reports.
    ``device``: where to train (default: the GPU when there is one, else the CPU); the student's ``Batch``
    builds each batch on the CPU and its tensors are moved there. The model comes back on the CPU.
    """
    from .course_model import COURSE_MODEL_DIR
    from .data import TokenizerPair, load_multi30k, multi30k_dir, pad_batch, token_batches

    _needs(parts)

    tokenizer = TokenizerPair.load(COURSE_MODEL_DIR)
    folder = multi30k_dir(data_dir)
    train, _ = tokenizer.encode_pairs(load_multi30k("train", folder), 100)
    val, _ = tokenizer.encode_pairs(load_multi30k("val", folder), 100)
    Batch = parts["Batch"]  # noqa: N806 - the student's class

    where = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")

    def batches(examples, generator=None):
        for indices in token_batches(examples, 3000, generator):
            batch = Batch(pad_batch([examples[i][0] for i in indices], task.pad),
                          pad_batch([examples[i][1] for i in indices], task.pad), task.pad)
            for name, value in vars(batch).items():
                if isinstance(value, torch.Tensor):
                    setattr(batch, name, value.to(where))
            yield batch

    torch.manual_seed(seed)
    model = only_yours(parts["make_model"](task.src_vocab, task.tgt_vocab, task.layers, task.d_model, task.d_ff,
                                           task.heads, task.dropout)).to(where)
    loss_compute = parts["SimpleLossCompute"](model.generator, parts["LabelSmoothing"](task.tgt_vocab, task.pad, 0.1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    taken = [0]  # optimizer steps as the optimizer takes them, not as the student's loop reports them
    optimizer.register_step_post_hook(lambda *_: taken.__setitem__(0, taken[0] + 1))
    rate = parts["rate"]
    scheduler = LambdaLR(optimizer, lambda step: rate(step, task.d_model, 0.5, 800))
    order = torch.Generator().manual_seed(seed)
    start, steps, best, curve = time.process_time(), 0, (math.inf, None), []
    for epoch in range(epochs):
        plan = list(batches(train, order))
        if max_steps is not None:
            plan = plan[: max(max_steps - steps, 0)]
        if not plan:
            break
        steps += parts["train_with_accumulation"](model, iter(plan), loss_compute, optimizer, scheduler, 1)
        model.eval()
        with torch.no_grad():
            losses = [(float(loss_compute(model(b.src, b.tgt, b.src_mask, b.tgt_mask), b.tgt_y, b.ntokens)[0]),
                       int(b.ntokens)) for b in batches(val)]
        val_loss = sum(l for l, _ in losses) / sum(n for _, n in losses)
        curve.append((epoch, val_loss))
        if on_epoch is not None:
            on_epoch(epoch, val_loss)
        if val_loss < best[0]:
            best = (val_loss, copy.deepcopy(model.state_dict()))
    if best[1] is not None:
        model.load_state_dict(best[1])
    return Translator(model.cpu().eval(), len(curve), steps, time.process_time() - start, curve)


def foreign_modules(model: nn.Module) -> list[str]:
    """Submodules of ``model`` whose class comes from the course's reference package (``tfm_solution``)
    rather than from the student's code or from ``torch.nn``: ``["encoder.layers.0.self_attn: MultiHeadedAttention"]``."""
    return [f"{name or '(the model itself)'}: {type(module).__name__}" for name, module in model.named_modules()
            if type(module).__module__.split(".")[0] == "tfm_solution"]


def only_yours(model: nn.Module) -> nn.Module:
    """``model`` itself, after checking that no part of it is the course's reference code."""
    found = foreign_modules(model)
    if found:
        raise TypeError("these parts of the model are the course's reference classes, not yours: "
                        + ", ".join(found[:8]) + ". Define them in this notebook (or load your chapters) "
                        "and build the model with your own make_model.")
    return model
