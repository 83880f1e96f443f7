"""Chapter 6 — the position-wise feed-forward network (逐位置前馈网络).

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2
"""

from __future__ import annotations

import torch
from torch import nn


class PositionwiseFeedForward(nn.Module):
    """Two linear maps with a ReLU between them, applied to every position independently.

    Shapes: ``(batch, seq_len, d_model) -> (batch, seq_len, d_ff) -> (batch, seq_len, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.w_1(x).relu()))
