"""Chapter 1's demo of the distributional hypothesis (分布假说): words met in the same contexts
end up with similar vectors.

A toy corpus of short Chinese sentences about fruit and vehicles trains an embedding table
skip-gram style: each word's vector must predict the words around it. Fruit words share
their contexts (吃 "eat", 甜 "sweet", the measure word 一个) and vehicle words share theirs
(开 "drive", 快 "fast", 一辆), so training pulls each group together. Seconds on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .embeddings import Embeddings

FRUITS = ("苹果", "香蕉", "橘子")
VEHICLES = ("汽车", "卡车", "公交车")

#: Sentence templates; ``{}`` is filled with every word of the group in turn.
FRUIT_TEMPLATES = ("我 吃 了 一个 {}", "我 买 了 一个 {}", "这个 {} 很 甜")
VEHICLE_TEMPLATES = ("我 开 了 一辆 {}", "我 买 了 一辆 {}", "这辆 {} 很 快")

#: English glosses, used for labels (a plot needs no CJK font then).
GLOSSES = {
    "我": "I", "吃": "eat", "开": "drive", "买": "buy", "了": "(past)", "一个": "a (个)", "一辆": "a (辆)",
    "这个": "this (个)", "这辆": "this (辆)", "很": "very", "甜": "sweet", "快": "fast",
    "苹果": "apple", "香蕉": "banana", "橘子": "orange", "汽车": "car", "卡车": "truck", "公交车": "bus",
}  # fmt: skip

#: Training steps at which the table is recorded by default.
SNAPSHOT_STEPS = (0, 5, 10, 20, 40, 80, 150, 250)


def toy_corpus() -> list[list[str]]:
    """The 18 tokenised sentences: every template with every word of its group."""
    sentences = [t.format(w).split() for t in FRUIT_TEMPLATES for w in FRUITS]
    return sentences + [t.format(w).split() for t in VEHICLE_TEMPLATES for w in VEHICLES]


def group_of(word: str) -> str:
    """``"fruit"``, ``"vehicle"`` or ``"other"``."""
    return "fruit" if word in FRUITS else "vehicle" if word in VEHICLES else "other"


def skipgram_pairs(sentences: list[list[str]], vocab: list[str], window: int = 2) -> torch.Tensor:
    """Every (centre, context) id pair within ``window`` words: ``(n_pairs, 2)`` int64."""
    index = {w: i for i, w in enumerate(vocab)}
    pairs = [
        (index[s[i]], index[s[j]])
        for s in sentences
        for i in range(len(s))
        for j in range(max(0, i - window), min(len(s), i + window + 1))
        if j != i
    ]
    return torch.tensor(pairs, dtype=torch.int64)


@dataclass
class WordVectorRun:
    """A recorded training run.

    Attributes:
        vocab: the words, in id order.
        steps: the steps at which the table was recorded.
        snapshots: one ``(len(vocab), d_model)`` tensor per entry of ``steps``: the output of
            the embedding module for every id (so the ``sqrt(d_model)`` scale is included).
        losses: the training loss at every step, ``(n_steps,)``.
    """

    vocab: list[str]
    steps: tuple[int, ...]
    snapshots: list[torch.Tensor]
    losses: torch.Tensor

    def vectors(self, step: int | None = None) -> torch.Tensor:
        """The table at ``step`` (default: the last recorded one)."""
        return self.snapshots[-1 if step is None else self.steps.index(step)]


def train_word_vectors(
    d_model: int = 8,
    steps: tuple[int, ...] = SNAPSHOT_STEPS,
    lr: float = 0.02,
    seed: int = 0,
    embeddings_cls: type[nn.Module] = Embeddings,
) -> WordVectorRun:
    """Train word vectors on ``toy_corpus()`` with full-batch Adam; record the table at ``steps``.

    Each centre word's vector goes through a linear layer to logits over the vocabulary, and
    the loss is the cross-entropy of its actual neighbours (skip-gram). ``embeddings_cls`` is
    built as ``embeddings_cls(d_model, vocab_size)`` (the chapter's exercise fits).
    """
    if not steps or list(steps) != sorted(set(steps)) or steps[0] < 0:
        raise ValueError(f"steps must be distinct, increasing and >= 0, got {steps}")
    sentences = toy_corpus()
    vocab = sorted({w for s in sentences for w in s}, key=lambda w: (group_of(w), w))
    pairs = skipgram_pairs(sentences, vocab)
    torch.manual_seed(seed)
    embed = embeddings_cls(d_model, len(vocab))
    # Small start: the table begins as noise, and sqrt(d_model) brings it back to unit scale.
    nn.init.normal_(embed.lut.weight, std=d_model**-0.5)
    out = nn.Linear(d_model, len(vocab))
    optimizer = torch.optim.Adam([*embed.parameters(), *out.parameters()], lr=lr)
    ids = torch.arange(len(vocab))
    snapshots, losses = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tensors this small only lose time to thread start-up, badly so on a busy machine
    try:
        for step in range(steps[-1] + 1):
            if step in steps:
                with torch.no_grad():
                    snapshots.append(embed(ids).detach().clone())
            loss = nn.functional.cross_entropy(out(embed(pairs[:, 0])), pairs[:, 1])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return WordVectorRun(vocab, tuple(steps), snapshots, torch.tensor(losses))


def group_similarity(run: WordVectorRun, similarity: torch.Tensor) -> dict[str, float]:
    """Mean cosine similarity within the fruit words, within the vehicles, and across the two.

    ``similarity`` is the ``(V, V)`` cosine matrix of one snapshot of ``run``.
    """
    fruit = [run.vocab.index(w) for w in FRUITS]
    vehicle = [run.vocab.index(w) for w in VEHICLES]

    def mean_off_diagonal(rows: list[int], cols: list[int]) -> float:
        block = similarity[rows][:, cols]
        if rows == cols:
            n = len(rows)
            return float((block.sum() - block.diagonal().sum()) / (n * n - n))
        return float(block.mean())

    return {
        "fruit-fruit": mean_off_diagonal(fruit, fruit),
        "vehicle-vehicle": mean_off_diagonal(vehicle, vehicle),
        "fruit-vehicle": mean_off_diagonal(fruit, vehicle),
    }
