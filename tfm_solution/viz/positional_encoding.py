"""Chapter 2's widgets: the sinusoid table and its waves, a pair turning on a circle, and the
dot product between positions as a function of their distance.

Each widget takes the student's ``positional_encoding(seq_len, d_model)``, draws with it when
it works and with the reference otherwise, and renders every frame in advance so that it
also responds on the static website.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..positional_encoding import pair_frequencies
from ..positional_encoding import positional_encoding as reference_pe
from .frames import FramePlayer, figure_png
from .student import Resolved, resolve


def _probe(fn: Callable) -> torch.Tensor:
    """A small table every correct ``positional_encoding`` fills the same way."""
    return fn(12, 8)


def _table(pe_fn: Callable | None, seq_len: int, d_model: int) -> tuple[Resolved, torch.Tensor]:
    """The resolved function and its table ``(seq_len, d_model)`` as float64."""
    used = resolve(pe_fn, reference_pe, _probe, "positional_encoding")
    return used, used.fn(seq_len, d_model).detach().double()


def _wave_frame(pe: torch.Tensor, i: int) -> bytes:
    """Heatmap with the columns of pair ``i`` outlined, and those two columns drawn as waves."""
    seq_len, d_model = pe.shape
    fig = Figure(figsize=(8, 3.4))
    heat, wave = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    heat.imshow(pe.numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    heat.add_patch(Rectangle((2 * i - 0.5, -0.5), 2, seq_len, fill=False, edgecolor="#22c55e", lw=2.5))
    heat.set_xlabel("dimension (2i = sin, 2i+1 = cos)", fontsize=8)
    heat.set_ylabel("position", fontsize=8)
    heat.set_title(f"PE table, {seq_len} positions x {d_model} dims", fontsize=9)
    heat.tick_params(labelsize=7)
    pos = torch.arange(seq_len)
    wave.plot(pos, pe[:, 2 * i], "-o", ms=2, color="#2563eb", label=f"dim {2 * i}: sin")
    wave.plot(pos, pe[:, 2 * i + 1], "-o", ms=2, color="#dc2626", label=f"dim {2 * i + 1}: cos")
    period = 2 * math.pi / float(pair_frequencies(d_model)[i])
    wave.set_ylim(-1.15, 1.15)
    wave.set_xlabel("position", fontsize=8)
    wave.set_title(f"pair i = {i}: wavelength {period:,.1f} positions", fontsize=9)
    wave.legend(fontsize=7, loc="lower left")
    wave.tick_params(labelsize=7)
    fig.tight_layout()
    return figure_png(fig)


def wave_explorer(pe_fn: Callable | None = None, seq_len: int = 64, d_model: int = 32, live: bool = False) -> FramePlayer:
    """A slider over the dimension pairs ``i``: the table, and the sin/cos columns of pair ``i``.

    Args:
        pe_fn: the student's ``positional_encoding(seq_len, d_model)``; ``None`` draws with the reference.
        seq_len, d_model: the size of the table shown.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    used, pe = _table(pe_fn, seq_len, d_model)
    control = widgets.IntSlider(value=0, min=0, max=d_model // 2 - 1, description="pair i", continuous_update=True)
    return FramePlayer(control, lambda i: _wave_frame(pe, i), d_model // 2, header=[used.banner()], live=live)


#: The pairs drawn as circles: the three fastest of a 16-wide table (57°, 18° and 5.7° per step).
CIRCLE_PAIRS = (0, 1, 2)


def _circle_frame(pe: torch.Tensor, pos: int, pairs: tuple[int, ...]) -> bytes:
    d_model = pe.shape[1]
    omega = pair_frequencies(d_model)
    fig = Figure(figsize=(8, 2.9))
    axes = fig.subplots(1, len(pairs), squeeze=False)[0]
    ring = torch.linspace(0, 2 * math.pi, 200)
    for ax, i in zip(axes, pairs, strict=True):
        ax.plot(torch.sin(ring), torch.cos(ring), color="#ddd", lw=1)
        trail = pe[: pos + 1, 2 * i : 2 * i + 2]
        ax.plot(trail[:, 0], trail[:, 1], "o", ms=3, color="#93c5fd")
        x, y = float(pe[pos, 2 * i]), float(pe[pos, 2 * i + 1])
        ax.annotate("", xy=(x, y), xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": "#2563eb", "lw": 2})
        ax.set_xlim(-1.25, 1.25)
        ax.set_ylim(-1.25, 1.25)
        ax.set_aspect("equal")
        ax.set_xlabel(f"dim {2 * i} (sin)", fontsize=8)
        ax.set_ylabel(f"dim {2 * i + 1} (cos)", fontsize=8)
        ax.set_title(f"pair {i}: {math.degrees(float(omega[i])):.1f}° per step", fontsize=9)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"position {pos}, d_model = {d_model}: each pair is a point on the unit circle, turned by pos x ω_i",
                 fontsize=9)
    fig.tight_layout()
    return figure_png(fig)


def circle_explorer(
    pe_fn: Callable | None = None, n_positions: int = 13, d_model: int = 16, pairs: tuple[int, ...] = CIRCLE_PAIRS,
    live: bool = False,
) -> FramePlayer:
    """A position slider: pairs of the table drawn as points that turn around the unit circle.

    Args:
        pe_fn: the student's ``positional_encoding(seq_len, d_model)``; ``None`` draws with the reference.
        n_positions: the slider runs over positions ``0 .. n_positions-1``.
        d_model: the width of the table the pairs come from.
        pairs: which pairs ``i`` to draw, one circle each.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    if max(pairs) >= d_model // 2:
        raise ValueError(f"pairs {pairs} do not all exist in a table of width {d_model}")
    used, pe = _table(pe_fn, n_positions, d_model)
    control = widgets.IntSlider(value=0, min=0, max=n_positions - 1, description="position", continuous_update=True)
    return FramePlayer(control, lambda p: _circle_frame(pe, p, pairs), n_positions, header=[used.banner()], live=live)


def distance_profile(pe: torch.Tensor, anchor: int) -> torch.Tensor:
    """``PE(anchor) . PE(p)`` for every row ``p`` of the table ``(seq_len, d_model)``; shape ``(seq_len,)``."""
    return pe @ pe[anchor]


#: The anchor positions of the distance slider.
ANCHORS = (0, 16, 32, 48, 64)


def _distance_frame(pe: torch.Tensor, anchor: int) -> bytes:
    seq_len, d_model = pe.shape
    gram = pe @ pe.T
    fig = Figure(figsize=(8, 3.2))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.5]})
    left.imshow(gram.numpy(), cmap="viridis", interpolation="nearest")
    left.axhline(anchor, color="#f97316", lw=1.5)
    left.set_title("PE(p) · PE(q) for all p, q", fontsize=9)
    left.set_xlabel("q", fontsize=8)
    left.set_ylabel("p", fontsize=8)
    left.tick_params(labelsize=7)
    offsets = torch.arange(seq_len) - anchor
    every = torch.arange(-seq_len + 1, seq_len, dtype=torch.float64)
    closed_form = torch.cos(every[:, None] * pair_frequencies(d_model)[None, :]).sum(-1)
    right.plot(every, closed_form, color="#999", ls="--", lw=1, label="Σ_i cos(k ω_i)")
    right.plot(offsets, distance_profile(pe, anchor), color="#f97316", lw=2, label=f"p = {anchor}")
    right.set_xlim(-seq_len + 1, seq_len - 1)
    right.set_xlabel("distance q - p", fontsize=8)
    right.set_ylabel("PE(p) · PE(q)", fontsize=8)
    right.set_title(f"row p = {anchor}: the same curve for every p, peak d_model/2 = {d_model // 2}", fontsize=9)
    right.legend(fontsize=7, loc="lower right")
    right.tick_params(labelsize=7)
    fig.tight_layout()
    return figure_png(fig)


def distance_explorer(
    pe_fn: Callable | None = None, seq_len: int = 80, d_model: int = 64, anchors: tuple[int, ...] = ANCHORS,
    live: bool = False,
) -> FramePlayer:
    """Pick a position ``p``: its dot product with every other position, plotted against the distance.

    Args:
        pe_fn: the student's ``positional_encoding(seq_len, d_model)``; ``None`` draws with the reference.
        seq_len, d_model: the size of the table.
        anchors: the positions ``p`` the slider offers.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    if max(anchors) >= seq_len:
        raise ValueError(f"anchors {anchors} must be positions below seq_len={seq_len}")
    used, pe = _table(pe_fn, seq_len, d_model)
    control = widgets.SelectionSlider(options=list(anchors), value=anchors[0], description="p", continuous_update=True)
    return FramePlayer(control, lambda j: _distance_frame(pe, anchors[j]), len(anchors), header=[used.banner()], live=live)
