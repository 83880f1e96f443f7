"""Chapter 8's widgets: the notes' cross-attention example built by hand, a data-flow tracer through
the course model, and the course model's cross-attention alignments on real sentence pairs.

The two course-model widgets run the course model's weights inside a model built by the student's
``make_model`` (when it builds the right structure; the reference's otherwise, and they say which),
so a wrong stack shows up as wrong pictures. Every frame is rendered in advance, so the widgets
also respond on the static website.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image
from torch import nn

from ..attention import attention as reference_attention
from ..capstone import load_weights
from ..course_model import COURSE_MODEL_DIR, course_model_config, course_weights, load_course_model, load_training_log
from ..data import TokenizerPair
from ..data import BOS, EOS
from ..encoder_decoder import EncoderDecoder
from ..encoder_decoder import make_model as reference_make_model
from ..masks import subsequent_mask
from .diagram import _BLOCKS as BLOCKS
from .diagram import architecture_diagram
from .frames import FramePlayer, figure_png
from .masks import FrameGrid
from .student import Resolved, fixed_weights, resolve

# --------------------------------------------------------------------------- the notes' example, by hand

#: Notes 001: the encoder has read 我 吃 苹果, the decoder has written "I eat" and looks for the next word.
SOURCE_WORDS = ("我", "吃", "苹果")
SOURCE_GLOSSES = ("I", "eat", "apple")
#: The notes' alignment for the third target word: 3% on 我, 2% on 吃, 95% on 苹果.
NOTES_WEIGHTS = (0.03, 0.02, 0.95)
#: The decoder's three steps: what it has written, the word it must produce, and the weights it should
#: give the three source words. Only the last row is the notes'; the first two are made up the same way.
HAND_STEPS = (
    ("<s>", "I", (0.90, 0.06, 0.04)),
    ("<s> I", "eat", (0.05, 0.92, 0.03)),
    ("<s> I eat", "apple", NOTES_WEIGHTS),
)


def hand_cross_attention(weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """A query, keys and values whose scaled dot-product attention gives exactly ``weights``.

    The keys are one-hot per source word (``d_k = 3``), so ``q . k_j = q_j``; choosing
    ``q_j = sqrt(d_k) * log(p_j)`` makes ``softmax(q K^T / sqrt(d_k)) = p`` (softmax ignores the
    constant that a sum of ``p`` different from 1 would add). The values are one-hot too, one
    meaning per source word (pronoun, action, fruit), so the output reads as "how much of each
    word's content the decoder pulls back".

    Returns:
        ``query (1, 3)``, ``keys (3, 3)`` (the encoder memory's keys), ``values (3, 3)``, float64.
    """
    d_k = len(SOURCE_WORDS)
    p = torch.tensor(weights, dtype=torch.float64)
    return {
        "query": (d_k**0.5 * p.log()).unsqueeze(0),
        "keys": torch.eye(d_k, dtype=torch.float64),
        "values": torch.eye(d_k, dtype=torch.float64),
    }


def _hand_frame(step: int, attention_fn: Callable) -> str:
    written, target, weights = HAND_STEPS[step]
    t = hand_cross_attention(weights)
    out, p_attn = attention_fn(t["query"], t["keys"], t["values"])
    scores = t["query"] @ t["keys"].T / len(SOURCE_WORDS) ** 0.5
    rows = "".join(
        f"<tr><td style='padding:2px 10px'>{w} <span style='color:#666'>({g})</span></td>"
        f"<td style='padding:2px 10px;text-align:right'>{float(scores[0, j]):+.2f}</td>"
        f"<td style='padding:2px 10px;white-space:nowrap'><div style='display:inline-block;"
        f"width:{round(160 * float(p_attn[0, j]))}px;"
        f"height:11px;background:#7c3aed'></div> {100 * float(p_attn[0, j]):.0f}%</td>"
        f"<td style='padding:2px 10px'>{float(out[0, j]):.2f}</td></tr>"
        for j, (w, g) in enumerate(zip(SOURCE_WORDS, SOURCE_GLOSSES, strict=True))
    )
    return (
        '<div style="font-family:sans-serif;font-size:13px;line-height:1.4">'
        f"<p>The decoder has written <code>{html.escape(written)}</code> and must now produce "
        f"<b>{html.escape(target)}</b>. Its query Q comes from the decoder; the keys K and values V from "
        "the encoder's memory of 我 吃 苹果.</p>"
        "<table style='border-collapse:collapse'><tr style='border-bottom:1px solid #999'><th>source word (key)</th>"
        "<th>score q·k/√d_k</th><th>attention weight</th><th>share of its meaning in the output</th></tr>"
        f"{rows}</table></div>"
    )


def cross_attention_by_hand(attention_fn: Callable | None = None) -> FramePlayer:
    """The notes' 我 吃 苹果 -> "I eat ..." example: one decoder step per frame, its query against the
    three source keys, the weights and what the output takes from each word.

    Args:
        attention_fn: an ``attention(query, key, value, mask=None, dropout=None)``; ``None`` uses
            the reference (chapter 3).
    """
    used = resolve(attention_fn, reference_attention,
                   lambda fn: fn(*(hand_cross_attention(NOTES_WEIGHTS)[k] for k in ("query", "keys", "values"))),
                   "attention")
    # Buttons, not a slider: a slider's readout is too narrow for "produce apple".
    control = widgets.ToggleButtons(options=[f"produce {t}" for _, t, _ in HAND_STEPS], index=0,
                                    description="decoder step", style={"description_width": "initial",
                                                                       "button_width": "auto"})
    return FramePlayer(control, lambda i: _hand_frame(i, used.fn), len(HAND_STEPS), header=[used.banner()])


# --------------------------------------------------------------------------- the course model, student-built


def course_pairs(n: int = 4) -> list[tuple[str, str]]:
    """``n`` validation pairs (German source, English reference) from the course model's training log."""
    samples = load_training_log()[-1]["samples"]
    return [(s["source"], s["reference"]) for s in samples[:n]]


def _make_model_kwargs() -> dict:
    """The course model's dimensions as the notes' ``make_model`` arguments."""
    config = course_model_config()["model"]
    names = ("src_vocab", "tgt_vocab", "N", "d_model", "d_ff", "h", "dropout")
    return {k: config[k] for k in names if k in config}


def _probe_make_model(fn: Callable) -> torch.Tensor:
    """Outputs of a small model built by ``fn`` with fixed weights (``fixed_weights``, seed 0)."""
    torch.manual_seed(0)
    model = fixed_weights(fn(11, 13, N=2, d_model=16, d_ff=32, h=4, dropout=0.0), 0)
    src = torch.tensor([[3, 4, 5, 6, 2]])
    tgt = torch.tensor([[0, 7, 8, 9]])
    with torch.no_grad():
        return model(src, tgt, (src != 2).unsqueeze(-2), subsequent_mask(4))


@cache
def _course_model() -> tuple[EncoderDecoder, object]:
    """The course model and its tokenizer, loaded once per process (the widgets share it)."""
    return load_course_model()


def course_model_built_with(make_model_fn: Callable | None) -> tuple[EncoderDecoder, Resolved, Callable]:
    """The course model's weights in a model built by ``make_model_fn`` (the student's) when it
    builds the right structure, else in the course model itself.

    Every attention block is switched to the explicit matmul kernel, which keeps its weights in
    ``.attn`` for drawing.

    Returns:
        ``(model in eval mode, how it was resolved, tokenizer pair)``.
    """
    used = resolve(make_model_fn, reference_make_model, _probe_make_model, "make_model")
    if used.source == "student":  # the course's weights, read from its file: no reference model needed
        model = load_weights(used.fn(**_make_model_kwargs()), course_weights()).eval()
        tok = TokenizerPair.load(COURSE_MODEL_DIR)
    else:
        model, tok = _course_model()
    for module in model.modules():
        if hasattr(module, "kernel"):
            module.kernel = "matmul"
    return model, used, tok


@dataclass(frozen=True)
class Pair:
    """One sentence pair as the model sees it in teacher forcing.

    Attributes:
        src: ``(1, src_len)`` ids ending with ``</s>``; tgt: ``(1, tgt_len)`` decoder input
        (``<s>`` + reference); src_tokens, tgt_tokens: the subword strings of each position;
        predicted: the token each decoder position must produce (the reference shifted, then ``</s>``).
    """

    src: torch.Tensor
    tgt: torch.Tensor
    src_tokens: list[str]
    tgt_tokens: list[str]
    predicted: list[str]


def encode_pair(tok, source: str, reference: str) -> Pair:
    """Ids and token strings of a (German, English) pair for teacher forcing."""
    src_ids = tok.encode_src(source)
    ref_ids = tok.tgt.encode(reference).ids
    tgt_ids = [BOS, *ref_ids]
    name = tok.tgt.id_to_token
    return Pair(
        src=torch.tensor([src_ids]),
        tgt=torch.tensor([tgt_ids]),
        src_tokens=[tok.src.id_to_token(i) for i in src_ids],
        tgt_tokens=[name(i) for i in tgt_ids],
        predicted=[name(i) for i in [*ref_ids, EOS]],
    )


def run_pair(model: EncoderDecoder, pair: Pair) -> torch.Tensor:
    """Teacher-forced forward pass; returns the decoder states ``(1, tgt_len, d_model)``."""
    src_mask = torch.ones(1, 1, pair.src.size(1), dtype=torch.bool)
    tgt_mask = subsequent_mask(pair.tgt.size(1))
    with torch.no_grad():
        return model(pair.src, pair.tgt, src_mask, tgt_mask)


# --------------------------------------------------------------------------- the data-flow tracer


@dataclass(frozen=True)
class TracePoint:
    """The activations at one place of the architecture for one sentence pair.

    Attributes:
        label: what the place is; short: the same in a few characters (the slider's readout);
        blocks: the diagram blocks to outline; value: ``(len, features)``;
        rows: the token of each row; note: one sentence on what the numbers are.
    """

    label: str
    short: str
    blocks: tuple[str, ...]
    value: torch.Tensor
    rows: list[str]
    note: str


def trace(model: EncoderDecoder, pair: Pair) -> list[TracePoint]:
    """Every block's output for ``pair``, in the order the data flows, recorded with forward hooks."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []

    def keep(name: str, module: nn.Module) -> None:
        hooks.append(module.register_forward_hook(lambda _m, _i, out: seen.__setitem__(name, out.detach()[0])))

    keep("src_embed", model.src_embed)
    for i, layer in enumerate(model.encoder.layers):
        keep(f"enc{i}.attn", layer.sublayer[0])
        keep(f"enc{i}.ffn", layer.sublayer[1])
    keep("memory", model.encoder)
    keep("tgt_embed", model.tgt_embed)
    for i, layer in enumerate(model.decoder.layers):
        for j, part in enumerate(("self", "cross", "ffn")):
            keep(f"dec{i}.{part}", layer.sublayer[j])
    keep("decoder", model.decoder)
    keep("logits", model.generator.proj)
    try:
        states = run_pair(model, pair)
        with torch.no_grad():
            log_probs = model.generator(states)[0]
    finally:
        for h in hooks:
            h.remove()
    src, tgt = pair.src_tokens, pair.tgt_tokens
    points = [TracePoint("source embedding + positional encoding", "source in", ("src_embedding", "src_position"),
                         seen["src_embed"], src, "one vector per source token: embedding x sqrt(d_model) + position")]
    n_enc = len(model.encoder.layers)
    for i in range(n_enc):
        points.append(TracePoint(f"encoder layer {i + 1}: after self-attention + add", f"enc {i + 1} attn", ("self_attn", "enc_norm1"),
                                 seen[f"enc{i}.attn"], src, "the residual stream after the first sublayer"))
        points.append(TracePoint(f"encoder layer {i + 1}: after feed-forward + add", f"enc {i + 1} ffn", ("enc_ffn", "enc_norm2"),
                                 seen[f"enc{i}.ffn"], src, "the residual stream after the second sublayer"))
    points.append(TracePoint("memory: the encoder's output after its final LayerNorm", "memory", ("enc_norm2",),
                             seen["memory"], src, "what every cross-attention reads its keys and values from"))
    points.append(TracePoint("target embedding + positional encoding", "target in", ("tgt_embedding", "tgt_position"),
                             seen["tgt_embed"], tgt, "the decoder input: <s> and the reference, shifted right"))
    for i in range(len(model.decoder.layers)):
        for part, blocks, what in (("self", ("masked_attn", "dec_norm1"), "masked self-attention"),
                                   ("cross", ("cross_attn", "dec_norm2"), "cross-attention"),
                                   ("ffn", ("dec_ffn", "dec_norm3"), "feed-forward")):
            points.append(TracePoint(f"decoder layer {i + 1}: after {what} + add", f"dec {i + 1} {part}", blocks,
                                     seen[f"dec{i}.{part}"],
                                     tgt, f"the residual stream after the {what} sublayer"))
    points.append(TracePoint("decoder output after its final LayerNorm", "decoder out", ("dec_norm3",), seen["decoder"], tgt,
                             "what EncoderDecoder.forward returns: states, not probabilities"))
    points.append(TracePoint("generator: logits (Linear)", "logits", ("linear",), seen["logits"], tgt,
                             "one score per vocabulary entry for every position"))
    points.append(TracePoint("generator: log_softmax", "log-probs", ("softmax", "probabilities"), log_probs, tgt,
                             "log-probabilities of the next token; exp of a row sums to 1"))
    return points


def _png_tag(png: bytes, style: str = "") -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" style="display:block;{style}">'


def heat_png(values: torch.Tensor, cmap: str, vmin: float, vmax: float, cell: tuple[int, int]) -> bytes:
    """A ``(rows, cols)`` tensor as a PNG of ``cell = (width, height)``-pixel squares (no axes: the
    page lays the labels out in HTML, which is much faster than drawing a matplotlib figure)."""
    scaled = ((values.double() - vmin) / ((vmax - vmin) or 1.0)).clamp(0, 1).numpy()
    rgb = (colormaps[cmap](scaled)[..., :3] * 255).astype(np.uint8)
    rows, cols = values.shape
    image = Image.fromarray(rgb).resize((cols * cell[0], rows * cell[1]), Image.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def readable(token: str) -> str:
    """A subword piece as a reader wants it: ``▁dog`` -> ``dog``; a piece that continues a word gets ``-``."""
    if token.startswith("\u2581"):
        return token[1:] or "\u2581"
    return token if token.startswith("<") else "-" + token


def _labelled_heatmap(values: torch.Tensor, rows: Sequence[str], cols: Sequence[str] | None, cmap: str,
                      vmin: float, vmax: float, cell: tuple[int, int], title: str = "") -> str:
    """HTML: the heatmap image with its row labels at the left and, if given, column labels below."""
    w, h = cell
    row_labels = "".join(f'<div style="height:{h}px;line-height:{h}px;font-size:{min(11, h - 1)}px;'
                         f'text-align:right;white-space:nowrap">{html.escape(r)}</div>' for r in rows)
    col_labels = ""
    if cols is not None:
        col_labels = ('<tr><td></td><td style="padding:0">' + "".join(
            f'<div style="display:inline-block;width:{w}px;writing-mode:vertical-rl;font-size:{min(11, w - 1)}px;'
            f'white-space:nowrap;vertical-align:top">{html.escape(c)}</div>' for c in cols) + "</td></tr>")
    head = f'<tr><td></td><td style="font-size:11px;padding:0 0 2px 0">{html.escape(title)}</td></tr>' if title else ""
    return ('<table style="border-collapse:collapse;display:inline-table;vertical-align:top;margin:0 10px 8px 0">'
            f'{head}<tr><td style="padding:0 4px 0 0;vertical-align:top">{row_labels}</td>'
            f'<td style="padding:0;vertical-align:top">{_png_tag(heat_png(values, cmap, vmin, vmax, cell))}</td></tr>'
            f"{col_labels}</table>")


def diagram_with_boxes(dpi: int = 50) -> tuple[bytes, dict[str, tuple[int, int, int, int]]]:
    """The architecture diagram as a PNG, and every block's pixel box ``(left, top, width, height)`` in it,
    so that a frame can outline any block with HTML instead of drawing the figure again."""
    fig = architecture_diagram(())
    FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    fig.canvas.draw()
    ax = fig.axes[0]
    height = fig.bbox.height
    boxes = {}
    for name, (x, y, w, h, _, _) in BLOCKS.items():
        (x0, y0), (x1, y1) = ax.transData.transform([(x, y), (x + w, y + h)])
        boxes[name] = (round(x0) - 2, round(height - y1) - 2, round(x1 - x0) + 4, round(y1 - y0) + 4)
    # A 32-colour palette keeps the thumbnail small: every frame of the tracer embeds it.
    image = Image.open(io.BytesIO(figure_png(fig, dpi=dpi))).convert("RGB").quantize(colors=32)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue(), boxes


def _diagram_html(png: bytes, boxes: dict[str, tuple[int, int, int, int]], blocks: Sequence[str]) -> str:
    outlines = "".join(f'<div style="position:absolute;left:{b[0]}px;top:{b[1]}px;width:{b[2]}px;height:{b[3]}px;'
                       'border:2px solid #dc2626;border-radius:3px;box-sizing:border-box"></div>'
                       for b in (boxes[name] for name in blocks))
    return f'<div style="position:relative;display:inline-block;vertical-align:top">{_png_tag(png)}{outlines}</div>'


def _top_tokens_html(point: TracePoint, tok, predicted: list[str], k: int = 3) -> str:
    probs = point.value.exp() if point.label.endswith("log_softmax") else point.value.softmax(-1)
    top = probs.topk(k, dim=-1)
    rows = []
    for i, token in enumerate(point.rows):
        cells = "".join(
            f"<td style='padding:1px 8px'>{html.escape(readable(tok.tgt.id_to_token(int(j))))} "
            f"<span style='color:#666'>{float(p):.2f}</span></td>"
            for p, j in zip(top.values[i], top.indices[i], strict=True)
        )
        rows.append(f"<tr><td style='text-align:right;padding-right:8px'>{html.escape(readable(token))}</td>"
                    f"<td style='padding-right:10px'>→ {html.escape(readable(predicted[i]))}</td>{cells}</tr>")
    return ("<table style='border-collapse:collapse;font-size:12px'><tr><th>input</th><th>should produce</th>"
            f"<th colspan='{k}' style='text-align:left'>top {k} (probability after softmax)</th></tr>"
            + "".join(rows) + "</table>")


def _trace_frame(point: TracePoint, diagram: str, tok, pair: Pair) -> str:
    shape = "(1, " + ", ".join(str(s) for s in point.value.shape) + ")"
    if point.label.startswith("generator"):
        body = _top_tokens_html(point, tok, pair.predicted)
        extra = f"shape {shape}: one row of {point.value.size(1):,} numbers per position. The top tokens of each row:"
    else:
        shown = point.value[:, :64]
        bound = float(shown.abs().max()) or 1.0
        body = _labelled_heatmap(shown, [readable(r) for r in point.rows], None, "coolwarm", -bound, bound, (4, 13),
                                 f"features 0 to {shown.size(1) - 1}, colour scale ±{bound:.2g}")
        norms = point.value.norm(dim=-1)
        extra = f"shape {shape}; vector norms from {float(norms.min()):.1f} to {float(norms.max()):.1f}"
    return (
        '<div style="font-family:sans-serif;font-size:13px;line-height:1.35">'
        f"{diagram}"
        '<div style="display:inline-block;vertical-align:top;margin-left:12px;max-width:560px">'
        f"<p style='margin:0 0 4px 0'><b>{html.escape(point.label)}</b><br>{html.escape(point.note)}<br>"
        f"{html.escape(extra)}</p>{body}</div></div>"
    )


def data_flow_tracer(make_model_fn: Callable | None = None, pair_index: int = 0) -> FramePlayer:
    """Pick a place in the architecture: see where it is, the tensor's shape and its activations for a
    real sentence pair flowing through the course model (built with ``make_model_fn``).

    Args:
        make_model_fn: the student's ``make_model``; ``None`` draws with the reference.
        pair_index: which of ``course_pairs()`` to trace.
    """
    model, used, tok = course_model_built_with(make_model_fn)
    source, reference = course_pairs()[pair_index]
    pair = encode_pair(tok, source, reference)
    points = trace(model, pair)
    png, boxes = diagram_with_boxes()
    control = widgets.SelectionSlider(options=[p.short for p in points], index=0, description="block",
                                      layout={"width": "560px"})
    sentence = widgets.HTML(f"<div style='font-size:13px'>German: <i>{html.escape(source)}</i><br>"
                            f"English (teacher forcing): <i>{html.escape(reference)}</i></div>")
    return FramePlayer(control, lambda i: _trace_frame(points[i], _diagram_html(png, boxes, points[i].blocks), tok, pair),
                       len(points), header=[used.banner(), sentence])


# --------------------------------------------------------------------------- cross-attention alignments


def cross_attention_maps(model: EncoderDecoder, pair: Pair) -> torch.Tensor:
    """Every decoder layer's cross-attention weights for ``pair``.

    Returns:
        ``(N, h, tgt_len, src_len)``: row ``i`` is the decoder position that produces
        ``pair.predicted[i]``, column ``j`` the source token ``pair.src_tokens[j]``.
    """
    run_pair(model, pair)
    return torch.stack([layer.src_attn.attn[0] for layer in model.decoder.layers])


def _alignment_html(maps: torch.Tensor, layer: int, pair: Pair) -> str:
    """One decoder layer: the heads' mean and each head, rows = target tokens, columns = source tokens."""
    rows = [readable(t) for t in pair.predicted]
    cols = [readable(t) for t in pair.src_tokens]
    panels = [("mean over heads", maps[layer].mean(0))] + [(f"head {k + 1}", maps[layer, k]) for k in range(maps.size(1))]
    return "".join(_labelled_heatmap(weights, rows, cols, "Purples", 0.0, 1.0, (13, 13), title)
                   for title, weights in panels)


def cross_attention_explorer(make_model_fn: Callable | None = None, n_pairs: int = 4) -> FrameGrid:
    """The course model's cross-attention on real sentence pairs: a sentence picker and a layer
    slider; each frame shows the mean over the heads and every head, target rows x source columns.

    Args:
        make_model_fn: the student's ``make_model``; ``None`` draws with the reference.
        n_pairs: how many validation pairs to offer.

    Returns:
        The widget; its ``maps[i]`` holds pair ``i``'s ``(N, h, tgt_len, src_len)`` weights and
        ``pairs[i]`` the ``Pair``.
    """
    model, used, tok = course_model_built_with(make_model_fn)
    pairs = [encode_pair(tok, s, r) for s, r in course_pairs(n_pairs)]
    maps = [cross_attention_maps(model, p) for p in pairs]
    n_layers = maps[0].size(0)
    sentence = widgets.Dropdown(options=[f"{i + 1}: {s}" for i, (s, _) in enumerate(course_pairs(n_pairs))],
                                description="pair", layout={"width": "95%"})
    layer = widgets.SelectionSlider(options=[f"layer {k + 1}" for k in range(n_layers)], index=0,
                                    description="decoder")
    caption = widgets.HTML("<i>Rows: the decoder position that produces this English token. Columns: the "
                           "German source tokens (a leading - marks a piece that continues a word). Each row "
                           "sums to 1; darker is more weight.</i>")
    grid = FrameGrid(sentence, layer, (len(pairs), n_layers),
                     lambda i, j: _alignment_html(maps[i], j, pairs[i]), header=[used.banner(), caption])
    grid.maps, grid.pairs = maps, pairs
    return grid


def alignment_agreement(maps: torch.Tensor, pair: Pair, word_pairs: Sequence[tuple[str, str]], layer: int = -1
                        ) -> list[dict]:
    """For each (German piece, English piece) that both sentences contain, where the cross-attention of
    decoder layer ``layer`` (heads averaged) puts the English row's largest weight.

    Returns:
        One dict per found pair: ``de``, ``en``, ``argmax`` (the source token with the largest
        weight) and ``weight`` (the weight on ``de``).
    """
    weights = maps[layer].mean(0)
    found = []
    for de, en in word_pairs:
        if de in pair.src_tokens and en in pair.predicted:
            row = weights[pair.predicted.index(en)]
            found.append({"de": de, "en": en, "argmax": pair.src_tokens[int(row.argmax())],
                          "weight": float(row[pair.src_tokens.index(de)])})
    return found
