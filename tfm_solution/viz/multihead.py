"""Chapter 5's widgets: the shape tracer, one head against two on a task that needs two positions,
and the heads of the course model on real sentences.

Each widget takes the student's answer (``split_heads``/``merge_heads`` or the class
``MultiHeadedAttention``), draws with it when it works and with the reference otherwise, and
renders every frame in advance, so that it also responds on the static website.
"""

from __future__ import annotations

import copy
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import nn

from ..attention import attention
from ..masks import subsequent_mask
from ..multihead import MultiHeadedAttention
from ..multihead import merge_heads as reference_merge
from ..multihead import split_heads as reference_split
from .frames import FramePlayer, figure_png
from .masks import FrameGrid
from .student import Resolved, fixed_weights, resolve

@contextmanager
def one_thread() -> Iterator[None]:
    """Run PyTorch on one thread inside the block: tensors this small only lose time to thread
    start-up, and badly so on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


#: One colour per head (up to eight); mixed features (after W^O) are grey.
HEAD_COLOURS = ("#93c5fd", "#fdba74", "#86efac", "#f9a8d4", "#c4b5fd", "#fde047", "#5eead4", "#fca5a5")
_MIXED = "#d1d5db"


# --------------------------------------------------------------------------- the shape tracer


@dataclass(frozen=True)
class TraceStep:
    """One step of the trace, ready to draw.

    Attributes:
        title: the operation, as code.
        shape: the tensor's shape after it (batch axis of 1 included).
        layout: ``"n d"``, ``"n h d"`` or ``"h n d"``: how the cells are laid out (batch axis dropped).
        values: the entries in reading (logical, row-major) order.
        heads: the head each of those entries belongs to (-1: every head mixed).
        memory_values, memory_heads: the same entries in the order they sit in memory.
        contiguous: whether reading order is memory order (what ``view`` needs).
        stride: the tensor's stride.
        note: one sentence under the picture.
    """

    title: str
    shape: tuple[int, ...]
    layout: str
    values: list[float]
    heads: list[int]
    memory_values: list[float]
    memory_heads: list[int]
    contiguous: bool
    stride: tuple[int, ...]
    note: str


def _in_memory(t: torch.Tensor) -> torch.Tensor:
    """The entries of ``t`` in storage order (``t`` covers its whole storage, as every tensor here does)."""
    return torch.as_strided(t, (t.numel(),), (1,), t.storage_offset())


def _step(title: str, layout: str, values: torch.Tensor, heads: torch.Tensor, note: str) -> TraceStep:
    """A ``TraceStep`` of ``values``; ``heads`` was made by the same operations, so it has the same strides."""
    if values.stride() != heads.stride():
        heads = heads.contiguous() if values.is_contiguous() else heads
    return TraceStep(title, tuple(values.shape), layout, values.reshape(-1).tolist(), heads.reshape(-1).tolist(),
                     _in_memory(values).tolist(), _in_memory(heads).tolist(), values.is_contiguous(),
                     tuple(values.stride()), note)


def _probe_split(fn: Callable) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return fn(torch.randn(2, 5, 12, generator=g, dtype=torch.float64), 3)


def _probe_merge(fn: Callable) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return fn(torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64))


def trace_steps(split_fn: Callable = reference_split, merge_fn: Callable = reference_merge,
                n: int = 3, d_model: int = 6, h: int = 2) -> list[TraceStep]:
    """Follow one ``(1, n, d_model)`` projection through multi-head attention, step by step.

    The entries are numbered ``0 .. n*d_model - 1`` in memory order, so every cell can be
    followed by eye. Feature ``c`` belongs to head ``c // d_k``. ``split_fn(x, h)`` and
    ``merge_fn(x)`` decide where the entries go: a wrong split or merge shows as colours in the
    wrong blocks. The attention step uses ``q = k = v`` (the split numbers divided by 10).

    Returns:
        Seven steps: ``linears[0](x)``, ``view``, ``transpose`` (= ``split_fn``), attention,
        ``transpose`` back, ``contiguous().view`` (= ``merge_fn``), ``linears[3]``.
    """
    d_k = d_model // h
    x = torch.arange(n * d_model, dtype=torch.float64).view(1, n, d_model)
    owner = (torch.arange(d_model, dtype=torch.float64) // d_k).expand(1, n, d_model).contiguous()
    steps = [_step("q = linears[0](x)", "n d", x, owner,
                   f"One row per position, d_model = {d_model} features. Head i owns features "
                   f"i*d_k to (i+1)*d_k - 1 (d_k = {d_k}). The numbers are the entries' places in memory.")]
    steps.append(_step(f".view(1, {n}, {h}, {d_k})  ->  (b, n, h, d_k)", "n h d", x.view(1, n, h, d_k),
                       owner.view(1, n, h, d_k),
                       "The same memory read in groups of d_k: each position now holds h small vectors. No copy."))
    split, split_owner = split_fn(x, h), split_fn(owner, h)
    steps.append(_step(".transpose(1, 2)  ->  (b, h, n, d_k)", "h n d", split, split_owner,
                       "The head axis moves in front of the positions: one n x d_k matrix per head, ready for a "
                       "batched matmul. Nothing moved in memory: reading order and memory order now differ."))
    out, p_attn = attention(split / 10, split / 10, split / 10)
    out_heads = torch.arange(h, dtype=torch.float64).view(1, h, 1, 1).expand(1, h, n, d_k).contiguous()
    first = ", ".join(f"{w:.2f}" for w in p_attn[0, 0, 0].tolist())
    steps.append(_step("attention(q, k, v): every head at once", "h n d", out, out_heads,
                       f"Each head mixes the rows of its own block only, with its own weights (head 0, "
                       f"position 0: {first}). The result is a new, contiguous tensor."))
    steps.append(_step(".transpose(1, 2)  ->  (b, n, h, d_k)", "n h d", out.transpose(1, 2), out_heads.transpose(1, 2),
                       "Positions in front again, but memory still holds head 0's block, then head 1's: "
                       ".view(1, n, d_model) raises an error here."))
    merged, merged_owner = merge_fn(out), merge_fn(out_heads)
    steps.append(_step(f".contiguous().view(1, {n}, {h * d_k})", "n d", merged, merged_owner,
                       "contiguous() copies the entries into reading order; view then lays each position's heads "
                       "side by side: Concat(head_1, ..., head_h)."))
    w_o = torch.linspace(-1, 1, d_model * d_model, dtype=torch.float64).view(d_model, d_model)
    steps.append(_step("linears[3](...)  (W^O)", "n d", merged @ w_o, torch.full_like(merged, -1.0),
                       "W^O mixes every feature of every head into each output feature: the heads' "
                       "results are combined here, and only here."))
    return steps


def _cell_positions(step: TraceStep, n: int, h: int, d_k: int) -> list[tuple[float, float]]:
    """Where each entry (reading order) is drawn: ``(x, y)`` of its cell, y growing downwards."""
    gap = 0.5
    cells = []
    if step.layout == "n d":
        cells = [(c, r) for r in range(n) for c in range(h * d_k)]
    elif step.layout == "n h d":
        cells = [(i * (d_k + gap) + c, r) for r in range(n) for i in range(h) for c in range(d_k)]
    else:  # "h n d": one block per head, stacked
        cells = [(c, i * (n + gap) + r) for i in range(h) for r in range(n) for c in range(d_k)]
    return cells


def _fmt(v: float) -> str:
    return f"{v:.0f}" if float(v).is_integer() and abs(v) < 1000 else f"{v:.1f}"


def _trace_frame(step: TraceStep, index: int, total: int, n: int, h: int, d_k: int) -> bytes:
    fig = Figure(figsize=(8, 3.8))
    fig.text(0.02, 0.95, f"step {index + 1} of {total}:  {step.title}", fontsize=10, weight="bold", va="top")
    grid = fig.add_axes((0.02, 0.3, 0.5, 0.58))
    for (x, y), v, head in zip(_cell_positions(step, n, h, d_k), step.values, step.heads, strict=True):
        colour = HEAD_COLOURS[int(head) % len(HEAD_COLOURS)] if head >= 0 else _MIXED
        grid.add_patch(Rectangle((x, -y - 1), 1, 1, fc=colour, ec="white", lw=1.5))
        grid.text(x + 0.5, -y - 0.5, _fmt(v), ha="center", va="center", fontsize=7)
    tall = h * (n + 0.5)
    grid.set_xlim(-0.2, max(h * (d_k + 0.5), tall * 1.8))
    grid.set_ylim(-tall, 0.2)
    grid.set_aspect("equal", anchor="NW")
    grid.axis("off")
    info = fig.add_axes((0.56, 0.3, 0.42, 0.58))
    info.axis("off")
    info.text(0, 1, f"shape    {step.shape}\nstride   {step.stride}\ncontiguous: {step.contiguous}",
              va="top", fontsize=9, family="monospace", transform=info.transAxes)
    for i in range(h):
        info.add_patch(Rectangle((0, 0.45 - 0.14 * i), 0.05, 0.1, fc=HEAD_COLOURS[i], ec="none", transform=info.transAxes))
        info.text(0.08, 0.5 - 0.14 * i, f"head {i}", fontsize=8, va="center", transform=info.transAxes)
    info.add_patch(Rectangle((0, 0.45 - 0.14 * h), 0.05, 0.1, fc=_MIXED, ec="none", transform=info.transAxes))
    info.text(0.08, 0.5 - 0.14 * h, "every head mixed", fontsize=8, va="center", transform=info.transAxes)
    memory = fig.add_axes((0.02, 0.11, 0.96, 0.08))
    for k, (v, head) in enumerate(zip(step.memory_values, step.memory_heads, strict=True)):
        colour = HEAD_COLOURS[int(head) % len(HEAD_COLOURS)] if head >= 0 else _MIXED
        memory.add_patch(Rectangle((k, 0), 1, 1, fc=colour, ec="white", lw=1))
        memory.text(k + 0.5, 0.5, _fmt(v), ha="center", va="center", fontsize=6.5)
    memory.set_xlim(0, len(step.memory_values))
    memory.set_ylim(0, 1)
    memory.axis("off")
    order = "the reading order" if step.contiguous else "NOT the reading order, so view() would need a copy first"
    memory.set_title(f"memory, address by address: {order}", fontsize=8, loc="left")
    fig.text(0.02, 0.01, textwrap.fill(step.note, 125), fontsize=7.5)
    return figure_png(fig)


def shape_tracer(split_fn: Callable | None = None, merge_fn: Callable | None = None,
                 n: int = 3, d_model: int = 6, h: int = 2) -> FramePlayer:
    """A step slider: one projected tensor through view, transpose, attention, transpose, view and W^O.

    Args:
        split_fn: the student's ``split_heads(x, h)``; ``None`` draws with the reference.
        merge_fn: the student's ``merge_heads(x)``; ``None`` draws with the reference.
        n, d_model, h: the size of the traced tensor (``d_model`` divisible by ``h``, ``h <= 8``).
    """
    split = resolve(split_fn, reference_split, _probe_split, "split_heads")
    merge = resolve(merge_fn, reference_merge, _probe_merge, "merge_heads")
    steps = trace_steps(split.fn, merge.fn, n, d_model, h)
    control = widgets.SelectionSlider(options=[f"{i + 1}" for i in range(len(steps))], description="step",
                                      continuous_update=True)
    return FramePlayer(control, lambda i: _trace_frame(steps[i], i, len(steps), n, h, d_model // h), len(steps),
                       header=[split.banner(), merge.banner()])


# --------------------------------------------------------------------------- one head or two


#: The task: at every position, name the token one back and the token two back.
TASK_VOCAB, TASK_LEN = 8, 8
TASK_SLOTS = ("1 back", "2 back")


def two_position_batch(generator: torch.Generator, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences for the two-position task, each token a one-hot code next to a one-hot position.

    Returns:
        ``(x, tokens)``: x ``(batch, TASK_LEN, TASK_VOCAB + TASK_LEN)`` float, tokens ``(batch, TASK_LEN)``.
    """
    tokens = torch.randint(0, TASK_VOCAB, (batch, TASK_LEN), generator=generator)
    x = torch.cat([nn.functional.one_hot(tokens, TASK_VOCAB).float(), torch.eye(TASK_LEN).expand(batch, -1, -1)], -1)
    return x, tokens


def _task_logits(mha: nn.Module, readout: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Scores ``(batch, TASK_LEN - 2, 2, TASK_VOCAB)`` for the positions that have two tokens before them."""
    return readout(mha(x, x, x))[:, 2:].reshape(x.size(0), TASK_LEN - 2, 2, TASK_VOCAB)


def _task_targets(tokens: torch.Tensor) -> torch.Tensor:
    return torch.stack([tokens[:, 1:-1], tokens[:, :-2]], dim=-1)


@dataclass(frozen=True)
class TaskResult:
    """One trained model of the two-position task.

    Attributes:
        h: its number of heads (its width is the same whatever ``h``).
        losses: training loss per step.
        accuracy: ``(2,)``, held-out accuracy for the token 1 back and the token 2 back.
        tokens: ``(TASK_LEN,)``, one held-out sequence.
        weights: ``(h, TASK_LEN, TASK_LEN)``, every head's attention weights on it.
    """

    h: int
    losses: list[float]
    accuracy: torch.Tensor
    tokens: torch.Tensor
    weights: torch.Tensor


def train_two_position(mha_cls: Callable = MultiHeadedAttention, h: int = 1, steps: int = 150,
                       seed: int = 0, batch: int = 64) -> TaskResult:
    """Train ``mha_cls(h, d_model, dropout=0.0)`` and a linear read-out on the two-position task.

    One attention layer (no feed-forward network, no residual) reads the sequence; a linear
    layer turns each position's output into two predictions, the token one back and the token
    two back. Adam, learning rate 0.03, cross-entropy, ``steps`` batches; seeded.
    """
    torch.manual_seed(seed)
    d_model = TASK_VOCAB + TASK_LEN
    mha = mha_cls(h, d_model, dropout=0.0)
    readout = nn.Linear(d_model, 2 * TASK_VOCAB)
    optimizer = torch.optim.Adam([*mha.parameters(), *readout.parameters()], lr=0.03)
    data = torch.Generator().manual_seed(seed)
    losses = []
    with one_thread():
        for _ in range(steps):
            x, tokens = two_position_batch(data, batch)
            loss = nn.functional.cross_entropy(_task_logits(mha, readout, x).reshape(-1, TASK_VOCAB),
                                               _task_targets(tokens).reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    mha.eval()
    with torch.no_grad():
        x, tokens = two_position_batch(torch.Generator().manual_seed(10_000 + seed), 1000)
        hits = _task_logits(mha, readout, x).argmax(-1) == _task_targets(tokens)
        accuracy = hits.float().mean(dim=(0, 1))
        weights = mha.attn[0].clone()
    return TaskResult(h, losses, accuracy, tokens[0].clone(), weights)


def _task_frame(results: Sequence[TaskResult], i: int) -> bytes:
    shown = results[i]
    fig = Figure(figsize=(8.4, 2.9))
    widths = [1.25, *([1] * shown.h), 0.8]
    axes = fig.subplots(1, len(widths), gridspec_kw={"width_ratios": widths})
    curves = axes[0]
    for r in results:
        curves.plot(r.losses, lw=2.2 if r is shown else 1, alpha=1 if r is shown else 0.45,
                    label=f"{r.h} head{'s' if r.h > 1 else ''}")
    curves.set_xlabel("training step", fontsize=8)
    curves.set_ylabel("loss", fontsize=8)
    curves.legend(fontsize=7)
    curves.tick_params(labelsize=7)
    labels = [f"{i}: {t}" for i, t in enumerate(shown.tokens.tolist())]
    for k in range(shown.h):
        ax = axes[1 + k]
        ax.imshow(shown.weights[k].numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set_title(f"head {k} (d_k = {(TASK_VOCAB + TASK_LEN) // shown.h})", fontsize=8)
        ax.set_xticks(range(TASK_LEN), labels, fontsize=6)
        ax.set_yticks(range(TASK_LEN), labels, fontsize=6)
        ax.set_xlabel("key (position: token)", fontsize=7)
        if k == 0:
            ax.set_ylabel("query (position: token)", fontsize=7)
    bars = axes[-1]
    bars.bar(range(2), shown.accuracy.tolist(), color=["#2563eb", "#f97316"])
    bars.axhline(1 / TASK_VOCAB, color="#999", ls=":", lw=1)
    bars.set_xticks(range(2), TASK_SLOTS, fontsize=7)
    bars.set_ylim(0, 1.05)
    bars.set_title("held-out accuracy", fontsize=8)
    bars.tick_params(labelsize=7)
    for j, a in enumerate(shown.accuracy.tolist()):
        bars.text(j, a + 0.02, f"{a:.0%}", ha="center", fontsize=7)
    fig.tight_layout()
    return figure_png(fig)


def _probe_mha(cls: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """A small masked cross-attention call every correct ``MultiHeadedAttention`` answers alike."""
    mha = fixed_weights(cls(2, 8, dropout=0.0), 7)
    g = torch.Generator().manual_seed(7)
    q, kv = torch.randn(2, 3, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    keep = torch.tensor([[True] * 5, [True, True, False, False, False]])[:, None, :]
    with torch.no_grad():
        out = mha(q, kv, kv, mask=keep)
    return out, mha.attn


def head_count_demo(mha_cls: Callable | None = None, heads: Sequence[int] = (1, 2), steps: int = 150) -> FramePlayer:
    """Train the two-position task with 1 and with 2 heads of the same total width; switch between them.

    The returned player also carries ``results``, one ``TaskResult`` per entry of ``heads``.

    Args:
        mha_cls: the student's ``MultiHeadedAttention``; ``None`` trains the reference.
        heads: the head counts compared.
        steps: training steps of each model.
    """
    used = resolve(mha_cls, MultiHeadedAttention, _probe_mha, "MultiHeadedAttention")
    results = [train_two_position(used.fn, h, steps) for h in heads]
    control = widgets.ToggleButtons(options=[f"{h} head{'s' if h > 1 else ''}" for h in heads],
                                    description="model:", style={"button_width": "auto"})
    player = FramePlayer(control, lambda i: _task_frame(results, i), len(results), header=[used.banner()])
    player.results = results
    return player


# --------------------------------------------------------------------------- the course model's heads

#: The three attention layers of a Transformer, in the order the widget offers them.
ATTENTION_KINDS = ("encoder self-attention", "decoder self-attention", "cross-attention")

#: The patterns measured in each kind of map (see ``head_scores``).
PATTERNS = {
    "encoder self-attention": ("same token", "previous token", "next token", "</s>"),
    "decoder self-attention": ("same token", "previous token", "<s>"),
    "cross-attention": ("</s>", "source order"),
}


@dataclass(frozen=True)
class SentenceAttention:
    """Every attention map of the model on one sentence and its own greedy translation.

    Attributes:
        source: the German sentence.
        translation: the model's greedy translation.
        src_tokens: the source subwords, ending with ``</s>`` (columns of encoder and cross maps).
        tgt_tokens: the decoder input, ``<s>`` and the translation's subwords (rows and columns
            of the decoder self-attention maps).
        produced: the token each decoder position produces, the translation's subwords and
            ``</s>`` (rows of the cross-attention maps).
        maps: one ``(N, h, rows, cols)`` tensor per entry of ``ATTENTION_KINDS``.
    """

    source: str
    translation: str
    src_tokens: list[str]
    tgt_tokens: list[str]
    produced: list[str]
    maps: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def sentence_attention(model: nn.Module, tok, sentence: str, max_len: int = 40) -> SentenceAttention:
    """Translate ``sentence`` greedily, then run the model once on it and its translation.

    The maps are the ``attn`` each ``MultiHeadedAttention`` keeps after that one teacher-forced
    pass (eval mode, so the weights are the softmax's, before any dropout). Requires the explicit
    ("matmul") attention kernel, the one that keeps its weights.
    """
    from ..data import BOS, EOS, PAD
    from ..decoding import greedy_decode

    src = torch.tensor([tok.encode_src(sentence)])
    src_mask = (src != PAD).unsqueeze(-2)
    with torch.no_grad():
        out = greedy_decode(model, src, src_mask, max_len, BOS, EOS, pad=PAD, use_cache=False)[0].tolist()
        ids = out[: out.index(EOS)] if EOS in out else out
        tgt = torch.tensor([ids])
        memory = model.encode(src, src_mask)
        model.decode(memory, src_mask, tgt, subsequent_mask(tgt.size(1)))
    maps = (
        torch.stack([layer.self_attn.attn[0] for layer in model.encoder.layers]),
        torch.stack([layer.self_attn.attn[0] for layer in model.decoder.layers]),
        torch.stack([layer.src_attn.attn[0] for layer in model.decoder.layers]),
    )
    name = tok.tgt.id_to_token
    return SentenceAttention(
        source=sentence,
        translation=tok.decode_tgt(ids[1:]),
        src_tokens=[tok.src.id_to_token(i) for i in src[0].tolist()],
        tgt_tokens=[name(i) for i in ids],
        produced=[name(i) for i in ids[1:]] + [name(EOS)],
        maps=maps,
    )


def _pattern_weights(kind: str, p: torch.Tensor) -> dict[str, torch.Tensor]:
    """The weight each head puts on each pattern, averaged over query rows: ``{pattern: (N, h)}``.

    ``p`` is ``(N, h, rows, cols)``. Rows that cannot show a pattern (the first row has no
    previous token) are left out of its average.
    """
    rows, cols = p.shape[-2:]
    diagonal = p.diagonal(dim1=-2, dim2=-1)
    if kind == "cross-attention":
        source_part = p[..., :-1]
        centre = (source_part * torch.arange(cols - 1, dtype=p.dtype)).sum(-1) / source_part.sum(-1).clamp_min(1e-9)
        coverage = ((centre.amax(-1) - centre.amin(-1)) / max(cols - 2, 1)).clamp(max=1.0)
        return {"</s>": p[..., -1].mean(-1), "source order": _row_correlation(centre) * coverage}
    scores = {
        "same token": diagonal.mean(-1),
        "previous token": p.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1) if rows > 1 else torch.zeros(p.shape[:2]),
    }
    if kind == "encoder self-attention":
        scores["next token"] = p.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1) if rows > 1 else torch.zeros(p.shape[:2])
        scores["</s>"] = p[..., :-1, -1].mean(-1) if rows > 1 else p[..., -1].mean(-1)
    else:
        scores["<s>"] = p[..., 1:, 0].mean(-1) if rows > 1 else p[..., 0].mean(-1)
    return scores


def _row_correlation(centre: torch.Tensor) -> torch.Tensor:
    """Pearson correlation between the row index and ``centre`` (``(N, h, rows)``), per head; 0 if undefined."""
    rows = centre.size(-1)
    if rows < 3:
        return torch.zeros(centre.shape[:2])
    index = torch.arange(rows, dtype=centre.dtype) - (rows - 1) / 2
    c = centre - centre.mean(-1, keepdim=True)
    denom = (c.pow(2).sum(-1) * index.pow(2).sum()).sqrt()
    return torch.where(denom > 1e-9, (c * index).sum(-1) / denom.clamp_min(1e-12), torch.zeros_like(denom))


def head_scores(sentences: Sequence[SentenceAttention]) -> dict[str, dict[str, torch.Tensor]]:
    """For each kind of attention, each pattern's weight per head, averaged over ``sentences``.

    Patterns (``PATTERNS``): *same token* = weight on the query's own position; *previous* /
    *next token* = on the position just before / after it; ``</s>`` = on the source's end
    token (rows other than the last, in the encoder); ``<s>`` = on the start token (rows other
    than the first); *source order* (cross-attention) = the correlation between a target row's
    position and the centre of its weights over the source words (``</s>`` left out), times the
    fraction of the source those centres span: 1 when the rows walk through the whole source
    from left to right, 0 for a head that looks at the same place from every row.

    Returns:
        ``{kind: {pattern: (N, h) tensor}}``.
    """
    result = {}
    for k, kind in enumerate(ATTENTION_KINDS):
        per_sentence = [_pattern_weights(kind, s.maps[k].double()) for s in sentences]
        result[kind] = {name: torch.stack([d[name] for d in per_sentence]).mean(0) for name in PATTERNS[kind]}
    return result


#: A head is given a pattern's name when that pattern's score reaches this value.
PATTERN_THRESHOLD = {"source order": 0.6}
DEFAULT_THRESHOLD = 0.4


def head_labels(scores: dict[str, dict[str, torch.Tensor]]) -> dict[str, list[list[str]]]:
    """One word per head: the pattern with the largest score if it passes its threshold, else "broad".

    Cross-attention names a head "</s>" (the sink) first, then "source order" (alignment).
    """
    labels = {}
    for kind, patterns in scores.items():
        n_layers, n_heads = next(iter(patterns.values())).shape
        grid = []
        for layer in range(n_layers):
            row = []
            for head in range(n_heads):
                passing = [(float(v[layer, head]), name) for name, v in patterns.items()
                           if float(v[layer, head]) >= PATTERN_THRESHOLD.get(name, DEFAULT_THRESHOLD)]
                row.append(max(passing)[1] if passing else "broad")
            grid.append(row)
        labels[kind] = grid
    return labels


def _maps_frame(s: SentenceAttention, k: int, labels: list[list[str]]) -> bytes:
    """Every head's map of one kind on one sentence, as one mosaic: layers down, heads across."""
    kind = ATTENTION_KINDS[k]
    maps = s.maps[k].float()
    n_layers, n_heads, n_rows, n_cols = maps.shape
    rows = s.produced if kind == "cross-attention" else (s.src_tokens if k == 0 else s.tgt_tokens)
    cols = s.tgt_tokens if kind == "decoder self-attention" else s.src_tokens
    gap = 2
    mosaic = torch.full((n_layers * (n_rows + gap) - gap, n_heads * (n_cols + gap) - gap), float("nan"))
    for layer in range(n_layers):
        for head in range(n_heads):
            top, left = layer * (n_rows + gap), head * (n_cols + gap)
            mosaic[top:top + n_rows, left:left + n_cols] = maps[layer, head]
    cell = min(0.16, 6.8 / mosaic.size(1))  # inches per map cell: the figure fits a page, about 640 pixels
    fig = Figure(figsize=(mosaic.size(1) * cell + 1.2, mosaic.size(0) * cell + 1.6))
    ax = fig.add_axes((1.0 / fig.get_figwidth(), 1.0 / fig.get_figheight(),
                       mosaic.size(1) * cell / fig.get_figwidth(), mosaic.size(0) * cell / fig.get_figheight()))
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="white")
    ax.imshow(mosaic.numpy(), cmap=cmap, vmin=0, vmax=1, interpolation="nearest", aspect="equal")
    ax.set_yticks([layer * (n_rows + gap) + r for layer in range(n_layers) for r in range(n_rows)],
                  rows * n_layers, fontsize=7)
    ax.set_xticks([head * (n_cols + gap) + c for head in range(n_heads) for c in range(n_cols)],
                  cols * n_heads, fontsize=7, rotation=90)
    ax.tick_params(length=0, pad=1)
    for spine in ax.spines.values():
        spine.set_visible(False)
    for layer in range(n_layers):
        for head in range(n_heads):
            ax.text(head * (n_cols + gap) - 0.5, layer * (n_rows + gap) - 0.7,
                    f"L{layer + 1} H{head}: {labels[layer][head]}", fontsize=7, va="bottom")
    what = {"encoder self-attention": "rows: source token (query); columns: source token (key)",
            "decoder self-attention": "rows and columns: decoder input (<s> + translation); causal",
            "cross-attention": "rows: the target token being produced; columns: source token"}[kind]
    fig.text(0.01, 1 - 0.12 / fig.get_figheight(),
             f"{kind}, every layer (L) and head (H).  {what}\nthe model's translation: {s.translation}",
             fontsize=8, va="top")
    return figure_png(fig, dpi=80)


def _swap_attention(model: nn.Module, mha_cls: Callable) -> nn.Module:
    """A copy of ``model`` whose attention layers are ``mha_cls`` modules holding the same weights."""
    swapped = copy.deepcopy(model)
    for name, module in list(swapped.named_modules()):
        if isinstance(module, MultiHeadedAttention):
            replacement = mha_cls(module.h, module.h * module.d_k, dropout=0.0)
            replacement.load_state_dict(module.state_dict())
            replacement.eval()
            parent_name, _, attr = name.rpartition(".")
            setattr(swapped.get_submodule(parent_name), attr, replacement)
    return swapped


def course_model_attention(sentences: Sequence[str], mha_cls: Callable | None = None, model: nn.Module | None = None,
                           tok=None) -> tuple[Resolved, list[SentenceAttention]]:
    """The maps of the course model (or ``model``/``tok``) on ``sentences``, computed by ``mha_cls``."""
    if model is None or tok is None:
        from ..course_model import load_course_model

        model, tok = load_course_model()
    used = resolve(mha_cls, MultiHeadedAttention, _probe_mha, "MultiHeadedAttention")
    model = copy.deepcopy(model).eval()
    for module in model.modules():
        if isinstance(module, MultiHeadedAttention):
            module.kernel = "matmul"  # the path that keeps its weights
    if used.fn is not MultiHeadedAttention:
        model = _swap_attention(model, used.fn)
    with one_thread():
        return used, [sentence_attention(model, tok, s) for s in sentences]


def course_model_heads(sentences: Sequence[str], mha_cls: Callable | None = None, model: nn.Module | None = None,
                       tok=None) -> FrameGrid:
    """Every head of the course model on real sentences: a sentence menu and the three kinds of attention.

    Each small map is one head of one layer; its title names the pattern ``head_labels`` found
    for that head over all the given sentences (or "broad" when none dominates).

    The returned grid also carries what it drew: ``computed`` (one ``SentenceAttention`` per
    sentence), ``scores`` (``head_scores``) and ``labels`` (``head_labels``).

    Args:
        sentences: German source sentences.
        mha_cls: the student's ``MultiHeadedAttention``: the model's attention layers are
            rebuilt from it with the trained weights. ``None`` draws with the reference.
        model, tok: another model and tokenizer pair (default: ``load_course_model()``).
    """
    used, computed = course_model_attention(sentences, mha_cls, model, tok)
    scores = head_scores(computed)
    labels = head_labels(scores)
    # The source alone: with its translation a menu entry would be cut at the menu's width.
    sentence = widgets.Dropdown(options=[s.source for s in computed], description="sentence",
                                layout={"width": "95%"})
    kind = widgets.ToggleButtons(options=list(ATTENTION_KINDS), style={"button_width": "auto"})
    grid = FrameGrid(sentence, kind, (len(computed), len(ATTENTION_KINDS)),
                     lambda i, k: _maps_frame(computed[i], k, labels[ATTENTION_KINDS[k]]), header=[used.banner()])
    grid.computed, grid.scores, grid.labels = computed, scores, labels
    return grid
