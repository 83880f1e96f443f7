"""Chapter 6 — the position-wise feed-forward network (按位置前馈网络).

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2

Also the same function written as two kernel-size-1 convolutions, and the GELU activation
that later Transformers use instead of the ReLU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class PositionwiseFeedForward(nn.Module):
    """Two linear maps with a ReLU between them, applied to every position independently.

    Dropout acts on the hidden activations, after the ReLU and before ``w_2``, as in the notes.

    Shapes: ``(batch, seq_len, d_model) -> (batch, seq_len, d_ff) -> (batch, seq_len, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.w_1(x).relu()))


def conv1d_feed_forward(
    x: torch.Tensor, w_1: torch.Tensor, b_1: torch.Tensor, w_2: torch.Tensor, b_2: torch.Tensor
) -> torch.Tensor:
    """The feed-forward network (without dropout) computed by two convolutions of kernel size 1.

    A ``Conv1d`` slides over the *last* axis and mixes the channels of the axis before it, so
    the positions must become that last axis: ``transpose(1, 2)``, not a ``view``, which would
    reinterpret the numbers instead of moving them. A kernel of size 1 sees one position at a
    time, and its ``(out, in, 1)`` weight is the ``(out, in)`` weight of ``nn.Linear``.

    Args:
        x: ``(batch, seq_len, d_model)``.
        w_1, b_1: ``(d_ff, d_model)`` and ``(d_ff,)``, the first layer in ``nn.Linear`` layout.
        w_2, b_2: ``(d_model, d_ff)`` and ``(d_model,)``, the second layer.

    Returns:
        ``(batch, seq_len, d_model)``, equal to ``w_2(relu(w_1(x)))``.
    """
    channels = x.transpose(1, 2)  # (batch, d_model, seq_len): channels before positions
    hidden = F.conv1d(channels, w_1.unsqueeze(-1), b_1).relu()  # (batch, d_ff, seq_len)
    return F.conv1d(hidden, w_2.unsqueeze(-1), b_2).transpose(1, 2)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The Gaussian error linear unit, ``x * Phi(x)`` with ``Phi`` the standard normal CDF.

    ``Phi(x) = (1 + erf(x / sqrt(2))) / 2``: the input is kept in proportion to how likely a
    standard normal variable is to fall below it, a smooth version of the ReLU's 0-or-1 gate.

    Shapes: any; elementwise, same shape and dtype.
    """
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
