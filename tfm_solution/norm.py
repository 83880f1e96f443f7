"""Chapter 7 — Add & Norm: layer normalization (层归一化) and the residual sublayer connection (残差连接)."""

from __future__ import annotations

from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

LayerNormKind = Literal["notes", "torch"]
NormPosition = Literal["pre", "post"]


class LayerNorm(nn.Module):
    """Normalise each position's feature vector, then scale by ``a_2`` and shift by ``b_2``.

    Two flavours share the parameter names (so checkpoints move between them):

    * ``"notes"``: ``a_2 * (x - mean) / (std + eps) + b_2`` with the *unbiased* standard
      deviation (divides by ``d - 1``) and ``eps`` outside the square root; default eps 1e-6.
    * ``"torch"``: ``nn.LayerNorm``'s ``(x - mean) / sqrt(var + eps)`` with the biased
      variance (divides by ``d``); default eps 1e-5.

    Shapes: ``(..., features) -> (..., features)``.
    """

    def __init__(self, features: int, eps: float | None = None, kind: LayerNormKind = "notes") -> None:
        super().__init__()
        if kind not in ("notes", "torch"):
            raise ValueError(f"kind must be 'notes' or 'torch', got {kind!r}")
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.kind = kind
        self.eps = eps if eps is not None else (1e-6 if kind == "notes" else 1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "torch":
            return F.layer_norm(x, (x.size(-1),), self.a_2, self.b_2, self.eps)
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    """A residual connection around ``sublayer`` with layer normalization and dropout.

    * ``"pre"`` (the notes' code, Pre-LN):   ``x + dropout(sublayer(norm(x)))``
    * ``"post"`` (the paper, Post-LN):       ``norm(x + dropout(sublayer(x)))``

    The notes' docstring describes Post-LN while their code computes Pre-LN; both are here.

    Shapes: ``(batch, seq_len, size) -> (batch, seq_len, size)``.
    """

    def __init__(
        self,
        size: int,
        dropout: float,
        norm_position: NormPosition = "pre",
        layer_norm: LayerNormKind = "notes",
    ) -> None:
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        self.norm = LayerNorm(size, kind=layer_norm)
        self.dropout = nn.Dropout(dropout)
        self.norm_position = norm_position

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.norm_position == "post":
            return self.norm(x + self.dropout(sublayer(x)))
        return x + self.dropout(sublayer(self.norm(x)))
