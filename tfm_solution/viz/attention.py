"""Chapter 3's widgets: the library lookup, the 1/sqrt(d_k) scale, and the mask.

Each widget takes the student's function (``attention`` or ``softmax_saturation``), draws
with it when it works and with the reference otherwise, and renders every frame in advance
so that it also responds on the static website.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

import ipywidgets as widgets
from matplotlib.figure import Figure
import torch

from ..attention import attention as reference_attention
from ..attention import softmax_saturation as reference_saturation
from ..masks import subsequent_mask
from .frames import FramePlayer, figure_png
from .student import resolve

# The notes' worked example: which word does 它 (it) attend to?
TOKENS = ("这只", "动物", "没有", "过", "马路", "因为", "它", "太", "累", "了")
GLOSSES = ("this", "animal", "did not", "cross", "road", "because", "it", "too", "tired", "(done)")
#: What a key advertises and what a query looks for, one number per feature.
FEATURES = ("living thing", "place", "action", "state")
#: What a value carries: the meaning a word hands over when it is attended to.
MEANINGS = ("animal", "road", "crossing", "tiredness")

# Hand-made vectors, one row per token (same order as TOKENS). A real model learns them.
_KEYS = (
    (0.3, 0, 0, 0), (2, 0, 0, 0), (0, 0, 0.5, 0), (0, 0, 2, 0), (0, 2, 0, 0),
    (0, 0, 0, 0), (0.5, 0, 0, 0), (0, 0, 0, 0.5), (0, 0, 0, 2), (0, 0, 0, 0.3),
)  # fmt: skip
_QUERIES = (
    (1.5, 0, 0, 0), (0, 0, 1.5, 1), (0, 0, 1.5, 0), (1, 1.5, 0, 0), (0, 0, 1.5, 0),
    (0, 0, 0, 0), (4, 0, 0, 0), (0, 0, 0, 1.5), (1.5, 0, 0, 0), (0, 0, 0.5, 0.5),
)  # fmt: skip
_VALUES = (
    (0, 0, 0, 0), (1, 0, 0, 0), (0, 0, 0, 0), (0, 0, 1, 0), (0, 1, 0, 0),
    (0, 0, 0, 0), (0.2, 0, 0, 0), (0, 0, 0, 0.3), (0, 0, 0, 1), (0, 0, 0, 0),
)  # fmt: skip


def library_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V of the example sentence: each ``(10, 4)``, float64, one row per token of ``TOKENS``."""
    return tuple(torch.tensor(rows, dtype=torch.float64) for rows in (_QUERIES, _KEYS, _VALUES))  # type: ignore[return-value]


def _probe_attention(fn: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """A small batched, masked input every correct ``attention`` answers the same way."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = subsequent_mask(4)
    return fn(q, k, v, mask=mask)


def _probe_saturation(fn: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 5, 16, generator=g), torch.randn(2, 6, 16, generator=g)
    return fn(q, k, scaled=True), fn(q, k, scaled=False)


def _bar(fraction: float, colour: str, width_px: int = 160) -> str:
    filled = max(0, min(width_px, round(fraction * width_px)))
    return (
        f'<div style="display:inline-block;width:{width_px}px;height:12px;background:#eee;vertical-align:middle">'
        f'<div style="width:{filled}px;height:12px;background:{colour}"></div></div>'
    )


def _library_frame(i: int, scores: torch.Tensor, weights: torch.Tensor, mixed: torch.Tensor) -> str:
    """HTML for query word ``i``: the scores against every spine label, the weights, the mix."""
    d_k = len(FEATURES)
    q_text = ", ".join(f"{name} {value:g}" for name, value in zip(FEATURES, _QUERIES[i], strict=True) if value)
    rows = []
    best = int(weights[i].argmax())
    for j, (token, gloss) in enumerate(zip(TOKENS, GLOSSES, strict=True)):
        w = float(weights[i, j])
        style = "font-weight:bold;background:#fef3c7" if j == best else ""
        rows.append(
            f'<tr style="{style}"><td>{html.escape(token)}</td><td style="color:#666">{gloss}</td>'
            f"<td style='text-align:right'>{float(scores[i, j]):.2f}</td>"
            f"<td style='text-align:right'>{float(scores[i, j]) / math.sqrt(d_k):.2f}</td>"
            f"<td>{_bar(w, '#2563eb')} {100 * w:.1f}%</td></tr>"
        )
    mix_rows = "".join(
        f"<tr><td>{name}</td><td>{_bar(max(0.0, float(x)), '#16a34a')} {float(x):.2f}</td></tr>"
        for name, x in zip(MEANINGS, mixed[i], strict=True)
    )
    return (
        '<div style="font-family:sans-serif;font-size:13px;line-height:1.35">'
        f"<p><b>Query word: {html.escape(TOKENS[i])} ({GLOSSES[i]})</b>. What it looks for (Q): {q_text or 'nothing in particular'}.</p>"
        '<table style="border-collapse:collapse"><tr style="border-bottom:1px solid #999">'
        "<th>book (key)</th><th></th><th>Q·K</th><th>÷√d<sub>k</sub></th><th>attention weight</th></tr>"
        f"{''.join(rows)}</table>"
        f"<p>What {html.escape(TOKENS[i])} takes home: the weighted mix of the books' contents (V)</p>"
        f'<table style="border-collapse:collapse">{mix_rows}</table></div>'
    )


def library_lookup(attention_fn: Callable | None = None, start: str = "它", live: bool = False) -> FramePlayer:
    """The library analogy: pick a query word, see its scores, weights and the mixed value.

    Args:
        attention_fn: the student's ``attention(query, key, value, mask=None, dropout=None)``;
            ``None`` draws with the reference.
        start: the query word shown first.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    used = resolve(attention_fn, reference_attention, _probe_attention, "attention")
    q, k, v = library_tensors()
    mixed, weights = used.fn(q, k, v)
    scores = q @ k.T
    control = widgets.ToggleButtons(
        options=[f"{t} {g}" for t, g in zip(TOKENS, GLOSSES, strict=True)],
        index=TOKENS.index(start),
        description="query:",
        style={"button_width": "auto", "description_width": "initial"},
    )
    return FramePlayer(
        control,
        lambda i: _library_frame(i, scores, weights.detach(), mixed.detach()),
        len(TOKENS),
        header=[used.banner()],
        live=live,
    )


#: The d_k values of the scale slider.
D_K_GRID = tuple(2**p for p in range(11))


def saturation_curves(
    saturation_fn: Callable, d_ks: tuple[int, ...] = D_K_GRID, n_queries: int = 256, n_keys: int = 16, seed: int = 0
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Largest weight per query row for random unit-variance q, k, scaled and unscaled.

    Returns:
        ``(scaled, unscaled)``: one ``(n_queries,)`` tensor per entry of ``d_ks``.
    """
    g = torch.Generator().manual_seed(seed)
    scaled, unscaled = [], []
    for d_k in d_ks:
        q = torch.randn(n_queries, d_k, generator=g)
        k = torch.randn(n_keys, d_k, generator=g)
        scaled.append(saturation_fn(q, k, scaled=True).detach())
        unscaled.append(saturation_fn(q, k, scaled=False).detach())
    return scaled, unscaled


def _scale_frame(i: int, d_ks: tuple[int, ...], scaled: list[torch.Tensor], unscaled: list[torch.Tensor], n_keys: int) -> bytes:
    fig = Figure(figsize=(8, 2.9))
    left, right = fig.subplots(1, 2)
    means_s = [float(s.mean()) for s in scaled]
    means_u = [float(u.mean()) for u in unscaled]
    left.plot(d_ks, means_u, "o-", color="#dc2626", label="softmax(q·k)")
    left.plot(d_ks, means_s, "o-", color="#2563eb", label="softmax(q·k / √d_k)")
    left.axhline(1 / n_keys, color="#999", ls=":", lw=1)
    left.axvline(d_ks[i], color="#111", lw=1)
    left.set_xscale("log", base=2)
    left.set_ylim(0, 1.05)
    left.set_xlabel("d_k")
    left.set_ylabel("mean largest weight")
    left.legend(fontsize=8, loc="center right")
    bins = torch.linspace(0, 1, 21).tolist()
    right.hist(unscaled[i].tolist(), bins=bins, color="#dc2626", alpha=0.6, label="without scale")
    right.hist(scaled[i].tolist(), bins=bins, color="#2563eb", alpha=0.6, label="with 1/√d_k")
    right.set_xlabel("largest weight of a query row")
    right.set_ylabel("query rows")
    right.legend(fontsize=8)
    right.set_title(f"d_k = {d_ks[i]}: mean {means_u[i]:.2f} without, {means_s[i]:.2f} with", fontsize=9)
    fig.tight_layout()
    return figure_png(fig)


def scale_explorer(
    saturation_fn: Callable | None = None, n_keys: int = 16, d_ks: tuple[int, ...] = D_K_GRID, live: bool = False
) -> FramePlayer:
    """A d_k slider: without 1/sqrt(d_k) the largest weight saturates at 1, with it it stays spread.

    Args:
        saturation_fn: the student's ``softmax_saturation(query, key, scaled=True)``;
            ``None`` draws with the reference.
        n_keys: keys per query; a uniform row has largest weight ``1 / n_keys``.
        d_ks: the slider's values; it starts at 64 when that is one of them.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    used = resolve(saturation_fn, reference_saturation, _probe_saturation, "softmax_saturation")
    scaled, unscaled = saturation_curves(used.fn, d_ks, n_keys=n_keys)
    control = widgets.SelectionSlider(
        options=list(d_ks), value=64 if 64 in d_ks else d_ks[0], description="d_k", continuous_update=True
    )
    return FramePlayer(
        control, lambda i: _scale_frame(i, d_ks, scaled, unscaled, n_keys), len(d_ks), header=[used.banner()], live=live
    )


MASK_TOKENS = ("<s>", "the", "cat", "sat", "<blank>", "<blank>")
MASK_KINDS = ("no mask", "padding mask", "causal mask", "padding + causal")


def example_masks(n_real: int = 4, n: int = len(MASK_TOKENS)) -> list[torch.Tensor | None]:
    """The masks of ``MASK_KINDS`` for a sequence whose last ``n - n_real`` tokens are padding.

    Each mask is ``(n, n)`` boolean (True = may attend) or ``None``.
    """
    padding = (torch.arange(n) < n_real).expand(n, n)
    causal = subsequent_mask(n)[0]
    return [None, padding, causal, padding & causal]


def _mask_frame(mask: torch.Tensor | None, weights: torch.Tensor, kind: str) -> bytes:
    n = len(MASK_TOKENS)
    fig = Figure(figsize=(8, 3.3))
    left, right = fig.subplots(1, 2)
    shown = torch.ones(n, n) if mask is None else mask.float()
    left.imshow(shown.numpy(), cmap="Greys_r", vmin=0, vmax=1)
    left.set_title(f"{kind}: white = may attend", fontsize=9)
    right.imshow(weights.numpy(), cmap="Blues", vmin=0, vmax=1)
    hidden = 0 if mask is None else int((~mask).sum())
    right.set_title(f"attention weights ({hidden} masked, each exactly 0)", fontsize=9)
    for i in range(n):
        for j in range(n):
            w = float(weights[i, j])
            right.text(j, i, "0" if w == 0 else f"{w:.2f}", ha="center", va="center", fontsize=7, color="white" if w > 0.6 else "black")
    for ax in (left, right):
        ax.set_xticks(range(n), MASK_TOKENS, fontsize=7, rotation=30)
        ax.set_yticks(range(n), MASK_TOKENS, fontsize=7)
        ax.set_xlabel("key (what is looked at)", fontsize=8)
    left.set_ylabel("query (who looks)", fontsize=8)
    fig.tight_layout()
    return figure_png(fig)


def mask_explorer(attention_fn: Callable | None = None, seed: int = 3, live: bool = False) -> FramePlayer:
    """Toggle a padding and a causal mask and see which attention weights become zero.

    Args:
        attention_fn: the student's ``attention``; ``None`` draws with the reference.
        seed: seed of the random queries and keys.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    used = resolve(attention_fn, reference_attention, _probe_attention, "attention")
    g = torch.Generator().manual_seed(seed)
    n = len(MASK_TOKENS)
    q, k = torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g)
    masks = example_masks()
    weights = [used.fn(q, k, k, mask=m)[1].detach() for m in masks]
    control = widgets.ToggleButtons(options=list(MASK_KINDS), description="mask:", style={"button_width": "auto", "description_width": "initial"})
    return FramePlayer(
        control,
        lambda i: _mask_frame(masks[i], weights[i], MASK_KINDS[i]),
        len(MASK_KINDS),
        header=[used.banner()],
        live=live,
    )
