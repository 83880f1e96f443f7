"""Chapter 10's widgets: shaping a next-token distribution, a beam search tree, and samples by temperature.

Each widget takes the student's answer (``top_k_top_p_filter`` or ``beam_step``), draws with it
when it works and with the reference otherwise (``student.resolve`` says which), and renders
every frame in advance, so that it also responds on the static website.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from ..decoding import BeamTrace, _autoregress, beam_search
from ..decoding import beam_step as reference_beam_step
from ..decoding import top_k_top_p_filter as reference_filter
from .frames import Frame, FramePlayer, as_widget, control_index_trait, figure_png
from .language import localize
from .student import Resolved, resolve

_KEPT, _DROPPED, _BAR = "#2563eb", "#d1d5db", "#93c5fd"


class FrameNest(widgets.VBox):
    """Several controls above nested stacks of precomputed frames, one frame per combination.

    The first control picks among the outermost stacks, the last one among the frames; every
    level is linked with ``jslink``, so the nest responds on a static page as in a kernel.

    Args:
        controls: selection widgets or ``IntSlider``s over ``0 .. n-1``, outermost first.
        shape: the number of positions of each control.
        render: maps a tuple of positions (one per control) to a frame.
        header: widgets shown above the controls.
    """

    def __init__(self, controls: Sequence[widgets.Widget], shape: Sequence[int],
                 render: Callable[[tuple[int, ...]], Frame], *, header: Sequence[widgets.Widget] = ()) -> None:
        if len(controls) != len(shape) or not controls:
            raise ValueError("one size per control, and at least one control")
        traits = [control_index_trait(c) for c in controls]
        self.controls, self.links = list(controls), []

        def build(level: int, prefix: tuple[int, ...]) -> widgets.Widget:
            if level == len(controls):
                return as_widget(render(prefix))
            stack = widgets.Stack(children=[build(level + 1, (*prefix, i)) for i in range(shape[level])],
                                  selected_index=getattr(controls[level], traits[level]))
            self.links.append(widgets.jslink((controls[level], traits[level]), (stack, "selected_index")))
            return stack

        self.stack = build(0, ())
        super().__init__(children=[*header, *controls, self.stack])
        localize(self)  # the labels in the notebook's language (language.py)


# --------------------------------------------------------------------------- distribution shaping

def _filter_probe(fn: Callable) -> torch.Tensor:
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(7)) * 2
    return torch.stack([fn(logits, top_k=5), fn(logits, top_p=0.7), fn(logits, top_k=8, top_p=0.9)]).isfinite()


def _entropy(probs: torch.Tensor) -> float:
    """In nats; never negative (a single surviving token gives 0, not a rounding-error -0.00)."""
    p = probs[probs > 0]
    return max(0.0, float(-(p * p.log()).sum()))


def _shaping_frame(logits: torch.Tensor, labels: Sequence[str], kept_logits: torch.Tensor, show: int,
                   note: str) -> str:
    before = logits.softmax(-1)
    after = kept_logits.softmax(-1)
    order = before.argsort(descending=True)[:show]
    width = 200 / max(float(before.max()), float(after.max()))
    rows = []
    for i in order.tolist():
        kept = bool(torch.isfinite(kept_logits[i]))
        colour = _KEPT if kept else _DROPPED
        rows.append(
            f"<tr><td style='text-align:right;padding-right:6px;font-family:monospace'>{html.escape(labels[i])}</td>"
            f"<td style='width:210px'><div style='background:{_BAR};height:9px;width:{float(before[i]) * width:.1f}px'>"
            f"</div><div style='background:{colour};height:9px;width:{float(after[i]) * width:.1f}px'></div></td>"
            f"<td style='padding-left:6px'>{float(before[i]):.3f} &rarr; "
            f"{'<b>' + format(float(after[i]), '.3f') + '</b>' if kept else 'removed'}</td></tr>")
    n_kept = int(torch.isfinite(kept_logits).sum())
    return (
        "<div style='font-family:sans-serif;font-size:12px;line-height:1.2'>"
        f"<p style='margin:4px 0'>{note}: <b>{n_kept}</b> of {logits.numel()} tokens survive; entropy "
        f"{_entropy(before):.2f} &rarr; {_entropy(after):.2f} nats. Light bars: softmax(z / T); dark bars: "
        "renormalised over the survivors.</p>"
        f"<table style='border-collapse:collapse'>{''.join(rows)}</table></div>"
    )


def shaping_explorer(
    logits: torch.Tensor,
    labels: Sequence[str],
    top_k_top_p_filter: Callable | None = None,
    temperatures: Sequence[float] = (0.5, 1.0, 1.5, 2.0),
    ks: Sequence[int | None] = (None, 10, 5, 2),
    ps: Sequence[float] = (1.0, 0.95, 0.8, 0.5),
    show: int = 14,
) -> FrameNest:
    """Temperature, top-k and top-p sliders over one real next-token distribution.

    Args:
        logits: ``(vocab,)`` next-token scores (log-probabilities work too).
        labels: a string per vocabulary id.
        top_k_top_p_filter: the student's filter; ``None`` draws with the reference.
        temperatures, ks, ps: the settings the sliders offer (``None`` / 1.0: that filter is off).
        show: how many of the most likely tokens to draw.
    """
    used = resolve(top_k_top_p_filter, reference_filter, _filter_probe, "top_k_top_p_filter")
    logits = logits.detach().float()
    wide = {"description_width": "100px"}
    t_slider = widgets.SelectionSlider(options=[f"{t:g}" for t in temperatures], index=list(temperatures).index(1.0)
                                       if 1.0 in temperatures else 0, description="temperature T", style=wide)
    k_slider = widgets.SelectionSlider(options=["off" if k is None else str(k) for k in ks], index=0,
                                       description="top-k", style=wide)
    p_slider = widgets.SelectionSlider(options=["off (1)" if p >= 1 else f"{p:g}" for p in ps], index=0,
                                       description="top-p", style=wide)

    def render(at: tuple[int, ...]) -> str:
        t, k, p = temperatures[at[0]], ks[at[1]], ps[at[2]]
        scaled = logits / t
        kept = used.fn(scaled.unsqueeze(0), top_k=k, top_p=p)[0]
        note = f"T = {t:g}, top-k {'off' if k is None else k}, top-p {'off' if p >= 1 else format(p, 'g')}"
        return _shaping_frame(scaled, labels, kept, show, note)

    return FrameNest([t_slider, k_slider, p_slider], (len(temperatures), len(ks), len(ps)), render,
                     header=[used.banner()])


# --------------------------------------------------------------------------- the beam tree

def _beam_probe(fn: Callable) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, generator=g, dtype=torch.float64)
    log_probs = torch.randn(2, 3, 7, generator=g, dtype=torch.float64).log_softmax(-1)
    return tuple(fn(scores, log_probs, 3))


#: 7 inches at 96 dots per inch: 672 pixels, the width of the book's text column.
TREE_DPI = 96


def _tree_figure(trace: list[BeamTrace], labels: Callable[[int], str], width: int,
                 best: list[tuple[str, float, float]], pruned_shown: int) -> Figure:
    """The search from top to bottom, one row per step, candidates by rank from left to right: open
    beams as blue dots linked to their parents, finished hypotheses as red squares, the best pruned
    candidates as grey crosses; the n-best list below. 7 inches wide: at ``TREE_DPI`` it fits the page's
    column at its own size, so a 9-point label is 12 pixels tall on screen."""
    steps = len(trace)
    columns = width + pruned_shown
    text_height = 0.3 + 0.2 * len(best)  # inches for the n-best list under the tree
    height = 1.1 + 0.62 * steps + text_height
    fig = Figure(figsize=(7, height))
    ax = fig.subplots()
    ax.axis("off")
    x_of = {0: 0.0}  # open slot of the previous step -> its column
    ax.plot([0], [0], "o", color="#111827", ms=5)
    ax.text(0.08, 0, "<s>", fontsize=9, va="center")
    for s, step in enumerate(trace, start=1):
        columns_now, slot = {}, 0
        for rank in range(min(columns, step.cand_scores.size(1))):
            score = float(step.cand_scores[0, rank])
            if score == float("-inf"):
                break
            parent, token = int(step.cand_parents[0, rank]), int(step.cand_tokens[0, rank])
            x, px = float(rank), x_of.get(parent, 0.0)
            if bool(step.kept[0, rank]):
                columns_now[slot] = x
                slot += 1
                colour, marker, edge = _KEPT, "o", _KEPT
            elif bool(step.ended[0, rank]):
                colour, marker, edge = "#b91c1c", "s", "#b91c1c"
            else:
                colour, marker, edge = "#9ca3af", "x", "#e5e7eb"
            ax.plot([px, x], [-(s - 1), -s], "-", color=edge, lw=1.1 if marker != "x" else 0.6)
            ax.plot([x], [-s], marker, color=colour, ms=5 if marker != "x" else 4)
            ax.text(x + 0.08, -s, f"{labels(token)}\n{score:.2f}", fontsize=9 if marker != "x" else 8,
                    color=colour, va="center", linespacing=1.05)
        x_of = columns_now
    lines = [f"{i + 1}. {text}   (log p = {lp:.2f}, score = {sc:.2f})" for i, (text, lp, sc) in enumerate(best)]
    ax.set_title(f"beam width {width}, one row per step, best candidate on the left:\nblue = open beams, "
                 "red squares = finished (they leave the beam), grey x = pruned;\nnumbers: summed "
                 "log-probabilities", fontsize=9, loc="left")
    fig.text(0.01, 0.08 / height, "\n".join(lines), fontsize=9, va="bottom", family="monospace")
    ax.set_xlim(-0.2, columns - 0.1)
    ax.set_ylim(-steps - 0.4, 0.4)
    fig.subplots_adjust(left=0.01, right=0.99, top=1 - 0.75 / height, bottom=text_height / height)
    return fig


def beam_tree(
    model: torch.nn.Module,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    start_symbol: int,
    end_symbol: int,
    decode: Callable[[list[int]], str],
    piece: Callable[[int], str],
    beam_step: Callable | None = None,
    widths: Sequence[int] = (1, 2, 3, 4, 5),
    max_len: int = 14,
    alpha: float = 0.6,
    pruned_shown: int = 2,
) -> FramePlayer:
    """A width slider over the beam search of one sentence: kept and pruned hypotheses, the final n-best.

    Args:
        model, src, src_mask: one sentence ``(1, src_len)`` and its mask.
        decode: ids (after the start symbol) -> text, for the n-best list.
        piece: one id -> its subword, for the tree's labels.
        beam_step: the student's ``beam_step``; ``None`` searches with the reference.
    """
    used = resolve(beam_step, reference_beam_step, _beam_probe, "beam_step")
    slider = widgets.SelectionSlider(options=[str(w) for w in widths], index=0, description="beam width")

    def render(i: int) -> bytes:
        width = widths[i]
        trace: list[BeamTrace] = []
        hyps = beam_search(model, src, src_mask, max_len, start_symbol, end_symbol, beam_size=width, alpha=alpha,
                           n_best=min(3, width), trace=trace, step_fn=used.fn)[0]
        best = [(decode(h.tokens[1:]), h.log_prob, h.score) for h in hyps]
        return figure_png(_tree_figure(trace, piece, width, best, pruned_shown), dpi=TREE_DPI)

    caption = widgets.HTML(f"<i>Length penalty &alpha; = {alpha:g}; the numbers are summed log-probabilities.</i>")
    return FramePlayer(slider, render, len(widths), header=[used.banner(), caption])


# --------------------------------------------------------------------------- samples by temperature

def distinct_ngrams(sentences: Sequence[Sequence[str]], n: int) -> float:
    """Distinct n-grams across ``sentences`` (lists of words) divided by all their n-grams (0 if none)."""
    grams = [tuple(words[i: i + n]) for words in sentences for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


#: The sampling widget's settings: temperatures, and top-p off (None) or on.
SAMPLE_TEMPERATURES = (0.5, 1.0, 1.5, 2.0)
SAMPLE_TOP_PS = (None, 0.9)


def draw_samples(model: torch.nn.Module, src: torch.Tensor, src_mask: torch.Tensor, max_len: int,
                 start_symbol: int, end_symbol: int, pad: int, decode: Callable[[list[int]], str],
                 top_k_top_p_filter: Callable | None = None, temperatures: Sequence[float] = SAMPLE_TEMPERATURES,
                 top_ps: Sequence[float | None] = SAMPLE_TOP_PS, seed: int = 0) -> tuple[dict, Resolved]:
    """Sample a translation of every row of ``src`` at each temperature, with and without top-p.

    Each token is drawn from ``softmax(filter(log_probs / T, top_p=p))`` with the student's
    ``top_k_top_p_filter`` (the reference while it is a stub), one generator seeded with ``seed``
    per setting: with the reference filter this is exactly ``decoding.sample``.

    Returns:
        ``({(T, p): [text per row of src]}, how the filter was resolved)``; ``p`` None means no filter.
    """
    used = resolve(top_k_top_p_filter, reference_filter, _filter_probe, "top_k_top_p_filter")
    samples = {}
    for t in temperatures:
        for p in top_ps:
            generator = torch.Generator().manual_seed(seed)

            def choose(log_probs: torch.Tensor, t: float = t, p: float | None = p,
                       generator: torch.Generator = generator) -> torch.Tensor:
                logits = log_probs / t if p is None else used.fn(log_probs / t, top_p=p)
                return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)

            with torch.no_grad():
                rows = _autoregress(model, src, src_mask, max_len, start_symbol, end_symbol, pad, True, choose)
            samples[t, p] = [decode(row[1:]) for row in rows.tolist()]
    return samples, used


def sampling_explorer(samples: dict[tuple[float, float | None], list[str]], greedy: str, reference: str,
                      used: Resolved | None = None) -> FrameNest:
    """A temperature slider and a top-p switch over precomputed samples of one translation.

    Args:
        samples: ``(temperature, top_p or None) -> sampled translations`` of one source (``draw_samples``).
        greedy, reference: the greedy translation and the human one, shown for comparison.
        used: how ``draw_samples`` resolved the filter (its message heads the widget).
    """
    temps = sorted({t for t, _ in samples})
    ps = sorted({p for _, p in samples}, key=lambda p: -1.0 if p is None else p)
    slider = widgets.SelectionSlider(options=[f"{t:g}" for t in temps], index=temps.index(1.0) if 1.0 in temps else 0,
                                     description="temperature T", style={"description_width": "100px"})
    switch = widgets.ToggleButtons(options=["no filter" if p is None else f"top-p {p:g}" for p in ps],
                                   description="filter", style={"button_width": "auto"})

    def render(position: tuple[int, int]) -> str:
        outs = samples[temps[position[0]], ps[position[1]]]
        d2 = distinct_ngrams([o.split() for o in outs], 2)
        items = "".join(f"<li>{html.escape(o)}</li>" for o in outs)
        return ("<div style='font-family:sans-serif;font-size:13px;line-height:1.35'>"
                f"<p style='margin:4px 0'>reference: <i>{html.escape(reference)}</i><br>greedy: "
                f"<i>{html.escape(greedy)}</i></p><ol style='margin:4px 0'>{items}</ol>"
                f"<p style='margin:4px 0'>distinct bigrams across these {len(outs)} samples: <b>{d2:.2f}</b> "
                "(1 = no bigram repeats)</p></div>")

    used = used or resolve(None, reference_filter, _filter_probe, "top_k_top_p_filter")
    return FrameNest([slider, switch], (len(temps), len(ps)), render, header=[used.banner()])
