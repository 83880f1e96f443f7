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
