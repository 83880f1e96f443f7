"""Chapter 1's widgets: nearest neighbours, the table moving in training, and the sqrt(d_model) scale.

The first two draw a recorded run of ``word_vectors.train_word_vectors`` (the toy corpus of
fruit and vehicle sentences); the third measures vector lengths. All use the student's
``cosine_similarity_matrix`` and ``Embeddings`` when they work and the reference otherwise.
Every frame is rendered in advance, so the widgets also respond on the static website.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

import ipywidgets as widgets
import torch
from torch import nn
from matplotlib.figure import Figure

from ..embeddings import Embeddings
from ..embeddings import cosine_similarity_matrix as reference_cosine
from ..word_vectors import GLOSSES, SNAPSHOT_STEPS, WordVectorRun, group_of, group_similarity, train_word_vectors
from .frames import FramePlayer, figure_png
from .student import Resolved, resolve

GROUP_COLOURS = {"fruit": "#d97706", "vehicle": "#2563eb", "other": "#9ca3af"}


def _probe_cosine(fn: Callable) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return fn(torch.randn(2, 5, 4, generator=g, dtype=torch.float64))


def _probe_embeddings(cls: type) -> torch.Tensor:
    """Build ``cls(4, 6)``, give it a fixed table, look up a small batch of ids."""
    module = cls(4, 6)
    with torch.no_grad():
        module.lut.weight.copy_(torch.arange(24, dtype=torch.float32).reshape(6, 4) / 10)
    return module(torch.tensor([[0, 5, 2], [3, 3, 1]]))


def resolve_cosine(cosine_fn: Callable | None) -> Resolved:
    """The student's ``cosine_similarity_matrix`` if it runs, else the reference."""
    return resolve(cosine_fn, reference_cosine, _probe_cosine, "cosine_similarity_matrix")


def resolve_embeddings(embeddings_cls: type | None) -> Resolved:
    """The student's ``Embeddings`` class if it runs, else the reference."""
    return resolve(embeddings_cls, Embeddings, _probe_embeddings, "Embeddings")


def _bar(value: float, width_px: int = 70) -> str:
    """A bar growing right (blue) for positive values, left (red) for negative ones."""
    filled = round(min(1.0, abs(value)) * width_px)
    left = f'<div style="display:inline-block;width:{width_px}px;text-align:right;vertical-align:middle">'
    right = f'<div style="display:inline-block;width:{width_px}px;vertical-align:middle">'
    bar = '<div style="display:inline-block;height:11px;width:{}px;background:{}"></div>'
    if value < 0:
        return left + bar.format(filled, "#dc2626") + "</div>" + right + "</div>"
    return left + "</div>" + right + bar.format(filled, "#2563eb") + "</div>"


def _label(word: str) -> str:
    return f"{html.escape(word)} <span style='color:#666'>{html.escape(GLOSSES.get(word, ''))}</span>"


def _neighbour_frame(i: int, vocab: list[str], before: torch.Tensor, after: torch.Tensor, top: int) -> str:
    """HTML for word ``i``: its ``top`` nearest neighbours after training, and their similarity before."""
    order = [j for j in after[i].argsort(descending=True).tolist() if j != i][:top]
    rows = "".join(
        f"<tr><td>{_label(vocab[j])}</td>"
        f"<td style='color:{GROUP_COLOURS[group_of(vocab[j])]}'>{group_of(vocab[j])}</td>"
        f"<td>{_bar(float(before[i, j]))} {float(before[i, j]):+.2f}</td>"
        f"<td>{_bar(float(after[i, j]))} {float(after[i, j]):+.2f}</td></tr>"
        for j in order
    )
    return (
        '<div style="font-family:sans-serif;font-size:13px;line-height:1.4">'
        f"<p><b>Nearest neighbours of {_label(vocab[i])}</b> (cosine similarity, −1 … 1)</p>"
        '<table style="border-collapse:collapse"><tr style="border-bottom:1px solid #999">'
        "<th>word</th><th>group</th><th>random table (step 0)</th><th>after training</th></tr>"
        f"{rows}</table></div>"
    )


def similarity_explorer(
    cosine_fn: Callable | None = None,
    run: WordVectorRun | None = None,
    start: str = "苹果",
    top: int = 6,
    live: bool = False,
) -> FramePlayer:
    """Pick a word; see its nearest neighbours by cosine similarity, before and after training.

    Args:
        cosine_fn: the student's ``cosine_similarity_matrix(vectors)``; ``None`` draws with the reference.
        run: a recorded training run (default: ``train_word_vectors()``).
        start: the word shown first.
        top: how many neighbours to list.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    used = resolve_cosine(cosine_fn)
    run = run or train_word_vectors()
    before, after = (used.fn(v.double()).detach() for v in (run.snapshots[0], run.snapshots[-1]))
    control = widgets.ToggleButtons(
        options=[f"{w} {GLOSSES.get(w, '')}" for w in run.vocab],
        index=run.vocab.index(start),
        description="word:",
        style={"button_width": "auto", "description_width": "initial"},
    )
    return FramePlayer(
        control,
        lambda i: _neighbour_frame(i, run.vocab, before, after, top),
        len(run.vocab),
        header=[used.banner()],
        live=live,
    )


def projection_2d(snapshots: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each ``(V, d)`` snapshot projected on the two principal axes of the last one: ``(V, 2)`` each.

    One fixed pair of axes for every frame, so that movement on screen is movement of the vectors.
    """
    final = snapshots[-1].double()
    centre = final.mean(0)
    _, _, vh = torch.linalg.svd(final - centre, full_matrices=False)
    return [(s.double() - centre) @ vh[:2].T for s in snapshots]


def _projection_frame(
    k: int, run: WordVectorRun, points: list[torch.Tensor], curves: dict[str, list[float]], limit: float
) -> bytes:
    fig = Figure(figsize=(8.4, 3.3))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})
    xy = points[k]
    for group, colour in GROUP_COLOURS.items():
        rows = [j for j, w in enumerate(run.vocab) if group_of(w) == group]
        label = "other words" if group == "other" else group
        left.scatter(xy[rows, 0].tolist(), xy[rows, 1].tolist(), s=14 if group == "other" else 36, color=colour,
                     label=label)
        if group != "other":
            # Stacked labels: words of one group end up on top of each other, their names must not.
            for rank, j in enumerate(rows):
                left.annotate(GLOSSES[run.vocab[j]], (float(xy[j, 0]), float(xy[j, 1])), fontsize=8, color=colour,
                              xytext=(6, 10 * rank - 10), textcoords="offset points")
    left.legend(fontsize=7, loc="upper left")
    left.set_xlim(-limit, limit)
    left.set_ylim(-limit, limit)
    left.set_title(f"step {run.steps[k]}: the table on its 2 main axes", fontsize=9)
    left.set_xticks([])
    left.set_yticks([])
    styles = {"fruit-fruit": ("#d97706", "-"), "vehicle-vehicle": ("#2563eb", "-"), "fruit-vehicle": ("#6b7280", "--")}
    for name, values in curves.items():
        colour, line = styles[name]
        right.plot(run.steps, values, line, color=colour, marker="o", ms=3, label=name)
    right.axvline(run.steps[k], color="#111", lw=1)
    right.set_ylim(-1, 1.05)
    right.set_xlabel("training step")
    right.set_ylabel("mean cosine similarity")
    right.legend(fontsize=8, loc="lower right")
    loss = float(run.losses[min(run.steps[k], len(run.losses) - 1)])
    right.set_title(f"loss at this step {loss:.2f}", fontsize=9)
    fig.tight_layout()
    return figure_png(fig)


def training_projection(
    cosine_fn: Callable | None = None,
    embeddings_cls: type | None = None,
    steps: tuple[int, ...] = SNAPSHOT_STEPS,
    live: bool = False,
) -> FramePlayer:
    """A training-step slider: the word vectors in 2-D and the group similarities as they learn.

    Args:
        cosine_fn: the student's ``cosine_similarity_matrix``; ``None`` uses the reference.
        embeddings_cls: the student's ``Embeddings`` class, trained here; ``None`` uses the reference.
        steps: the training steps shown, one frame each.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    cosine, table = resolve_cosine(cosine_fn), resolve_embeddings(embeddings_cls)
    run = train_word_vectors(steps=steps, embeddings_cls=table.fn)
    points = projection_2d(run.snapshots)
    limit = 1.1 * max(float(p.abs().max()) for p in points)
    stats = [group_similarity(run, cosine.fn(s.double()).detach()) for s in run.snapshots]
    curves = {name: [s[name] for s in stats] for name in stats[0]}
    control = widgets.SelectionSlider(options=list(run.steps), value=run.steps[0], description="step")
    return FramePlayer(
        control,
        lambda k: _projection_frame(k, run, points, curves, limit),
        len(run.steps),
        header=[table.banner(), cosine.banner()],
        live=live,
    )


#: The d_model values of the scale slider, and the initialisations compared.
D_MODEL_GRID = (32, 64, 128, 256, 512, 1024)
INITS = ("normal, std 1/√d_model", "xavier uniform", "normal, std 1")


def scale_lengths(
    embeddings_cls: type, d_models: tuple[int, ...] = D_MODEL_GRID, vocab: int = 2000, seed: int = 0
) -> dict[str, list[tuple[float, float]]]:
    """Mean vector length of ``embeddings_cls(d_model, vocab)`` per initialisation of its table.

    Returns:
        For each name of ``INITS``, one ``(table row length, module output length)`` pair per
        entry of ``d_models``; the module's output includes its ``sqrt(d_model)`` scale.
    """
    g = torch.Generator().manual_seed(seed)
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in INITS}
    for d in d_models:
        module = embeddings_cls(d, vocab)
        ids = torch.randint(0, vocab, (256,), generator=g)
        for name in INITS:
            with torch.no_grad():
                if name == INITS[0]:
                    nn.init.normal_(module.lut.weight, std=d**-0.5, generator=g)
                elif name == INITS[1]:
                    nn.init.xavier_uniform_(module.lut.weight, generator=g)
                else:
                    nn.init.normal_(module.lut.weight, generator=g)
                rows = module.lut.weight[ids].norm(dim=-1).mean().item()
                out = module(ids).norm(dim=-1).mean().item()
            found[name].append((rows, out))
    return found


def _scale_frame(k: int, d_models: tuple[int, ...], lengths: dict[str, list[tuple[float, float]]]) -> bytes:
    d = d_models[k]
    fig = Figure(figsize=(8.4, 3.0))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.1]})
    x = torch.arange(len(INITS)).float()
    rows = [lengths[name][k][0] for name in INITS]
    outs = [lengths[name][k][1] for name in INITS]
    left.bar((x - 0.2).tolist(), rows, width=0.4, color="#9ca3af", label="table row")
    left.bar((x + 0.2).tolist(), outs, width=0.4, color="#2563eb", label="Embeddings output")
    left.axhline(math.sqrt(d / 2), color="#16a34a", lw=2, label="positional encoding √(d/2)")
    left.set_yscale("log")
    left.set_xticks(x.tolist(), ["std 1/√d", "xavier", "std 1"], fontsize=8)
    left.set_ylabel("vector length")
    left.set_title(f"d_model = {d}, vocab 2000", fontsize=9)
    left.legend(fontsize=7, loc="upper left")
    pe = [math.sqrt(dm / 2) for dm in d_models]
    for name, colour in zip(INITS, ("#2563eb", "#d97706", "#dc2626"), strict=True):
        right.plot(d_models, [o / p for (_, o), p in zip(lengths[name], pe, strict=True)], "o-", color=colour,
                   ms=3, label=name)
    right.axhline(1, color="#16a34a", lw=1, ls=":")
    right.axvline(d, color="#111", lw=1)
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("d_model")
    right.set_ylabel("word length / position length")
    right.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return figure_png(fig)


def embedding_scale_explorer(
    embeddings_cls: type | None = None, d_models: tuple[int, ...] = D_MODEL_GRID, live: bool = False
) -> FramePlayer:
    """A d_model slider: how long a word vector is next to its positional encoding, per initialisation.

    Args:
        embeddings_cls: the student's ``Embeddings`` class; ``None`` uses the reference.
        d_models: the slider's values; it starts at 512 when that is one of them.
        live: draw each frame when it is first chosen (running kernel only; see ``FramePlayer``).
    """
    used = resolve_embeddings(embeddings_cls)
    lengths = scale_lengths(used.fn, d_models)
    control = widgets.SelectionSlider(options=list(d_models), value=512 if 512 in d_models else d_models[0],
                                      description="d_model")
    return FramePlayer(control, lambda k: _scale_frame(k, d_models, lengths), len(d_models), header=[used.banner()],
                       live=live)
