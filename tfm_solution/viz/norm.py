"""Chapter 7's widgets and measurements: batch norm vs layer norm on a padded batch, the gradient
that reaches the first layer with and without residual connections, and Pre-LN vs Post-LN
(the gradient per layer at initialization, and the warm-up curves of ``scripts/warmup_experiment.py``).

Every widget renders its frames in advance, so it also responds on the static website. The
widgets that run student code (``LayerNorm``, ``SublayerConnection``) draw with it when it
works and with the reference otherwise, and say which.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import nn

from ..embeddings import Embeddings
from ..encoder_decoder import EncoderLayer, Generator
from ..feed_forward import PositionwiseFeedForward
from ..multihead import MultiHeadedAttention
from ..norm import LayerNorm as ReferenceLayerNorm
from ..norm import NormPosition
from ..norm import SublayerConnection as ReferenceSublayerConnection
from ..positional_encoding import PositionalEncoding
from .frames import FramePlayer, figure_png
from .masks import FrameGrid
from .student import resolve

_POST, _PRE = "#dc2626", "#2563eb"

# --------------------------------------------------------------------------- batch norm vs layer norm

#: Real tokens of the two sentences of the toy batch; every further position is ``<pad>``.
LENGTHS = (4, 2)
N_FEATURES = 4
#: The padding the axis picker adds beyond what the longer sentence needs.
MAX_EXTRA_PAD = 4
#: The token whose normalized vector the axis picker follows: sentence 1, word 1.
WATCHED = (0, 0)


def padded_batch(extra_pad: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of two sentences of token vectors, padded to ``max(LENGTHS) + extra_pad`` positions.

    The real tokens are the same whatever the padding; every padded position holds the same
    vector, the embedding of ``<pad>`` (a real model also adds a positional encoding to it).
    The features have different offsets and scales, as learned features do.

    Returns:
        ``(x, keep)``: x ``(2, L, N_FEATURES)`` float64, keep ``(2, L)`` bool, True at real tokens.
    """
    g = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    scales = torch.tensor([1.0, 0.5, 2.0, 1.5], dtype=torch.float64)
    real = offsets + scales * torch.randn(2, max(LENGTHS), N_FEATURES, generator=g, dtype=torch.float64)
    pad_vector = torch.tensor([-1.5, 1.0, -2.0, 0.0], dtype=torch.float64)
    length = max(LENGTHS) + extra_pad
    keep = torch.arange(length)[None, :] < torch.tensor(LENGTHS)[:, None]
    x = pad_vector.expand(2, length, N_FEATURES).clone()
    for row, n in enumerate(LENGTHS):
        x[row, :n] = real[row, :n]
    return x, keep


def batch_norm_tokens(x: torch.Tensor, keep: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """Batch normalization of token vectors: one mean and variance per feature.

    With ``keep=None`` the statistics run over every (sentence, position) cell, padding
    included, which is what ``nn.BatchNorm1d`` computes in training mode on the flattened batch.
    With ``keep`` they run over the real tokens only. Biased variance, eps inside the root, no
    affine parameters (they would be the same for every cell).

    Shapes: x ``(batch, seq_len, d)``, keep ``(batch, seq_len)`` bool  ->  ``(batch, seq_len, d)``.
    """
    cells = x.reshape(-1, x.size(-1)) if keep is None else x[keep]
    mean = cells.mean(0)
    var = cells.var(0, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps)


def _probe_layer_norm(cls: Callable) -> torch.Tensor:
    x, _ = padded_batch(2)
    return cls(N_FEATURES)(x.float())


def _axis_frame(norm: str, extra: int, track: dict[str, torch.Tensor]) -> bytes:
    """The padded batch with the cells that share one mean and variance outlined, and the watched
    token's normalized features as the padding grows."""
    x, keep = padded_batch(extra)
    fig = Figure(figsize=(7.4, 3.0))
    grid_ax, line_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.05, 1]})
    length = x.size(1)
    rows = [(s, t) for s in range(2) for t in range(length)]
    image = torch.stack([x[s, t] for s, t in rows]).numpy()
    grid_ax.imshow(image, cmap="coolwarm", vmin=-4, vmax=4, aspect="auto")
    labels = []
    for i, (s, t) in enumerate(rows):
        real = bool(keep[s, t])
        labels.append(f"s{s + 1} w{t + 1}" if real else f"s{s + 1} <pad>")
        if not real:
            grid_ax.add_patch(Rectangle((-0.5, i - 0.5), N_FEATURES, 1, fill=False, hatch="///", ec="#6b7280", lw=0))
    grid_ax.set_yticks(range(len(rows)), labels, fontsize=6.5)
    grid_ax.set_xticks(range(N_FEATURES), [f"f{j + 1}" for j in range(N_FEATURES)], fontsize=7)
    grid_ax.axhline(length - 0.5, color="black", lw=1.2)
    watched_row = WATCHED[0] * length + WATCHED[1]
    if norm == "batch":
        grid_ax.add_patch(Rectangle((-0.45, -0.45), 0.9, len(rows) - 0.1, fill=False, ec="#16a34a", lw=2.4))
        mean = x.reshape(-1, N_FEATURES)[:, 0].mean().item()
        title = f"batch norm: f1 shares one mean ({mean:.2f})\nover all {len(rows)} cells, pads included"
    else:
        grid_ax.add_patch(Rectangle((-0.45, watched_row - 0.45), N_FEATURES - 0.1, 0.9, fill=False, ec="#16a34a", lw=2.4))
        mean = x[WATCHED].mean().item()
        title = f"layer norm: s1 w1 has its own mean ({mean:.2f})\nover its {N_FEATURES} features"
    grid_ax.set_title(title, fontsize=8)
    values = track[norm]
    pads = list(range(len(values)))
    for j in range(N_FEATURES):
        line_ax.plot(pads, values[:, j].numpy(), marker="o", ms=3, lw=1.2, label=f"f{j + 1}")
    line_ax.axvline(extra, color="#16a34a", lw=1.0, ls="--")
    line_ax.set_xticks(pads)
    line_ax.set_xlabel("extra <pad> positions in the batch", fontsize=8)
    line_ax.set_ylabel("normalized value of s1 w1", fontsize=8)
    line_ax.set_ylim(-2.2, 2.2)
    line_ax.tick_params(labelsize=7)
    line_ax.legend(fontsize=7, ncol=4, loc="lower center")
    moved = (values[extra] - values[0]).abs().max().item()
    line_ax.set_title(f"moved by the padding: {moved:.3f}", fontsize=8)
    fig.tight_layout()
    return figure_png(fig)


def norm_axis_explorer(layer_norm_cls: Callable | None = None, max_extra: int = MAX_EXTRA_PAD) -> FrameGrid:
    """Batch norm vs layer norm over a padded batch: which cells share one mean and variance,
    and how the normalized vector of one real token moves as padding is added.

    Args:
        layer_norm_cls: the student's ``LayerNorm(features, eps=1e-6)``; ``None`` draws with the reference.
        max_extra: the most extra padding the slider offers.
    """
    used = resolve(layer_norm_cls, ReferenceLayerNorm, _probe_layer_norm, "LayerNorm")
    layer_norm = used.fn(N_FEATURES)
    track: dict[str, list[torch.Tensor]] = {"batch": [], "layer": []}
    with torch.no_grad():
        for extra in range(max_extra + 1):
            x, _ = padded_batch(extra)
            track["batch"].append(batch_norm_tokens(x)[WATCHED])
            track["layer"].append(layer_norm(x.float())[WATCHED].double())
    stacked = {k: torch.stack(v) for k, v in track.items()}
    kinds = ("batch", "layer")
    norm = widgets.ToggleButtons(options=["batch norm (per feature)", "layer norm (per token)"],
                                 style={"button_width": "auto"})
    extra = widgets.IntSlider(value=0, min=0, max=max_extra, description="extra pads",
                              style={"description_width": "initial"})
    return FrameGrid(norm, extra, (2, max_extra + 1),
                     lambda i, j: _axis_frame(kinds[i], j, stacked), header=[used.banner()])


# --------------------------------------------------------------------------- residual connections


def first_layer_gradient(depth: int, residual: bool, normalize: bool = False, d_model: int = 32, seed: int = 0
                         ) -> float:
    """Norm of the gradient that reaches the first of ``depth`` stacked feed-forward sublayers.

    Each sublayer is the model's ``PositionwiseFeedForward(d_model, 4 d_model)`` with
    Xavier-uniform matrices (as ``make_model`` initializes them). Without residuals a layer
    computes ``x = ffn(x)``, with them ``x = x + ffn(x)``; ``normalize`` puts the notes'
    ``LayerNorm`` in front of every ``ffn`` (with residuals: the Pre-LN sublayer). The loss is a
    fixed random linear read-out of the last output, averaged over a batch of 8 x 10 positions.

    Returns:
        The Frobenius norm of d loss / d ``w_1.weight`` of the first sublayer.
    """
    torch.manual_seed(seed)
    ffns = [PositionwiseFeedForward(d_model, 4 * d_model, 0.0).double() for _ in range(depth)]
    for ffn in ffns:
        for p in ffn.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
    norm = ReferenceLayerNorm(d_model).double() if normalize else nn.Identity()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(8, 10, d_model, generator=g, dtype=torch.float64)
    read_out = torch.randn(d_model, generator=g, dtype=torch.float64)
    for ffn in ffns:
        # At initialization every LayerNorm is the identity affine map, so one instance serves all.
        x = x + ffn(norm(x)) if residual else ffn(norm(x))
    (x @ read_out).mean().backward()
    return ffns[0].w_1.weight.grad.norm().item()


# --------------------------------------------------------------------------- Pre-LN vs Post-LN at initialization

#: The size of the stacks whose gradients are measured (small enough to run in seconds).
GRAD_D_MODEL, GRAD_HEADS, GRAD_VOCAB = 32, 4, 100


def _encoder_stack(N: int, position: NormPosition, sublayer_cls: Callable | None, seed: int) -> nn.ModuleDict:
    """Embedding, ``N`` encoder layers, (for Pre-LN) a final LayerNorm and a generator, Xavier-initialized."""
    torch.manual_seed(seed)
    d = GRAD_D_MODEL
    layer = EncoderLayer(d, MultiHeadedAttention(GRAD_HEADS, d, 0.0), PositionwiseFeedForward(d, 4 * d, 0.0), 0.0,
                         position)
    if sublayer_cls is not None:
        layer.sublayer = nn.ModuleList([sublayer_cls(d, 0.0, norm_position=position) for _ in range(2)])
    stack = nn.ModuleDict({
        "embed": nn.Sequential(Embeddings(d, GRAD_VOCAB), PositionalEncoding(d, 0.0, 64)),
        "layers": nn.ModuleList([copy.deepcopy(layer) for _ in range(N)]),
        # A Pre-LN stack's residual stream is never normalized: it needs one more norm at the top.
        "final": ReferenceLayerNorm(d) if position == "pre" else nn.Identity(),
        "generator": Generator(d, GRAD_VOCAB),
    })
    for p in stack.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return stack


def layer_gradient_norms(
    N: int, position: NormPosition, sublayer_cls: Callable | None = None, seeds: Sequence[int] = (0, 1)
) -> torch.Tensor:
    """The gradient norm of each layer's weight matrices at initialization, averaged over seeds.

    An encoder-style stack (``GRAD_D_MODEL`` wide) predicts random next tokens; one backward
    pass of the cross-entropy gives every layer's gradient, the norm of all its matrices' gradients
    together.

    Args:
        N: number of layers.
        position: ``"pre"`` or ``"post"``.
        sublayer_cls: a ``SublayerConnection(size, dropout, norm_position=...)`` class to build the
            stack with (the student's); ``None`` uses the reference's.
        seeds: initializations (and batches) to average over.

    Returns:
        ``(N,)``: entry ``l`` is layer ``l``'s gradient norm (0 = next to the input).
    """
    totals = torch.zeros(N, dtype=torch.float64)
    for seed in seeds:
        stack = _encoder_stack(N, position, sublayer_cls, seed)
        g = torch.Generator().manual_seed(1000 + seed)
        ids = torch.randint(0, GRAD_VOCAB, (8, 16), generator=g)
        targets = torch.randint(0, GRAD_VOCAB, (8, 16), generator=g)
        mask = torch.ones(8, 1, 16, dtype=torch.bool)
        x = stack["embed"](ids)
        for layer in stack["layers"]:
            x = layer(x, mask)
        log_probs = stack["generator"](stack["final"](x))
        nn.functional.nll_loss(log_probs.reshape(-1, GRAD_VOCAB), targets.reshape(-1)).backward()
        for i, layer in enumerate(stack["layers"]):
            grads = [p.grad.flatten() for p in layer.parameters() if p.dim() > 1]
            totals[i] += torch.cat(grads).norm().item()
    return totals / len(seeds)


def _probe_sublayer(cls: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 8, generator=g)
    w = torch.randn(8, 8, generator=g)
    outs = []
    for position in ("pre", "post"):
        module = cls(8, 0.0, norm_position=position)
        module.eval()
        outs.append(module(x, lambda y: y @ w))
    return tuple(outs)


def _gradient_frame(i: int, depths: Sequence[int], norms: list[dict[str, torch.Tensor]], top: float) -> bytes:
    """Left: each layer's gradient norm for depth ``depths[i]``. Right: the mean over the layers for
    every depth, the current one marked."""
    N = depths[i]
    fig = Figure(figsize=(7.6, 2.9))
    ax, mean_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.4, 1]})
    layers = list(range(1, N + 1))
    for position, colour, label in (("post", _POST, "Post-LN (the paper)"), ("pre", _PRE, "Pre-LN (the notes' code)")):
        ax.plot(layers, norms[i][position].numpy(), marker="o", ms=3.5, color=colour, label=label)
        means = [float(n[position].mean()) for n in norms]
        mean_ax.plot(depths, means, marker="o", ms=3.5, color=colour)
        mean_ax.plot([N], [means[i]], marker="o", ms=9, mfc="none", mec="#16a34a", mew=2)
    for a in (ax, mean_ax):
        a.set_yscale("log")
        a.set_ylim(top / 10, top * 1.5)
        a.tick_params(labelsize=7)
    ax.set_xlabel("layer (1 = next to the input)", fontsize=8)
    ax.set_ylabel("gradient norm at init", fontsize=8)
    ax.set_xticks(layers if N <= 12 else layers[::2])
    ax.set_title(f"N = {N} layers", fontsize=9)
    ax.legend(fontsize=7.5)
    mean_ax.set_xscale("log", base=2)
    mean_ax.set_xticks(list(depths), [str(d) for d in depths])
    mean_ax.set_xlabel("depth N", fontsize=8)
    mean_ax.set_title("mean over the layers, per depth", fontsize=9)
    fig.tight_layout()
    return figure_png(fig)


def gradient_depth_explorer(sublayer_cls: Callable | None = None, depths: Sequence[int] = (2, 4, 8, 12)
                            ) -> FramePlayer:
    """A depth slider: each layer's gradient norm at initialization, Post-LN vs Pre-LN.

    Args:
        sublayer_cls: the student's ``SublayerConnection(size, dropout, norm_position="pre")``;
            ``None`` draws with the reference.
        depths: the stack depths to offer.

    Returns:
        The player; its ``norms[N]["pre" | "post"]`` holds the ``(N,)`` gradient norms it drew.
    """
    used = resolve(sublayer_cls, ReferenceSublayerConnection, _probe_sublayer, "SublayerConnection")
    cls = None if used.fn is ReferenceSublayerConnection else used.fn
    norms = [{p: layer_gradient_norms(N, p, cls) for p in ("post", "pre")} for N in depths]
    top = max(float(n[p].max()) for n in norms for p in n)
    control = widgets.SelectionSlider(options=[f"N = {N}" for N in depths], index=min(1, len(depths) - 1),
                                      description="depth")
    player = FramePlayer(control, lambda i: _gradient_frame(i, depths, norms, top), len(depths),
                         header=[used.banner()])
    player.norms = dict(zip(depths, norms, strict=True))  # the measured numbers, for the page to print
    return player


# --------------------------------------------------------------------------- the warm-up experiment

WARMUP_ASSET = "norm_warmup.json"


def load_warmup_results() -> dict[str, Any]:
    """The results ``scripts/warmup_experiment.py`` wrote: its settings and one loss curve per run."""
    text = resources.files("tfm_solution").joinpath("assets", WARMUP_ASSET).read_text()
    return json.loads(text)


#: What the warm-up widget can show: its control's labels and the placements each includes.
WARMUP_VIEWS = (
    ("Post-LN", ("post",)),
    ("Pre-LN", ("pre",)),
    ("both", ("post", "pre")),
)


def _warmup_frame(results: dict[str, Any], positions: Sequence[str]) -> bytes:
    fig = Figure(figsize=(6.4, 3.0))
    ax = fig.subplots()
    settings = results["settings"]
    several_rates = len(settings["learning_rates"]) > 1
    for run in results["runs"]:
        if run["norm_position"] not in positions:
            continue
        colour = _POST if run["norm_position"] == "post" else _PRE
        name = "Post-LN" if run["norm_position"] == "post" else "Pre-LN"
        label = f"{name}, " + (f"warm-up over {run['warmup']} steps" if run["warmup"] else "no warm-up")
        if several_rates:
            label += f", peak lr {run['lr']:g}"
        steps = [settings["log_every"] * (i + 1) for i in range(len(run["loss"]))]
        ax.plot(steps, run["loss"], "-" if run["warmup"] else "--", color=colour, lw=1.5, label=label)
    ax.axhline(settings["uniform_loss"], color="#6b7280", lw=0.8, ls=":")
    ax.text(0, settings["uniform_loss"], " guessing uniformly", fontsize=7, va="bottom", color="#6b7280")
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel("training loss", fontsize=8)
    ax.set_ylim(0, settings["uniform_loss"] * 1.25)
    ax.tick_params(labelsize=7)
    rates = ", ".join(f"{lr:g}" for lr in settings["learning_rates"])
    ax.set_title(f"{settings['N']} + {settings['N']} layers, d_model {settings['d_model']}, Adam, peak lr {rates}",
                 fontsize=9)
    ax.legend(fontsize=7.5, loc="lower left")
    fig.tight_layout()
    return figure_png(fig)


def warmup_curves(results: dict[str, Any] | None = None) -> FramePlayer:
    """The warm-up experiment's training curves: Post-LN, Pre-LN, or both, with and without warm-up.

    Args:
        results: as ``load_warmup_results()`` returns them (the default).
    """
    results = results or load_warmup_results()
    control = widgets.ToggleButtons(options=[label for label, _ in WARMUP_VIEWS], index=len(WARMUP_VIEWS) - 1,
                                    description="show:", style={"button_width": "auto"})
    banner = widgets.HTML('<div style="color:#555555;margin:2px 0 6px 0">Computed with the reference by '
                          "<code>python scripts/warmup_experiment.py</code>; loaded from "
                          f"<code>tfm_solution/assets/{WARMUP_ASSET}</code>.</div>")
    return FramePlayer(control, lambda i: _warmup_frame(results, WARMUP_VIEWS[i][1]), len(WARMUP_VIEWS),
                       header=[banner])
