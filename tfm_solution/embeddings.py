"""Chapter 1 — token embeddings (词嵌入): a learned lookup table, scaled by sqrt(d_model)."""

from __future__ import annotations

import math

import torch
from torch import nn


class Embeddings(nn.Module):
    """Map token ids to dense vectors and multiply them by ``sqrt(d_model)``.

    The scale keeps the embeddings on the same footing as the positional encodings
    that are added next (those lie in [-1, 1] in every dimension), and matters when
    the matrix is shared with the output projection (see ``make_model(tie_embeddings=True)``).

    Args:
        d_model: width of each vector.
        vocab: number of distinct token ids.

    Shapes:
        x: ``(batch, seq_len)`` integer ids  ->  ``(batch, seq_len, d_model)``.
    """

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lut(x) * math.sqrt(self.d_model)


def cosine_similarity_matrix(vectors: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Cosine similarity (余弦相似度) of every pair of rows: ``cos(a, b) = a·b / (|a| |b|)``.

    Each row is divided by its length, clamped below at ``eps`` so that a zero vector has
    similarity 0 with everything (instead of 0/0 = NaN); the matrix of dot products of the
    unit rows follows.

    Shapes:
        vectors: ``(..., n, d)``  ->  ``(..., n, n)``, symmetric, entries in [-1, 1],
        1 on the diagonal for every nonzero row.
    """
    if vectors.dim() < 2:
        raise ValueError(f"vectors must have at least 2 dimensions (..., n, d), got shape {tuple(vectors.shape)}")
    if not vectors.is_floating_point():
        raise TypeError(f"vectors must be a floating-point tensor, got {vectors.dtype}")
    unit = vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(eps)
    return unit @ unit.transpose(-2, -1)
