"""Chapter 11's widgets: the cache growing step by step, measured time per token, a memory calculator.

``cache_growth`` and ``memory_calculator`` count bytes with the student's ``kv_cache_bytes`` when it
works (``student.resolve`` says which function drew); ``timing_explorer`` replays the measurements
of ``scripts/kv_cache_timing.py``. Every frame is rendered in advance, so the widgets also respond
on the static website.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from ..kv_cache import kv_cache_bytes as reference_bytes
from .decoding import FrameNest
from .frames import FramePlayer, figure_png
from .student import resolve

_REUSED, _NEW, _RECOMPUTED, _STATIC = "#bbf7d0", "#93c5fd", "#fecaca", "#ddd6fe"
_CELL = "width:34px;height:20px;text-align:center;border:1px solid #fff;font-size:10px;overflow:hidden"


def _bytes_probe(fn: Callable) -> torch.Tensor:
    cases = [(1, 3, 4, 32, 10, 4, 0), (2, 6, 8, 64, 100, 2, 30), (4, 32, 8, 128, 4096, 1, 0)]
    return torch.tensor([float(fn(*c)) for c in cases], dtype=torch.float64)


def human_bytes(n: float) -> str:
    """``n`` bytes in B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- the cache growing

def _strip(cells: Sequence[tuple[str, str]]) -> str:
    return "".join(f'<td style="{_CELL};background:{colour}">{html.escape(text)}</td>' for text, colour in cells)


def _growth_frame(t: int, tokens: Sequence[str], src_tokens: Sequence[str], layers: int, heads: int,
                  head_dim: int, count_bytes: Callable) -> str:
    """Step ``t`` (1-based): the decoder reads token ``t - 1`` and predicts token ``t``."""
    shown = list(tokens[:t])
    rows = []
    for layer in range(layers):
        cached = _strip([(tok, _REUSED) for tok in shown[:-1]] + [(shown[-1], _NEW)])
        rows.append(f"<tr><th style='font-weight:normal;text-align:right;padding-right:6px;white-space:nowrap'>"
                    f"layer {layer + 1} self K, V</th>{cached}</tr>")
    cross = _strip([(tok, _STATIC) for tok in src_tokens])
    recompute = _strip([(tok, _RECOMPUTED) for tok in shown])
    cached_bytes = count_bytes(1, layers, heads, head_dim, t, 4, len(src_tokens))
    return (
        "<div style='font-family:sans-serif;font-size:12px;line-height:1.3'>"
        f"<p style='margin:4px 0'>Step {t}: the decoder reads <b>{html.escape(shown[-1])}</b> and predicts "
        f"<b>{html.escape(tokens[t]) if t < len(tokens) else '(end)'}</b>.</p>"
        "<p style='margin:2px 0'><b>With the cache</b>: one new key and value per layer (blue), "
        f"the {t - 1} earlier ones reused (green).</p>"
        f"<table style='border-collapse:collapse'>{''.join(rows)}"
        "<tr><th style='font-weight:normal;text-align:right;padding-right:6px;white-space:nowrap'>"
        f"every layer, cross K, V</th>{cross}"
        "</tr></table>"
        f"<p style='margin:2px 0'>The cross-attention K, V (purple) were projected once from the encoder memory, "
        f"before step 1. Cache now: <b>{human_bytes(cached_bytes)}</b> in float32 (batch 1).</p>"
        f"<p style='margin:6px 0 2px 0'><b>Without the cache</b>, in each of the {layers} layers, this step "
        f"recomputes the keys and values of all {t} positions (red), and the cross K, V as well:</p>"
        f"<table style='border-collapse:collapse'><tr><th style='font-weight:normal;text-align:right;"
        f"padding-right:6px;white-space:nowrap'>each layer</th>{recompute}</tr></table>"
        f"<p style='margin:4px 0'>Self-attention K/V rows projected so far, per layer: cached <b>{t}</b>, "
        f"uncached <b>{t * (t + 1) // 2}</b> (1 + 2 + &hellip; + {t}).</p></div>"
    )


def cache_growth(tokens: Sequence[str], src_tokens: Sequence[str], layers: int, heads: int, head_dim: int,
                 kv_cache_bytes: Callable | None = None) -> FramePlayer:
    """A step slider over one translation: which K/V rows each layer adds, reuses, or would recompute.

    Args:
        tokens: the decoder's input tokens, ``<s>`` first, then the translation.
        src_tokens: the source's subword tokens (the cross-attention's keys).
        layers, heads, head_dim: the decoder's dimensions.
        kv_cache_bytes: the student's function; ``None`` counts with the reference.
    """
    used = resolve(kv_cache_bytes, reference_bytes, _bytes_probe, "kv_cache_bytes")
    steps = len(tokens) - 1
    slider = widgets.SelectionSlider(options=[str(t) for t in range(1, steps + 1)], index=0, description="step t")
    return FramePlayer(slider, lambda i: _growth_frame(i + 1, tokens, src_tokens, layers, heads, head_dim, used.fn),
                       steps, header=[used.banner()])


# --------------------------------------------------------------------------- measured time

def _timing_figure(entry: dict, view: str) -> Figure:
    rows = entry["rows"]
    lengths = [r["length"] for r in rows]
    fig = Figure(figsize=(6.4, 3.4))
    ax = fig.subplots()
    if view == "per token":
        ax.plot(lengths, [1000 * r["uncached_s"] / r["length"] for r in rows], "o-", color="#dc2626",
                label="without cache")
        ax.plot(lengths, [1000 * r["cached_s"] / r["length"] for r in rows], "o-", color="#2563eb",
                label="with cache")
        ax.set_ylabel("ms per generated token")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
    else:
        fit = entry["fitted_exponent"]
        ax.loglog(lengths, [r["uncached_s"] for r in rows], "o-", color="#dc2626", base=2,
                  label=f"without cache (fitted exponent {fit['uncached']:.2f})")
        ax.loglog(lengths, [r["cached_s"] for r in rows], "o-", color="#2563eb", base=2,
                  label=f"with cache (fitted exponent {fit['cached']:.2f})")
        ax.set_ylabel("seconds for the whole output")
    for r in rows:
        ax.annotate(f"{r['speedup']:.1f}x", (r["length"], r["uncached_s"] if view != "per token"
                                               else 1000 * r["uncached_s"] / r["length"]),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7, color="#7f1d1d")
    ax.set_xticks(lengths, labels=[str(n) for n in lengths])
    ax.minorticks_off()
    ax.set_xlabel("generated tokens L   (red labels: the speed-up of the cache)")
    ax.set_title(entry["name"], fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def timing_explorer(timing: dict) -> FrameNest:
    """The measurements of ``scripts/kv_cache_timing.py``: a model and a view (per token, or total log-log)."""
    names = [m["name"] for m in timing["models"]]
    views = ["per token", "total, log-log"]
    model_pick = widgets.Dropdown(options=names, index=0, description="model", layout=widgets.Layout(width="460px"))
    view_pick = widgets.ToggleButtons(options=views, index=0, description="view",
                                      style={"description_width": "initial"})
    caption = widgets.HTML(f"<i>Measured once by <code>{html.escape(timing['command'])}</code>: batch "
                           f"{timing['batch']}, one thread, the fastest of {timing['repeats']} runs, cached and "
                           "uncached alternating. Compare ratios, not seconds.</i>")
    return FrameNest([model_pick, view_pick], (len(names), len(views)),
                     lambda at: figure_png(_timing_figure(timing["models"][at[0]], views[at[1]]), dpi=64),
                     header=[caption])


# --------------------------------------------------------------------------- memory calculator

@dataclass(frozen=True)
class Preset:
    """A model's cache dimensions: layers, query heads, head size, key/value heads under GQA, and
    whether it is an encoder-decoder (whose cross-attention cache holds the source, as long as the
    output here)."""

    name: str
    layers: int
    heads: int
    head_dim: int
    gqa_kv_heads: int
    encoder_decoder: bool


PRESETS = (
    Preset("course model (3 layers, 4 heads of 32)", 3, 4, 32, 2, True),
    Preset("base Transformer (6 layers, 8 heads of 64)", 6, 8, 64, 2, True),
    Preset("7B decoder-only LLM (32 layers, 32 heads of 128)", 32, 32, 128, 8, False),
    Preset("70B decoder-only LLM (80 layers, 64 heads of 128)", 80, 64, 128, 8, False),
)
ATTENTION = ("MHA", "GQA", "MQA")
DTYPES = (("float32", 4), ("bfloat16 / float16", 2), ("int8", 1))
LENGTHS = (128, 1024, 4096, 32768, 131072)
BATCHES = (1, 8, 64)


def _memory_frame(preset: Preset, attention: str, dtype: tuple[str, float], count_bytes: Callable) -> str:
    kv_heads = {"MHA": preset.heads, "GQA": preset.gqa_kv_heads, "MQA": 1}[attention]
    head = "".join(f"<th style='padding:2px 10px'>batch {b}</th>" for b in BATCHES)
    body = []
    for n in LENGTHS:
        src_len = n if preset.encoder_decoder else 0
        cells = "".join(
            f"<td style='padding:2px 10px;text-align:right'>"
            f"{human_bytes(count_bytes(b, preset.layers, kv_heads, preset.head_dim, n, dtype[1], src_len))}</td>"
            for b in BATCHES)
        body.append(f"<tr><th style='font-weight:normal;text-align:right;padding-right:8px'>{n:,} tokens</th>"
                    f"{cells}</tr>")
    cross = (" plus the cross-attention cache of a source as long as the output" if preset.encoder_decoder
             else " (decoder-only: no cross-attention)")
    return (
        "<div style='font-family:sans-serif;font-size:12px;line-height:1.3'>"
        f"<p style='margin:4px 0'>{html.escape(preset.name)}, {attention}: <b>{kv_heads}</b> key/value head"
        f"{'s' if kv_heads > 1 else ''} of {preset.head_dim} for {preset.heads} query heads, {dtype[0]} "
        f"({dtype[1]:g} byte{'' if dtype[1] == 1 else 's'} per number). K and V, every layer{cross}:</p>"
        f"<table style='border-collapse:collapse'><tr><th></th>{head}</tr>{''.join(body)}</table></div>"
    )


def memory_calculator(kv_cache_bytes: Callable | None = None) -> FrameNest:
    """KV cache sizes for real model sizes: model, MHA / GQA / MQA, number format; lengths x batches.

    Args:
        kv_cache_bytes: the student's function; ``None`` counts with the reference.
    """
    used = resolve(kv_cache_bytes, reference_bytes, _bytes_probe, "kv_cache_bytes")
    model_pick = widgets.Dropdown(options=[p.name for p in PRESETS], index=0, description="model",
                                  layout=widgets.Layout(width="460px"))
    named = {"description_width": "initial"}
    attention_pick = widgets.ToggleButtons(options=list(ATTENTION), index=0, description="attention", style=named)
    dtype_pick = widgets.ToggleButtons(options=[d[0] for d in DTYPES], index=0, description="numbers", style=named)
    return FrameNest([model_pick, attention_pick, dtype_pick], (len(PRESETS), len(ATTENTION), len(DTYPES)),
                     lambda at: _memory_frame(PRESETS[at[0]], ATTENTION[at[1]], DTYPES[at[2]], used.fn),
                     header=[used.banner()])
