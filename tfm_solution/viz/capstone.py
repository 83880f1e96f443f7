"""Chapter 12's widgets: the student's own Transformer learning the reversal task, and what it attends to.

``TrainingMonitor`` shows the held-out loss while the student's loop trains (in a running kernel
it redraws after every chunk of steps) and, once training is done, replays it: a slider over the
chunks, each frame the loss so far and the model's greedy outputs on three held-out sequences at
that point. ``cross_attention_view`` draws the trained model's own cross-attention weights on
held-out sequences, layer by layer, every head: a model that reverses has learned to look at the
mirrored source position, an anti-diagonal. Every frame is precomputed (SVG, HTML or PNG) and
linked to its controls with ``jslink``, so both widgets respond on the static website.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from ..capstone import ReversalTask, padded
from .frames import figure_png
from .language import localize
from .training import FrameCube, svg_chart

_BLUE, _GREEN, _RED, _GREY = "#2563eb", "#16a34a", "#b91c1c", "#6b7280"
_FONT = "font-family:sans-serif;font-size:13px;line-height:1.4"


def symbols(ids: Sequence[int], task: ReversalTask) -> str:
    """Ids as the page writes them: the specials by name, the symbols as letters A, B, C, ..."""
    names = {task.bos: "<s>", task.eos: "</s>", task.pad: "·", 3: "<unk>"}
    return " ".join(names.get(i, chr(ord("A") + i - 4)) for i in ids)


def greedy_outputs(model: torch.nn.Module, parts: Mapping[str, Any], pairs: Sequence[tuple[list[int], list[int]]],
                   task: ReversalTask) -> list[list[int]]:
    """The student's ``greedy_decode`` on ``pairs``' sources, each cut after its ``</s>``."""
    model.eval()
    src = padded([s for s, _ in pairs], task.pad)
    with torch.no_grad():
        out = parts["greedy_decode"](model, src, (src != task.pad).unsqueeze(-2), task.max_len + 2, task.bos,
                                     task.eos, task.pad)
    rows = []
    for row in out.tolist():
        rows.append(row[: row.index(task.eos) + 1] if task.eos in row else row)
    return rows


class TrainingMonitor(widgets.VBox):
    """The held-out loss of a training run, live, then a replay of it.

    Pass ``monitor.record`` as ``train_reversal``'s ``on_chunk``, with the student's namespace and
    three held-out pairs to watch. ``finish()`` replaces the live chart by a slider over the recorded
    chunks (a ``FrameCube``): each frame the loss curve up to that step and the three outputs then.
    """

    def __init__(self, parts: Mapping[str, Any], watched: Sequence[tuple[list[int], list[int]]],
                 task: ReversalTask) -> None:
        self.parts, self.watched, self.task = parts, list(watched), task
        self.records: list[tuple[int, float, list[list[int]]]] = []
        self.chart = widgets.HTML(value=f'<div style="{_FONT}">waiting for the first chunk of training...</div>')
        super().__init__(children=[self.chart])
        localize(self)  # the labels in the notebook's language (language.py)

    def record(self, step: int, loss: float, model: torch.nn.Module) -> None:
        """Called after each chunk of training: keep the loss and the current outputs, redraw."""
        self.records.append((step, loss, greedy_outputs(model, self.parts, self.watched, self.task)))
        model.train()
        self.chart.value = self._frame(len(self.records) - 1)

    def _frame(self, k: int) -> str:
        steps = [s for s, _, _ in self.records[: k + 1]]
        losses = [max(l, 1e-3) for _, l, _ in self.records[: k + 1]]
        top = max(l for _, l, _ in self.records) * 1.05
        chart = svg_chart([{"x": steps, "y": losses, "colour": _BLUE, "label": "held-out loss per token"}],
                          (0, max(self.task.steps, 1)), (0, top), x_label="optimizer step",
                          y_label="loss per token", marks=[(steps[-1], losses[-1], f"{losses[-1]:.3f}")])
        step, _, outputs = self.records[k]
        rows = []
        for (src, tgt), out in zip(self.watched, outputs):
            right = out == tgt
            colour = _GREEN if right else _RED
            rows.append(f"<tr><td>{html.escape(symbols(src, self.task))}</td>"
                        f'<td style="color:{colour}">{html.escape(symbols(out[1:], self.task))}</td>'
                        f"<td>{'right' if right else 'not yet'}</td></tr>")
        table = (f'<table style="{_FONT};border-collapse:collapse"><tr><th align="left">source</th>'
                 f'<th align="left">your model&#39;s output after {step} steps</th><th></th></tr>'
                 + "".join(rows) + "</table>")
        return f'<div style="{_FONT}">{chart}{table}</div>'

    def finish(self) -> FrameCube:
        """The replay: a slider over the recorded chunks. It starts at the first chunk, like the other
        chapters' training replays, so moving it forward plays the run; the live chart ended on the last."""
        slider = widgets.SelectionSlider(options=[f"{s}" for s, _, _ in self.records], index=0,
                                         description="after step", continuous_update=True,
                                         layout=widgets.Layout(width="460px"))
        replay = FrameCube([slider], lambda k: self._frame(k))
        self.children = [replay]
        return replay


def cross_attention(model: torch.nn.Module, pair: tuple[list[int], list[int]], task: ReversalTask
                    ) -> list[torch.Tensor]:
    """Each decoder layer's cross-attention weights ``(heads, target length, source length)`` on one
    pair, fed the whole target; read from the student's ``MultiHeadedAttention.attn`` (chapter 5)."""
    src, tgt = padded([pair[0]], task.pad), padded([pair[1]], task.pad)[:, :-1]
    causal = torch.ones(1, tgt.size(1), tgt.size(1), dtype=torch.bool).tril()
    model.eval()
    with torch.no_grad():
        model(src, tgt, (src != task.pad).unsqueeze(-2), causal)
    found = []
    for layer in model.decoder.layers:
        weights = getattr(layer.src_attn, "attn", None)
        if not isinstance(weights, torch.Tensor):
            raise AttributeError("the decoder's cross-attention keeps no weights in `.attn` (chapter 5 stores "
                                 "them there after every call)")
        found.append(weights[0].detach().float())
    return found


def _attention_png(weights: torch.Tensor, pair: tuple[list[int], list[int]], task: ReversalTask, layer: int) -> bytes:
    heads = weights.size(0)
    sources = symbols(pair[0], task).split()
    targets = symbols(pair[1][:-1], task).split()
    fig = Figure(figsize=(2.1 * heads + 0.6, 2.6))
    axes = fig.subplots(1, heads, squeeze=False)[0]
    for h, ax in enumerate(axes):
        ax.imshow(weights[h].numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks(range(len(sources)), sources, fontsize=7)
        ax.set_yticks(range(len(targets)), targets, fontsize=7)
        ax.set_title(f"layer {layer + 1}, head {h + 1}", fontsize=8)
        ax.set_xlabel("source (keys)", fontsize=7)
        if h == 0:
            ax.set_ylabel("target input (queries)", fontsize=7)
    fig.tight_layout()
    return figure_png(fig, dpi=80)


def cross_attention_view(model: torch.nn.Module, pairs: Sequence[tuple[list[int], list[int]]],
                         task: ReversalTask) -> FrameCube:
    """The trained model's cross-attention on held-out ``pairs``: choose the sequence and the layer."""
    maps = [cross_attention(model, pair, task) for pair in pairs]
    example = widgets.Dropdown(options=[symbols(src[:-1], task) for src, _ in pairs], description="sequence")
    layer = widgets.ToggleButtons(options=[f"layer {i + 1}" for i in range(len(maps[0]))], description="decoder")
    return FrameCube([example, layer], lambda e, l: _attention_png(maps[e][l], pairs[e], task, l))
