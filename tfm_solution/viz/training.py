"""Chapter 9's widgets: the learning-rate schedule, the smoothed target, padding under a token
budget, and the course model learning to translate, epoch by epoch.

The schedule and the smoothed target take the student's answer (``rate``, ``LabelSmoothing``)
and draw with it when it works, with the reference otherwise. Every frame is rendered in
advance as a small SVG or HTML fragment, so the widgets respond on the static website, where
there is no kernel, and stay small (a few kilobytes a frame).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

import ipywidgets as widgets
import torch

from torch.nn import functional as F
from torch.optim.lr_scheduler import LambdaLR

from ..data import BOS, EOS, PAD, SPECIALS, collate, token_batches
from ..encoder_decoder import make_model
from ..schedule import rate as reference_rate
from ..training import LabelSmoothing as ReferenceLabelSmoothing
from ..training import SimpleLossCompute
from ..training import train_with_accumulation as reference_train_with_accumulation
from .frames import Frame, as_widget, control_index_trait
from .language import localize
from .student import Resolved, resolve

_BLUE, _ORANGE, _GREEN, _GREY, _RED = "#2563eb", "#ea580c", "#16a34a", "#9ca3af", "#b91c1c"
_FONT = "font-family:sans-serif;font-size:13px;line-height:1.35"


def load_measurement(name: str) -> dict[str, Any]:
    """A measurement a script under ``scripts/`` wrote to ``tfm_solution/assets/<name>`` (JSON)."""
    return json.loads(resources.files("tfm_solution").joinpath("assets", name).read_text())


class FrameCube(widgets.VBox):
    """Several controls above nested stacks of precomputed frames, one stack level per control.

    Frame ``render(i0, i1, ...)`` shows when control ``k`` is at position ``ik``. Every stack
    of level ``k`` is ``jslink``-ed to control ``k``, so the frames respond on a static page
    (no kernel) as in a running kernel. With two controls this is a grid of frames.

    Args:
        controls: selection widgets (with ``options`` and ``index``), outermost first.
        render: maps one position per control to a frame (PNG bytes, HTML or a widget).
        header: widgets shown above the controls.

    Attributes:
        controls, stack (the outermost Stack), links (every ``jslink``, outer levels first).
    """

    def __init__(
        self,
        controls: Sequence[widgets.Widget],
        render: Callable[..., Frame],
        *,
        header: Sequence[widgets.Widget] = (),
    ) -> None:
        if not controls:
            raise ValueError("a FrameCube needs at least one control")
        self.controls = tuple(controls)
        traits = [control_index_trait(c) for c in self.controls]
        sizes = [len(c.options) for c in self.controls]
        self.links: list[widgets.Link] = []

        def build(prefix: tuple[int, ...]) -> widgets.Stack:
            level = len(prefix)
            if level == len(sizes) - 1:
                children = [as_widget(render(*prefix, i)) for i in range(sizes[level])]
            else:
                children = [build((*prefix, i)) for i in range(sizes[level])]
            stack = widgets.Stack(children=children,
                                  selected_index=getattr(self.controls[level], traits[level]))
            self.links.append(widgets.jslink((self.controls[level], traits[level]), (stack, "selected_index")))
            return stack

        self.stack = build(())
        self.links.sort(key=lambda link: self.controls.index(link.source[0]))
        super().__init__(children=[*header, *self.controls, self.stack])
        localize(self)  # the labels in the notebook's language (language.py)


# --------------------------------------------------------------------------- a small SVG line chart


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``low .. high``."""
    span = high - low
    if span <= 0:
        return [low]
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 2.5, 5, 10):
        if step * multiple >= raw:
            step *= multiple
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _tick_label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value / 1000:g}k"
    if abs(value) < 0.01:
        return f"{value:.0e}".replace("e-0", "e-")
    return f"{value:g}"


def svg_chart(
    series: Sequence[Mapping],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    *,
    x_label: str = "",
    y_label: str = "",
    marks: Sequence[tuple[float, float, str]] = (),
    width: int = 460,
    height: int = 220,
) -> str:
    """A line chart as an SVG string.

    Args:
        series: dicts with ``x`` and ``y`` (sequences of numbers), ``colour``, ``label`` and,
            optionally, ``dash`` (True for a dashed line) and ``width`` (line width).
        x_range, y_range: the axes' limits.
        marks: ``(x, y, text)`` points drawn as dots with a label.
    """
    left, right, top, bottom = 58, 12, 10, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    (x0, x1), (y0, y1) = x_range, y_range

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + (1 - (min(max(y, y0), y1) - y0) / (y1 - y0)) * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'style="font-family:sans-serif;font-size:10px">',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#d1d5db"/>']
    for t in _ticks(x0, x1):
        parts.append(f'<line x1="{px(t):.1f}" y1="{top + plot_h}" x2="{px(t):.1f}" y2="{top + plot_h + 4}" '
                     'stroke="#6b7280"/>'
                     f'<text x="{px(t):.1f}" y="{top + plot_h + 15}" text-anchor="middle">{_tick_label(t)}</text>')
    for t in _ticks(y0, y1):
        parts.append(f'<line x1="{left - 4}" y1="{py(t):.1f}" x2="{left + plot_w}" y2="{py(t):.1f}" '
                     'stroke="#f3f4f6"/>'
                     f'<text x="{left - 6}" y="{py(t) + 3:.1f}" text-anchor="end">{_tick_label(t)}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 4}" text-anchor="middle">{html.escape(x_label)}</text>'
                 f'<text x="12" y="{top + plot_h / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 12 {top + plot_h / 2})">{html.escape(y_label)}</text>')
    for k, s in enumerate(series):
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(s["x"], s["y"], strict=True)
                          if math.isfinite(y))
        dash = ' stroke-dasharray="5,4"' if s.get("dash") else ""
        parts.append(f'<polyline points="{points}" fill="none" stroke="{s["colour"]}" '
                     f'stroke-width="{s.get("width", 2)}"{dash}/>')
        legend_y = top + 12 + 13 * k
        parts.append(f'<line x1="{left + plot_w - 150}" y1="{legend_y - 3}" x2="{left + plot_w - 132}" '
                     f'y2="{legend_y - 3}" stroke="{s["colour"]}" stroke-width="2"{dash}/>'
                     f'<text x="{left + plot_w - 128}" y="{legend_y}">{html.escape(s["label"])}</text>')
    for x, y, text in marks:
        # a label right of a dot near the right edge would be cut off by the SVG's border: put it on the left
        anchor, dx = ("end", -6) if px(x) > left + plot_w / 2 else ("start", 6)
        parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{_RED}"/>'
                     f'<text x="{px(x) + dx:.1f}" y="{py(y) - 5:.1f}" text-anchor="{anchor}" fill="{_RED}">'
                     f'{html.escape(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


# --------------------------------------------------------------------------- the schedule explorer

D_MODELS = (128, 256, 512, 1024)
WARMUPS = (1000, 2000, 4000, 8000, 16000)
FACTORS = (0.5, 1.0, 2.0)
#: The paper's base model: d_model 512, 4000 warm-up steps, and no extra factor.
PAPER_SCHEDULE = (512, 1.0, 4000)
SCHEDULE_STEPS = 40_000


def schedule_curve(rate_fn: Callable, model_size: int, factor: float, warmup: int,
                   last: int = SCHEDULE_STEPS, points: int = 200) -> tuple[list[int], list[float]]:
    """``rate_fn`` on about ``points`` steps from 1 to ``last``, the warm-up step included."""
    steps = sorted({1, warmup, last, *(round(1 + i * (last - 1) / (points - 1)) for i in range(points))})
    return steps, [float(rate_fn(s, model_size, factor, warmup)) for s in steps]


def _probe_rate(fn: Callable) -> torch.Tensor:
    """Values every correct ``rate`` gives: step 0 (guarded), the warm-up ramp, the peak, the decay."""
    steps = (0, 1, 2, 100, 3999, 4000, 4001, 20_000)
    return torch.tensor([float(fn(s, 512, 1.0, 4000)) for s in steps], dtype=torch.float64)


def _schedule_frame(rate_fn: Callable, model_size: int, factor: float, warmup: int) -> str:
    xs, ys = schedule_curve(rate_fn, model_size, factor, warmup)
    paper_x, paper_y = schedule_curve(reference_rate, PAPER_SCHEDULE[0], PAPER_SCHEDULE[1], PAPER_SCHEDULE[2])
    peak_step = xs[max(range(len(ys)), key=ys.__getitem__)]
    peak = max(ys)
    top = 1.15 * max(peak, max(paper_y))
    is_paper = (model_size, factor, warmup) == PAPER_SCHEDULE
    chart = svg_chart(
        [{"x": paper_x, "y": paper_y, "colour": _GREY, "label": "the paper (512, 4000, 1)", "dash": True},
         {"x": xs, "y": ys, "colour": _BLUE, "label": "this setting"}],
        (0, SCHEDULE_STEPS), (0, top), x_label="optimizer step", y_label="learning rate",
        marks=[(peak_step, peak, f"peak {peak:.2e} at step {peak_step:,}")],
    )
    formula = factor * (model_size * warmup) ** -0.5
    last = ys[-1]
    return (
        f'<div style="{_FONT}">{chart}<br>'
        f"d_model {model_size}, warm-up {warmup:,}, factor {factor:g}"
        f"{' (the paper’s setting)' if is_paper else ''}: peak {peak:.3e} at step {peak_step:,} "
        f"(the formula factor·(d_model·warmup)<sup>−½</sup> gives {formula:.3e}); "
        f"at step {SCHEDULE_STEPS:,}: {last:.3e}.</div>"
    )


def schedule_explorer(rate_fn: Callable | None = None) -> FrameCube:
    """Sliders for d_model, warm-up steps and factor; the learning-rate curve next to the paper's.

    Args:
        rate_fn: the student's ``rate(step, model_size, factor, warmup)``; ``None`` draws with
            the reference.
    """
    used = resolve(rate_fn, reference_rate, _probe_rate, "rate")
    style = {"description_width": "initial"}
    d_model = widgets.SelectionSlider(options=list(D_MODELS), value=PAPER_SCHEDULE[0], description="d_model",
                                      style=style)
    warmup = widgets.SelectionSlider(options=list(WARMUPS), value=PAPER_SCHEDULE[2], description="warm-up steps",
                                     style=style)
    factor = widgets.SelectionSlider(options=list(FACTORS), value=PAPER_SCHEDULE[1], description="factor",
                                     style=style)

    def render(i: int, j: int, k: int) -> str:
        return _schedule_frame(used.fn, D_MODELS[i], FACTORS[k], WARMUPS[j])

    return FrameCube([d_model, warmup, factor], render, header=[used.banner()])


# --------------------------------------------------------------------------- the smoothed target

EPSILONS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
VOCAB_SIZES = (5, 8, 12, 20)
#: The true class of the example row (an ordinary word; ids 0-3 are the specials).
TRUE_CLASS = 4


def smoothed_targets(cls: Callable, size: int, smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, true_dist)`` of ``cls(size, PAD, smoothing)`` on two rows: label ``TRUE_CLASS``, then padding.

    The prediction is uniform, so the loss is the KL divergence from the smoothed target to it.
    """
    criterion = cls(size, PAD, smoothing)
    x = torch.log_softmax(torch.zeros(2, size, dtype=torch.float64), dim=-1)
    loss = criterion(x, torch.tensor([TRUE_CLASS, PAD]))
    return loss, criterion.true_dist


def _probe_smoothing(cls: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    loss, true_dist = smoothed_targets(cls, 7, 0.3)
    return torch.as_tensor(loss, dtype=torch.float64), torch.as_tensor(true_dist, dtype=torch.float64)


def _class_name(i: int) -> str:
    return SPECIALS[i] if i < len(SPECIALS) else f"w{i}"


def _smoothing_frame(true_dist: torch.Tensor, size: int, smoothing: float) -> str:
    row, padded = true_dist[0].double(), true_dist[1].double()
    bar_h = 110
    bars = []
    for i in range(size):
        p = float(row[i])
        colour = _GREEN if i == TRUE_CLASS else (_GREY if i == PAD else _BLUE)
        filled = max(0.0, min(1.0, p)) * bar_h
        bars.append(
            f'<div style="display:inline-block;width:30px;margin-right:2px;text-align:center;vertical-align:bottom">'
            f'<div style="font-size:9px">{p:.3f}</div>'
            f'<div style="height:{bar_h}px;position:relative;background:#f9fafb">'
            f'<div style="position:absolute;bottom:0;width:100%;height:{filled:.1f}px;background:{colour}"></div></div>'
            f'<div style="font-size:9px">{html.escape(_class_name(i))}</div></div>')
    total = float(row.sum())
    positive = row[row > 0]
    entropy = float(-(positive * positive.log()).sum())
    floor = -math.log(1 - smoothing) if smoothing < 1 else math.inf
    others = (smoothing / (size - 2)) if size > 2 else 0.0
    notes_sum = (1 - smoothing) + (size - 2) * smoothing / (size - 1)
    return (
        f'<div style="{_FONT}">'
        f'<div style="white-space:nowrap;overflow-x:auto">{"".join(bars)}</div>'
        f"<p>Label <code>{_class_name(TRUE_CLASS)}</code> (green) gets 1 − ε = {1 - smoothing:.3f}; each of the "
        f"{size - 2} other classes (blue) gets ε / (size − 2) = {others:.4f}; the padding column "
        f"<code>&lt;blank&gt;</code> (grey) gets {float(row[PAD]):.3f}. Row sum: {total:.4f}.<br>"
        f"A position whose label is padding: the whole row is {'zero' if float(padded.abs().sum()) == 0 else 'NOT zero'}"
        f" (sum {float(padded.sum()):.3f}), so it adds nothing to the loss.<br>"
        f"Cross-entropy against this target never goes below its entropy, {entropy:.3f} nats (the KL loss "
        f"subtracts it, so its floor is 0). A model that matches the target exactly still gives the label "
        f"−log(1 − ε) = {floor:.3f} nats: perplexity {math.exp(floor):.3f}, not 1.<br>"
        f"<span style='color:#6b7280'>The notes' formula ε / (V − 1), with the padding column zeroed, "
        f"would make the row sum {notes_sum:.4f}.</span></p></div>"
    )


def smoothing_explorer(label_smoothing_cls: Callable | None = None) -> FrameCube:
    """Sliders for ε and the vocabulary size; the smoothed target of one label, padding at zero.

    Args:
        label_smoothing_cls: the student's ``LabelSmoothing(size, padding_idx, smoothing)``
            class; ``None`` draws with the reference.
    """
    used = resolve(label_smoothing_cls, ReferenceLabelSmoothing, _probe_smoothing, "LabelSmoothing")
    style = {"description_width": "initial"}
    eps = widgets.SelectionSlider(options=list(EPSILONS), value=0.1, description="ε (smoothing)", style=style)
    size = widgets.SelectionSlider(options=list(VOCAB_SIZES), value=8, description="vocabulary size", style=style)

    def render(i: int, j: int) -> str:
        _, true_dist = smoothed_targets(used.fn, VOCAB_SIZES[j], EPSILONS[i])
        return _smoothing_frame(true_dist, VOCAB_SIZES[j], EPSILONS[i])

    return FrameCube([eps, size], render, header=[used.banner()])


# --------------------------------------------------------------------------- padding under a token budget

BUDGETS = (500, 1000, 2000, 4000, 8000, 16000, 25000)


def expand_lengths(histogram: Mapping[str, int]) -> list[tuple[int, int]]:
    """``{"src_len,tgt_len": count}`` -> one ``(src_len, tgt_len)`` per example, in sorted key order."""
    out: list[tuple[int, int]] = []
    for key in sorted(histogram, key=lambda k: tuple(int(v) for v in k.split(","))):
        s, t = (int(v) for v in key.split(","))
        out += [(s, t)] * int(histogram[key])
    return out


def random_batches(lengths: Sequence[tuple[int, int]], max_tokens: int, generator: torch.Generator
                   ) -> list[list[int]]:
    """Example indices in a random order, cut greedily so each padded batch holds at most
    ``max_tokens`` source and at most ``max_tokens`` target positions (the budget rule of
    ``token_batches``, without sorting by length)."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        grown = max(longest, *lengths[i])
        if current and grown * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, grown = [], max(lengths[i])
        current.append(i)
        longest = grown
    if current:
        batches.append(current)
    return batches


def sorted_batches(lengths: Sequence[tuple[int, int]], max_tokens: int, generator: torch.Generator
                   ) -> list[list[int]]:
    """The course's batching (``tfm_solution.data.token_batches``) on examples of these lengths."""
    return token_batches([([0] * s, [0] * t) for s, t in lengths], max_tokens, generator)


def padding_share(lengths: Sequence[tuple[int, int]], batches: Sequence[Sequence[int]]) -> float:
    """Share of the padded source and target positions of ``batches`` that are padding."""
    slots = real = 0
    for batch in batches:
        for side in (0, 1):
            sizes = [lengths[i][side] for i in batch]
            slots += max(sizes) * len(sizes)
            real += sum(sizes)
    return (slots - real) / slots


def _batch_picture(lengths: Sequence[tuple[int, int]], batch: Sequence[int], rows: int = 10) -> str:
    """The target side of ``rows`` sentences of one batch: real tokens dark, padding light."""
    sizes = [lengths[i][1] for i in batch[:rows]]
    width = max(lengths[i][1] for i in batch)
    scale = min(6.0, 220 / width)
    lines = "".join(
        f'<div style="height:6px;margin:1px 0;width:{width * scale:.0f}px;background:#fde68a">'
        f'<div style="height:6px;width:{n * scale:.0f}px;background:#1f2937"></div></div>' for n in sizes)
    more = (f"<div style='font-size:10px;color:#6b7280'>… {len(batch) - rows} more rows</div>"
            if len(batch) > rows else "")
    return f'<div style="display:inline-block;vertical-align:top;margin-right:24px">{lines}{more}</div>'


def padding_explorer(histogram: Mapping[str, int], seed: int = 0) -> widgets.VBox:
    """A token-budget slider: the share of padding with random batches and with length-sorted ones.

    Args:
        histogram: ``{"src_len,tgt_len": count}`` over the training pairs (see ``expand_lengths``).
        seed: seed of the random orders.
    """
    lengths = expand_lengths(histogram)
    frames = []
    for budget in BUDGETS:
        rows, pictures = [], []
        for name, make, colour in (("random order", random_batches, _ORANGE),
                                   ("sorted by length", sorted_batches, _GREEN)):
            batches = make(lengths, budget, torch.Generator().manual_seed(seed))
            share = padding_share(lengths, batches)
            rows.append(
                f"<tr><td style='padding:3px 10px 3px 0;white-space:nowrap'>{name}</td>"
                f"<td><div style='width:200px;background:#f3f4f6'><div style='width:{200 * share:.0f}px;"
                f"height:14px;background:{colour}'></div></div></td>"
                f"<td style='padding-left:8px;white-space:nowrap'>{100 * share:.1f}% padding, {len(batches):,} "
                f"batches of {len(lengths) / len(batches):.0f} pairs on average</td></tr>")
            middle = sorted(batches, key=len)[len(batches) // 2]
            pictures.append(f"<div style='display:inline-block;vertical-align:top;margin-right:28px'>"
                            f"<div style='font-size:11px;margin-bottom:2px'>{name}</div>"
                            f"{_batch_picture(lengths, middle)}</div>")
        frames.append(
            f'<div style="{_FONT}"><p>Budget {budget:,} source and {budget:,} target positions per batch, '
            f"{len(lengths):,} training pairs.</p>"
            f"<table style='border-collapse:collapse'>{''.join(rows)}</table>"
            "<p style='margin:8px 0 2px 0'>The target side of a median-sized batch of each kind "
            "(dark: tokens, yellow: padding):</p>"
            f"{''.join(pictures)}</div>")
    control = widgets.SelectionSlider(options=[f"{b:,}" for b in BUDGETS], value=f"{4000:,}",
                                      description="token budget", style={"description_width": "initial"})
    return FrameCube([control], frames.__getitem__)


# --------------------------------------------------------------------------- watch it learn


def _learning_frame(log: Sequence[Mapping], e: int) -> str:
    epochs = [int(r["epoch"]) for r in log]
    train = [float(r["train_loss"]) for r in log]
    val = [float(r["val_loss"]) for r in log]
    top = 1.1 * max(max(train), max(val))
    upto = slice(0, e + 1)
    chart = svg_chart(
        [{"x": epochs, "y": train, "colour": "#bfdbfe", "label": "train (whole run)", "width": 1},
         {"x": epochs, "y": val, "colour": "#fed7aa", "label": "validation (whole run)", "width": 1},
         {"x": epochs[upto], "y": train[upto], "colour": _BLUE, "label": "train, so far"},
         {"x": epochs[upto], "y": val[upto], "colour": _ORANGE, "label": "validation, so far"}],
        (min(epochs), max(max(epochs), min(epochs) + 1)), (0, top), x_label="epoch", y_label="loss per token",
        marks=[(epochs[e], val[e], f"{val[e]:.2f}")], width=440, height=200)
    r = log[e]
    facts = (f"epoch {int(r['epoch'])}, optimizer step {int(r['step']):,}: train loss {float(r['train_loss']):.3f}, "
             f"validation loss {float(r['val_loss']):.3f}, learning rate {float(r['lr']):.2e}, "
             f"{float(r['tokens_per_s']):,.0f} tokens/s, {float(r['seconds']) / 60:.1f} min so far")
    rows = "".join(
        f"<tr><td style='padding:3px 8px 3px 0;vertical-align:top'>{html.escape(s['source'])}</td>"
        f"<td style='padding:3px 8px;vertical-align:top;color:#6b7280'>{html.escape(s['reference'])}</td>"
        f"<td style='padding:3px 0 3px 8px;vertical-align:top'><b>{html.escape(s['output'])}</b></td></tr>"
        for s in r.get("samples", []))
    table = ("<table style='border-collapse:collapse;margin-top:6px'><tr><th style='text-align:left'>German</th>"
             "<th style='text-align:left;padding-left:8px'>reference</th>"
             f"<th style='text-align:left;padding-left:8px'>the model, after this epoch</th></tr>{rows}</table>"
             if rows else "")
    return f'<div style="{_FONT}">{chart}<p>{facts}</p>{table}</div>'


def learning_replay(log: Sequence[Mapping]) -> FrameCube:
    """An epoch slider over a training log: the loss curves so far and five translations at that epoch.

    Args:
        log: one dict per epoch with ``epoch``, ``step``, ``train_loss``, ``val_loss``, ``lr``,
            ``seconds``, ``tokens_per_s`` and ``samples`` (dicts with ``source``, ``reference``,
            ``output``), as ``tfm_solution.course_model.load_training_log()`` returns.
    """
    if not log:
        raise ValueError("the training log is empty")
    control = widgets.SelectionSlider(options=[f"epoch {int(r['epoch'])}" for r in log], index=0,
                                      description="after", style={"description_width": "initial"},
                                      layout={"width": "420px"})
    caption = widgets.HTML("<i>Replayed from the course model's training log: slide through the epochs.</i>")
    return FrameCube([control], lambda i: _learning_frame(log, i), header=[caption])


# --------------------------------------------------------------------------- the student's training step


def _probe_trainer(fn: Callable) -> torch.Tensor:
    """Parameters and learning rate after ``fn`` trains a tiny float64 model on 5 unequal micro-batches
    in groups of 2 (SGD, a decaying schedule): every correct answer leaves the same numbers."""
    torch.manual_seed(3)
    model = make_model(9, 9, N=1, d_model=8, d_ff=16, h=2, dropout=0.0).double()
    g = torch.Generator().manual_seed(4)
    pairs = [(torch.randint(4, 9, (n,), generator=g).tolist() + [EOS],
              [BOS] + torch.randint(4, 9, (n,), generator=g).tolist() + [EOS]) for n in (1, 6, 3, 2, 5)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    scheduler = LambdaLR(optimizer, lr_lambda=lambda step: 1 / (1 + step))
    loss = SimpleLossCompute(model.generator, lambda lp, y: F.nll_loss(lp, y, ignore_index=PAD, reduction="sum"))
    steps = fn(model, iter([collate(pairs, [i]) for i in range(5)]), loss, optimizer, scheduler, 2)
    return torch.cat([*(p.detach().flatten() for p in model.parameters()),
                      torch.tensor([optimizer.param_groups[0]["lr"], float(steps)], dtype=torch.float64)])


def pick_trainer(train_fn: Callable | None) -> Resolved:
    """The student's ``train_with_accumulation`` when it runs, else the reference (with the reason)."""
    return resolve(train_fn, reference_train_with_accumulation, _probe_trainer, "train_with_accumulation")
