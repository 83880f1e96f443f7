"""Chapter 6's widgets: which hidden units of the course model's feed-forward layers fire on which
tokens, and ReLU against GELU on the same pre-activations.

The first takes the student's ``PositionwiseFeedForward`` (rebuilt with the course model's trained
weights), the second the student's ``gelu``; each draws with the reference while the exercise is
a stub, and renders every frame in advance so that it also responds on the static website.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure
from torch import nn

from ..feed_forward import PositionwiseFeedForward
from ..feed_forward import gelu as reference_gelu
from ..masks import subsequent_mask
from .frames import figure_png
from .masks import FrameGrid
from .multihead import one_thread
from .student import Resolved, fixed_weights, resolve


@dataclass(frozen=True)
class LayerInput:
    """What one feed-forward layer of the model receives on one sentence.

    Attributes:
        layer: ``"encoder 1"``, ..., ``"decoder N"``.
        tokens: the token at each position (source subwords, or the decoder input).
        x: ``(len(tokens), d_model)``, the layer's input (after the sublayer's norm).
        ffn: the model's trained ``PositionwiseFeedForward`` of that layer.
    """

    layer: str
    tokens: list[str]
    x: torch.Tensor
    ffn: nn.Module


def ffn_inputs(model: nn.Module, tok, sentence: str, max_len: int = 40) -> list[LayerInput]:
    """Run the model on ``sentence`` and its greedy translation; record every feed-forward layer's input."""
    from ..data import BOS, EOS, PAD
    from ..decoding import greedy_decode

    layers = [(f"encoder {i + 1}", layer) for i, layer in enumerate(model.encoder.layers)]
    layers += [(f"decoder {i + 1}", layer) for i, layer in enumerate(model.decoder.layers)]
    seen: dict[str, torch.Tensor] = {}
    hooks = [layer.feed_forward.register_forward_pre_hook(
        lambda _module, args, name=name: seen.__setitem__(name, args[0][0].detach().clone())) for name, layer in layers]
    src = torch.tensor([tok.encode_src(sentence)])
    src_mask = (src != PAD).unsqueeze(-2)
    try:
        with torch.no_grad(), one_thread():
            out = greedy_decode(model, src, src_mask, max_len, BOS, EOS, pad=PAD)[0].tolist()
            ids = out[: out.index(EOS)] if EOS in out else out
            tgt = torch.tensor([ids])
            memory = model.encode(src, src_mask)
            model.decode(memory, src_mask, tgt, subsequent_mask(tgt.size(1)))
    finally:
        for hook in hooks:
            hook.remove()
    src_tokens = [tok.src.id_to_token(i) for i in src[0].tolist()]
    tgt_tokens = [tok.tgt.id_to_token(i) for i in ids]
    return [LayerInput(name, src_tokens if name.startswith("encoder") else tgt_tokens, seen[name], layer.feed_forward)
            for name, layer in layers]


def encoder_ffn_inputs(model: nn.Module, tok, sentences: Sequence[str]) -> list[LayerInput]:
    """Every encoder feed-forward layer's input on ``sentences``, encoded as one padded batch.

    One ``LayerInput`` per encoder layer, whose ``tokens`` and ``x`` run over the real (unpadded)
    source tokens of all the sentences, one after the other: ``x`` is ``(total tokens, d_model)``.
    """
    from ..data import PAD, pad_batch

    seen: dict[int, torch.Tensor] = {}
    hooks = [layer.feed_forward.register_forward_pre_hook(
        lambda _module, args, i=i: seen.__setitem__(i, args[0].detach().clone()))
        for i, layer in enumerate(model.encoder.layers)]
    src = pad_batch([tok.encode_src(s) for s in sentences])
    keep = src != PAD
    try:
        with torch.no_grad(), one_thread():
            model.encode(src, keep.unsqueeze(-2))
    finally:
        for hook in hooks:
            hook.remove()
    tokens = [tok.src.id_to_token(i) for i in src[keep].tolist()]
    return [LayerInput(f"encoder {i + 1}", tokens, seen[i][keep], layer.feed_forward)
            for i, layer in enumerate(model.encoder.layers)]


def hidden_activations(ffn_cls: Callable, trained: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The hidden layer that ``ffn_cls``'s forward feeds into ``w_2``, with ``trained``'s weights.

    Shapes: x ``(n, d_model)``  ->  ``(n, d_ff)``.
    """
    d_ff, d_model = trained.w_1.weight.shape
    ffn = ffn_cls(d_model, d_ff, dropout=0.0)
    ffn.load_state_dict(trained.state_dict())
    ffn.eval()
    captured = []
    hook = ffn.w_2.register_forward_pre_hook(lambda _module, args: captured.append(args[0].detach()))
    try:
        with torch.no_grad():
            ffn(x[None])
    finally:
        hook.remove()
    if not captured:
        raise RuntimeError("forward never called self.w_2")
    return captured[0][0]


def _probe_ffn(cls: Callable) -> torch.Tensor:
    weights = fixed_weights(cls(8, 32, dropout=0.0), 7)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(7))
    return hidden_activations(cls, weights, x[0])


# --------------------------------------------------------------------------- which units fire where


def top_units(hidden: torch.Tensor, n_units: int) -> torch.Tensor:
    """The ``n_units`` units with the largest activation on this sentence, ordered by the position of their peak.

    Shapes: hidden ``(n, d_ff)``  ->  indices ``(min(n_units, d_ff),)``.
    """
    peak, where = hidden.max(dim=0)
    chosen = peak.topk(min(n_units, hidden.size(1))).indices
    return chosen[torch.argsort(where[chosen] * hidden.size(1) - peak[chosen] / (peak.max() + 1e-9), stable=True)]


def _units_frame(entry: LayerInput, hidden: torch.Tensor, n_units: int) -> bytes:
    units = top_units(hidden, n_units)
    shown = hidden[:, units].T  # (units, tokens)
    active = (hidden > 0).float().mean(dim=1)
    n = len(entry.tokens)
    fig = Figure(figsize=(min(8.5, max(6.0, 2.2 + 0.36 * n)), 5.2))
    bars, heat = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1, 3.6]}, sharex=True)
    bars.bar(range(n), active.tolist(), color="#2563eb")
    bars.set_ylim(0, 1)
    bars.set_ylabel("active\nunits", fontsize=7)
    bars.set_title(f"{entry.layer}: share of the {hidden.size(1)} hidden units above 0, per token "
                   f"(mean {active.mean().item():.0%})", fontsize=8, loc="left")
    bars.tick_params(labelsize=6)
    vmax = max(float(shown.max()), 1e-6)
    image = heat.imshow(shown.numpy(), aspect="auto", cmap="Reds", vmin=min(0.0, float(shown.min())), vmax=vmax,
                        interpolation="nearest")
    heat.set_yticks(range(len(units)), [f"unit {u}" for u in units.tolist()], fontsize=5.5)
    heat.set_xticks(range(n), entry.tokens, fontsize=6.5, rotation=90)
    heat.set_title(f"the {len(units)} units that fire hardest here, ordered by where they peak",
                   fontsize=8, loc="left")
    fig.colorbar(image, ax=heat, fraction=0.04, pad=0.01).ax.tick_params(labelsize=6)
    fig.tight_layout()
    return figure_png(fig, dpi=80)


def unit_activation_map(sentences: Sequence[str], ffn_cls: Callable | None = None, n_units: int = 32,
                        model: nn.Module | None = None, tok=None) -> FrameGrid:
    """A sentence menu and a layer slider: the hidden units of that feed-forward layer against the tokens.

    The returned grid also carries ``inputs`` (``ffn_inputs`` of every sentence) and ``hidden``
    (the matching ``(n, d_ff)`` activations), what it drew.

    Args:
        sentences: German source sentences; the decoder layers read the model's own translation.
        ffn_cls: the student's ``PositionwiseFeedForward``, rebuilt with each layer's trained
            weights; ``None`` draws with the reference.
        n_units: how many units each map shows.
        model, tok: another model and tokenizer pair (default: ``load_course_model()``).
    """
    if model is None or tok is None:
        from ..course_model import load_course_model

        model, tok = load_course_model()
    used = resolve(ffn_cls, PositionwiseFeedForward, _probe_ffn, "PositionwiseFeedForward")
    inputs = [ffn_inputs(copy.deepcopy(model).eval(), tok, s) for s in sentences]
    with one_thread():
        hidden = [[hidden_activations(used.fn, e.ffn, e.x) for e in row] for row in inputs]
    sentence = widgets.Dropdown(options=list(sentences), description="sentence", layout={"width": "95%"})
    layer = widgets.SelectionSlider(options=[e.layer for e in inputs[0]], description="layer")
    grid = FrameGrid(sentence, layer, (len(sentences), len(inputs[0])),
                     lambda i, j: _units_frame(inputs[i][j], hidden[i][j], n_units), header=[used.banner()])
    grid.inputs, grid.hidden = inputs, hidden
    return grid


# --------------------------------------------------------------------------- ReLU against GELU

ACTIVATIONS = ("ReLU", "GELU")
#: A GELU output counts as "let through negative" below this value (ReLU would give exactly 0).
LEAK = -0.01


def _probe_gelu(fn: Callable) -> torch.Tensor:
    return fn(torch.linspace(-4, 4, 33, dtype=torch.float64))


@dataclass(frozen=True)
class ActivationStats:
    """One activation applied to one layer's pre-activations ``z = w_1(x)``.

    Attributes:
        z: ``(n, d_ff)`` pre-activations.
        out: ``(n, d_ff)`` the activation of ``z``.
        positive: ``(n,)`` share of units with a positive output at each position.
        negative: ``(n,)`` share with an output below ``LEAK`` (never, for the ReLU).
        zero: share of all outputs exactly 0.
    """

    z: torch.Tensor
    out: torch.Tensor
    positive: torch.Tensor
    negative: torch.Tensor
    zero: float


def activation_stats(z: torch.Tensor, activation: Callable) -> ActivationStats:
    out = activation(z)
    return ActivationStats(z, out, (out > 0).float().mean(1), (out < LEAK).float().mean(1), (out == 0).float().mean().item())


def _activation_frame(entry: LayerInput, name: str, stats: ActivationStats, gelu_fn: Callable) -> bytes:
    fig = Figure(figsize=(8.4, 3.0))
    curve, bars = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.5]})
    grid = torch.linspace(-4, 3, 141, dtype=torch.float64)
    counts = curve.twinx()
    counts.hist(stats.z.flatten().clamp(-4, 3).tolist(), bins=56, color="#e5e7eb")
    counts.set_yticks([])
    curve.set_zorder(counts.get_zorder() + 1)
    curve.patch.set_visible(False)
    curve.plot(grid, grid.clamp_min(0), color="#111", lw=1.2 if name == "GELU" else 2.2, ls="--" if name == "GELU" else "-",
               label="ReLU")
    if name == "GELU":
        curve.plot(grid, gelu_fn(grid).detach(), color="#dc2626", lw=2.2, label="GELU")
    curve.axhline(0, color="#999", lw=0.5)
    curve.set_xlabel("pre-activation z = w_1(x)   (grey: this layer's values)", fontsize=7)
    curve.set_title(f"{name}; {stats.zero:.0%} of the outputs are exactly 0", fontsize=8)
    curve.legend(fontsize=7, loc="upper left")
    curve.tick_params(labelsize=7)
    n = len(entry.tokens)
    bars.bar(range(n), stats.positive.tolist(), color="#2563eb", label="output > 0")
    bars.bar(range(n), (-stats.negative).tolist(), color="#dc2626", label=f"output < {LEAK} (negative, let through)")
    bars.axhline(0, color="#111", lw=0.6)
    bars.set_ylim(-1.05, 1.45)
    bars.set_yticks([-1, -0.5, 0, 0.5, 1])
    bars.set_xticks(range(n), entry.tokens, fontsize=6, rotation=90)
    bars.set_title(f"{entry.layer}: share of the {stats.z.size(1)} hidden units, token by token", fontsize=8)
    bars.legend(fontsize=6.5, loc="upper center", ncol=2)
    bars.tick_params(labelsize=7)
    fig.tight_layout()
    return figure_png(fig, dpi=80)


def activation_explorer(sentence: str, gelu_fn: Callable | None = None, model: nn.Module | None = None,
                        tok=None) -> FrameGrid:
    """A layer slider and a ReLU / GELU switch over the course model's pre-activations on one sentence.

    The model was trained with the ReLU; the GELU frames show what that activation would make of
    the same pre-activations. The returned grid also carries ``stats``: for each layer, one
    ``ActivationStats`` per entry of ``ACTIVATIONS``.

    Args:
        sentence: a German source sentence.
        gelu_fn: the student's ``gelu``; ``None`` draws with the reference.
        model, tok: another model and tokenizer pair (default: ``load_course_model()``).
    """
    if model is None or tok is None:
        from ..course_model import load_course_model

        model, tok = load_course_model()
    used: Resolved = resolve(gelu_fn, reference_gelu, _probe_gelu, "gelu")
    entries = ffn_inputs(copy.deepcopy(model).eval(), tok, sentence)
    with torch.no_grad():
        pre = [e.ffn.w_1(e.x).double() for e in entries]
        stats = [[activation_stats(z, fn) for fn in (torch.relu, used.fn)] for z in pre]
    layer = widgets.SelectionSlider(options=[e.layer for e in entries], description="layer")
    activation = widgets.ToggleButtons(options=list(ACTIVATIONS), style={"button_width": "auto"})
    grid = FrameGrid(layer, activation, (len(entries), len(ACTIVATIONS)),
                     lambda i, j: _activation_frame(entries[i], ACTIVATIONS[j], stats[i][j], used.fn),
                     header=[used.banner()])
    grid.stats = stats
    return grid
