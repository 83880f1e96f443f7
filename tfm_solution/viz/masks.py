"""Chapter 4's widgets: a batch builder, a look at the future without the causal mask, and fill values.

Each widget takes the student's answer (``Batch``, ``subsequent_mask`` or ``masked_softmax``),
draws with it when it works and with the reference otherwise, and renders every frame in
advance as a small HTML table, so that it also responds on the static website.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import ipywidgets as widgets
import torch

from ..attention import attention
from ..data import PAD, SPECIALS
from ..masks import Batch as ReferenceBatch
from ..masks import masked_softmax as reference_masked_softmax
from ..masks import subsequent_mask as reference_subsequent_mask
from .frames import Frame, FramePlayer, as_widget, control_index_trait
from .language import localize
from .student import resolve

_ALLOWED, _HIDDEN, _PAD = "#bbf7d0", "#e5e7eb", "#fde68a"
_CELL = "width:22px;height:22px;text-align:center;border:1px solid #fff;font-size:11px"


class FrameGrid(widgets.VBox):
    """Two controls above a grid of precomputed frames: frame ``(i, j)`` for positions ``i``, ``j``.

    The first control picks a row of frames (an outer ``Stack``); the second is linked to the
    inner ``Stack`` of every row. Both links are ``jslink``, so the grid responds on a static
    page as in a running kernel.

    Args:
        first, second: selection widgets or ``IntSlider``s over ``0 .. n-1`` (see ``FramePlayer``).
        shape: ``(n_first, n_second)``, the number of positions of each control.
        render: maps ``(i, j)`` to a frame (PNG bytes, HTML or a widget).
        header: widgets shown above the controls.
    """

    def __init__(
        self,
        first: widgets.Widget,
        second: widgets.Widget,
        shape: tuple[int, int],
        render: Callable[[int, int], Frame],
        *,
        header: Sequence[widgets.Widget] = (),
    ) -> None:
        first_trait, second_trait = control_index_trait(first), control_index_trait(second)
        rows = []
        self.links = []
        for i in range(shape[0]):
            row = widgets.Stack(children=[as_widget(render(i, j)) for j in range(shape[1])],
                                selected_index=getattr(second, second_trait))
            self.links.append(widgets.jslink((second, second_trait), (row, "selected_index")))
            rows.append(row)
        self.first, self.second = first, second
        self.stack = widgets.Stack(children=rows, selected_index=getattr(first, first_trait))
        self.links.append(widgets.jslink((first, first_trait), (self.stack, "selected_index")))
        super().__init__(children=[*header, first, second, self.stack])
        localize(self)  # the labels in the notebook's language (language.py)


def _grid_html(mask: torch.Tensor, rows: Sequence[str], cols: Sequence[str], title: str) -> str:
    """A boolean ``(len(rows), len(cols))`` mask as a table: green = may attend, grey = hidden."""
    head = "".join(f'<th style="font-size:10px;font-weight:normal">{html.escape(c)}</th>' for c in cols)
    body = "".join(
        f'<tr><th style="font-size:10px;font-weight:normal;text-align:right">{html.escape(r)}</th>'
        + "".join(
            f'<td style="{_CELL};background:{_ALLOWED if bool(mask[i, j]) else _HIDDEN}">'
            f"{1 if bool(mask[i, j]) else 0}</td>"
            for j in range(len(cols))
        )
        + "</tr>"
        for i, r in enumerate(rows)
    )
    return (
        f'<div style="display:inline-block;vertical-align:top;margin:0 14px 8px 0">'
        f'<div style="font-size:12px;margin-bottom:2px">{title}</div>'
        f'<table style="border-collapse:collapse"><tr><th></th>{head}</tr>{body}</table></div>'
    )


# --------------------------------------------------------------------------- the batch builder

#: Toy translation pairs: source words and their target words, one per position.
PAIRS = (
    (("我", "爱", "吃", "红", "苹果"), ("I", "love", "eating", "red", "apples")),
    (("猫", "坐", "在", "垫子", "上"), ("the", "cat", "sat", "on", "mats")),
)
#: The special tokens come first, numbered as in the course's data (and the notes): <blank> = 2 pads.
PAD_ID = PAD


def _vocab() -> list[str]:
    words = [w for src, tgt in PAIRS for w in (*src, *tgt)]
    return [*SPECIALS, *dict.fromkeys(words)]


def toy_batch(lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Source and target ids of the toy pairs cut to ``lengths`` words, padded with ``PAD_ID``.

    Returns:
        ``(src, tgt, vocab)``: src ``(2, max_len)``, tgt ``(2, max_len + 2)`` (``<s>`` and
        ``</s>`` around the words), and the id -> word list.
    """
    vocab = _vocab()
    index = {w: i for i, w in enumerate(vocab)}
    width = max(lengths)
    src = torch.full((len(PAIRS), width), PAD_ID)
    tgt = torch.full((len(PAIRS), width + 2), PAD_ID)
    for row, ((src_words, tgt_words), n) in enumerate(zip(PAIRS, lengths, strict=True)):
        src[row, :n] = torch.tensor([index[w] for w in src_words[:n]])
        ids = [index["<s>"], *(index[w] for w in tgt_words[:n]), index["</s>"]]
        tgt[row, : len(ids)] = torch.tensor(ids)
    return src, tgt, vocab


def _batch_attributes(cls: Callable) -> tuple[torch.Tensor, ...]:
    src, tgt, _ = toy_batch((3, 1))
    b = cls(src, tgt, pad=PAD_ID)
    return b.src_mask, b.tgt, b.tgt_y, b.tgt_mask, b.ntokens


def _ids_row(ids: torch.Tensor, vocab: list[str], label: str) -> str:
    cells = "".join(
        f'<td style="padding:1px 6px;border:1px solid #ddd;background:{_PAD if int(i) == PAD_ID else "#fff"}">'
        f"{html.escape(vocab[int(i)])}</td>"
        for i in ids
    )
    return f'<tr><th style="text-align:right;font-weight:normal;padding-right:6px">{label}</th>{cells}</tr>'


def _batch_frame(batch, vocab: list[str]) -> str:
    parts = ['<div style="font-family:sans-serif;font-size:13px;line-height:1.3">']
    for row in range(batch.src.size(0)):
        tgt_tokens = [vocab[int(i)] for i in batch.tgt[row]]
        n = len(tgt_tokens)
        padding = batch.tgt[row] != PAD_ID
        parts.append(
            f'<p style="margin:8px 0 4px 0"><b>Sentence {row + 1}</b></p>'
            '<table style="display:inline-block;vertical-align:top;border-collapse:collapse;margin:0 24px 8px 0">'
            + _ids_row(batch.src[row], vocab, "src")
            + _ids_row(batch.tgt[row], vocab, "tgt (decoder input)")
            + _ids_row(batch.tgt_y[row], vocab, "tgt_y (labels)")
            + "</table>"
        )
        src_tokens = [vocab[int(i)] for i in batch.src[row]]
        parts.append(_grid_html(batch.src_mask[row].expand(1, -1), ["any query"], src_tokens,
                                "src_mask (keys of the source)"))
        parts.append("<br>")
        parts.append(_grid_html(padding.expand(n, n), tgt_tokens, tgt_tokens, "padding mask of tgt"))
        parts.append(_grid_html(reference_subsequent_mask(n)[0], tgt_tokens, tgt_tokens, "causal mask"))
        parts.append(_grid_html(batch.tgt_mask[row], tgt_tokens, tgt_tokens, "tgt_mask = padding &amp; causal"))
    parts.append(
        f"<p>ntokens = {int(batch.ntokens)}: the labels that are not <code>&lt;blank&gt;</code> (padding), "
        "the number the loss is divided by.</p></div>"
    )
    return "".join(parts)


def batch_builder(batch_cls: Callable | None = None, max_words: int = 5) -> FrameGrid:
    """Two sentence-length sliders: the padded batch, its padding, causal and combined masks.

    Args:
        batch_cls: the student's ``Batch(src, tgt=None, pad=2)``; ``None`` draws with the reference.
        max_words: the longest sentence the sliders allow (at most 5 words in the toy pairs).
    """
    used = resolve(batch_cls, ReferenceBatch, _batch_attributes, "Batch")
    first = widgets.SelectionSlider(options=[f"{n} word{'s' if n > 1 else ''}" for n in range(1, max_words + 1)],
                                    index=min(2, max_words - 1), description="sentence 1")
    second = widgets.SelectionSlider(options=[f"{n} word{'s' if n > 1 else ''}" for n in range(1, max_words + 1)],
                                     index=0, description="sentence 2")

    def render(i: int, j: int) -> str:
        src, tgt, vocab = toy_batch((i + 1, j + 1))
        return _batch_frame(used.fn(src, tgt, pad=PAD_ID), vocab)

    caption = widgets.HTML("<i>Slide the number of words of each sentence; the shorter one is padded.</i>")
    return FrameGrid(first, second, (max_words, max_words), render, header=[used.banner(), caption])


# --------------------------------------------------------------------------- peeking at the future

#: The notes' inference example: the model has produced [<开始>, 我, 爱] and will produce 你.
PEEK_TOKENS = ("<开始>", "我", "爱", "你")
PEEK_VOCAB = ("<开始>", "我", "爱", "你", "他", "们", "。", "吃")
#: Two layers: with one, the newest position sees every token with or without the mask, so its
#: output cannot change; the second layer reads the earlier positions' vectors, which can.
PEEK_LAYERS = 2
#: Weights under which peeking flips the newest token's prediction for <开始> 我 爱 (and 你).
PEEK_SEED = 43


def peek_model(seed: int = PEEK_SEED, d: int = 8, n_layers: int = PEEK_LAYERS) -> dict[str, torch.Tensor]:
    """The weights of a tiny, untrained decoder of ``n_layers`` self-attention layers.

    Returns:
        ``embed`` ``(len(PEEK_VOCAB), d)``, ``position`` ``(len(PEEK_TOKENS), d)``, ``wq``/``wk``/``wv``
        ``(n_layers, d, d)`` and the read-out ``out`` ``(d, len(PEEK_VOCAB))``, all float64.
    """
    g = torch.Generator().manual_seed(seed)
    return {
        "embed": torch.randn(len(PEEK_VOCAB), d, generator=g, dtype=torch.float64),
        "position": 0.5 * torch.randn(len(PEEK_TOKENS), d, generator=g, dtype=torch.float64),
        **{name: torch.randn(n_layers, d, d, generator=g, dtype=torch.float64) / d**0.5 for name in ("wq", "wk", "wv")},
        "out": torch.randn(d, len(PEEK_VOCAB), generator=g, dtype=torch.float64),
    }


def peek_forward(
    n: int, mask: torch.Tensor | None, weights: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the tiny decoder on the first ``n`` tokens of ``PEEK_TOKENS``; each layer is ``x + attention(x)``.

    Returns:
        ``(p_attn, logits)``: the last layer's weights ``(n, n)`` and next-token scores ``(n, len(PEEK_VOCAB))``.
    """
    ids = torch.tensor([PEEK_VOCAB.index(t) for t in PEEK_TOKENS[:n]])
    x = weights["embed"][ids] + weights["position"][:n]
    for wq, wk, wv in zip(weights["wq"], weights["wk"], weights["wv"], strict=True):
        out, p_attn = attention(x @ wq, x @ wk, x @ wv, mask=mask)
        x = x + out
    return p_attn, x @ weights["out"]


def _peek_frame(n: int, masked: bool, p_attn: torch.Tensor, logits: torch.Tensor, trained: list[int]) -> str:
    tokens = PEEK_TOKENS[:n]
    head = "".join(f"<th style='font-weight:normal;padding:0 4px'>{html.escape(t)}</th>" for t in tokens)
    rows = []
    for i, t in enumerate(tokens):
        cells = "".join(
            f'<td style="{_CELL};width:38px;background:rgba(37,99,235,{float(p_attn[i, j]):.2f});'
            f'color:{"#fff" if float(p_attn[i, j]) > 0.6 else "#000"}">{float(p_attn[i, j]):.2f}</td>'
            for j in range(n)
        )
        now = int(logits[i].argmax())
        changed = now != trained[i]
        verdict = (f'<span style="color:#b91c1c"><b>{html.escape(PEEK_VOCAB[now])}</b> (with the mask: '
                   f'{html.escape(PEEK_VOCAB[trained[i]])})</span>' if changed
                   else f"{html.escape(PEEK_VOCAB[now])} (unchanged)")
        rows.append(f"<tr><th style='font-weight:normal;text-align:right;padding-right:4px'>{html.escape(t)}</th>"
                    f"{cells}<td style='padding-left:12px'>{verdict}</td></tr>")
    state = "with the causal mask" if masked else "<b>without</b> a mask: earlier tokens see later ones"
    return (
        '<div style="font-family:sans-serif;font-size:13px;line-height:1.35">'
        f"<p>Input: {' '.join(html.escape(t) for t in tokens)} ({n} token{'s' if n > 1 else ''}), {state}. "
        f"Weights of layer {PEEK_LAYERS} of {PEEK_LAYERS}.</p>"
        '<table style="border-collapse:collapse"><tr><th></th>'
        f"{head}<th style='text-align:left;padding-left:12px'>predicted next token</th></tr>{''.join(rows)}</table>"
        "</div>"
    )


def _peek_probe(fn: Callable) -> torch.Tensor:
    return fn(5)


def peek_demo(subsequent_mask_fn: Callable | None = None, seed: int = PEEK_SEED) -> FrameGrid:
    """Feed the prefix one token at a time, with and without the causal mask; compare the predictions.

    With the mask, position ``i`` computes the same output whatever comes after it, so its
    prediction never changes as the prefix grows. Without it, earlier positions see later
    tokens and their vectors change; in the second layer even the newest position reads those
    changed vectors, so the prediction that generation uses changes too. Red marks every
    prediction that differs from the masked run's.

    Args:
        subsequent_mask_fn: the student's ``subsequent_mask(size)``; ``None`` draws with the reference.
        seed: seed of the tiny model's weights.
    """
    used = resolve(subsequent_mask_fn, reference_subsequent_mask, _peek_probe, "subsequent_mask")
    weights = peek_model(seed)
    n_max = len(PEEK_TOKENS)
    # What the model computes with the mask, as in training: position i's prediction is the same
    # for every prefix that contains it, so one run on the whole sequence gives all of them.
    trained = peek_forward(n_max, reference_subsequent_mask(n_max)[0], weights)[1].argmax(-1).tolist()

    def render(n: int, unmasked: int) -> str:
        mask = None if unmasked else used.fn(n + 1)[0]
        p_attn, logits = peek_forward(n + 1, mask, weights)
        return _peek_frame(n + 1, not unmasked, p_attn, logits, trained)

    tokens = widgets.SelectionSlider(options=[" ".join(PEEK_TOKENS[: i + 1]) for i in range(n_max)],
                                     index=n_max - 2, description="fed so far", style={"description_width": "initial"},
                                     layout={"width": "420px"})
    mask = widgets.ToggleButtons(options=["causal mask (as in training)", "no mask (peeking)"],
                                 style={"button_width": "auto"})
    return FrameGrid(tokens, mask, (n_max, 2), render, header=[used.banner()])


# --------------------------------------------------------------------------- fill values

#: The scores of the fill-value table: row 0 hides its last two keys, row 1 hides all four.
FILL_SCORES = ((2.0, 1.0, 0.5, -1.0), (1.0, -0.5, 3.0, 0.0))
FILL_MASK = ((True, True, False, False), (False, False, False, False))
FILL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _fill_neg_inf(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def _fill_minus_1e9(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return scores.masked_fill(~mask, -1e9).softmax(-1)


def _add_minus_1e9(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (scores + (~mask) * -1e9).softmax(-1)


FILL_METHODS: tuple[tuple[str, Callable], ...] = (
    ("masked_fill(mask == 0, -inf)", _fill_neg_inf),
    ("masked_fill(mask == 0, -1e9)  (the notes)", _fill_minus_1e9),
    ("scores + (mask == 0) * -1e9  (adding)", _add_minus_1e9),
)


def fill_outcome(method: Callable, dtype: torch.dtype) -> str:
    """What one way of masking gives on ``FILL_SCORES`` in ``dtype``, in words and numbers."""
    scores = torch.tensor(FILL_SCORES, dtype=dtype)
    try:
        p = method(scores, torch.tensor(FILL_MASK))
    except RuntimeError as error:
        return f"error: {str(error).splitlines()[0]}"
    rows = ["[" + ", ".join("NaN" if v != v else f"{v:.3f}" for v in r) + "]" for r in p.float().tolist()]
    note = " (dtype became " + str(p.dtype).removeprefix("torch.") + ")" if p.dtype != dtype else ""
    return "<br>".join(rows) + note


def _fill_frame(dtype: torch.dtype, outcomes: list[tuple[str, str]]) -> str:
    info = torch.finfo(dtype)
    rows = []
    for name, out in outcomes:
        colour = "#b91c1c" if any(word in out for word in ("NaN", "error", "became")) else "#111"
        rows.append(f'<tr><td style="padding:3px 10px 3px 0;vertical-align:top">'
                    f"<code>{html.escape(name)}</code></td>"
                    f'<td style="padding:3px 0;font-family:monospace;color:{colour}">{out}</td></tr>')
    return (
        '<div style="font-family:sans-serif;font-size:13px;line-height:1.35">'
        f"<p>{str(dtype).removeprefix('torch.')}: finite range ±{info.max:.4g}. Row 1 hides its last two "
        "keys; row 2 hides every key.</p>"
        f'<table style="border-collapse:collapse">{"".join(rows)}</table></div>'
    )


def fill_value_explorer(masked_softmax_fn: Callable | None = None) -> widgets.VBox:
    """A dtype switch: how -inf, -1e9, adding, and your ``masked_softmax`` treat hidden scores.

    Args:
        masked_softmax_fn: the student's ``masked_softmax(scores, mask=None)``; ``None`` draws
            with the reference.
    """
    used = resolve(masked_softmax_fn, reference_masked_softmax,
                   lambda fn: fn(torch.tensor(FILL_SCORES), torch.tensor(FILL_MASK)), "masked_softmax")
    mine = "your masked_softmax" if used.yours else "masked_softmax  (the reference)"
    methods = [*FILL_METHODS, (mine, used.fn)]
    frames = [_fill_frame(dt, [(name, fill_outcome(fn, dt)) for name, fn in methods]) for dt in FILL_DTYPES]
    control = widgets.ToggleButtons(options=[str(dt).removeprefix("torch.") for dt in FILL_DTYPES],
                                    description="dtype:", style={"button_width": "auto"})
    return FramePlayer(control, frames.__getitem__, len(frames), header=[used.banner()])
