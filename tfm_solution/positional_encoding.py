"""Chapter 2 — sinusoidal positional encoding (位置编码).

PE[pos, 2i]   = sin(pos / 10000^(2i / d_model))
PE[pos, 2i+1] = cos(pos / 10000^(2i / d_model))

``i`` indexes dimension *pairs*: pair ``i`` is one sinusoid of angular frequency
``omega_i = 10000^(-2i/d_model)``, written once as a sine and once as a cosine.
"""

from __future__ import annotations

import torch
from torch import nn


def _check_even(d_model: int) -> None:
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model must be a positive even number (sin/cos pairs), got {d_model}")


def pair_frequencies(d_model: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Angular frequency ``omega_i = 10000^(-2i/d_model)`` of each pair ``i``; shape ``(d_model // 2,)``."""
    _check_even(d_model)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    return torch.pow(10000.0, -two_i / d_model).to(dtype)


def positional_encoding(seq_len: int, d_model: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The sinusoid table for positions ``0 .. seq_len-1``; shape ``(seq_len, d_model)``.

    Computed in float64 and cast once, so long tables stay accurate in float32
    (the angle ``pos * omega`` reaches thousands of radians at pos 5000).
    """
    omega = pair_frequencies(d_model)
    angle = torch.arange(seq_len, dtype=torch.float64)[:, None] * omega[None, :]
    pe = torch.empty(seq_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.to(dtype)


def rotation_matrix(k: int, d_model: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The block-diagonal matrix ``R_k`` with ``PE(pos + k) = R_k @ PE(pos)`` for every ``pos``.

    Each pair ``(sin, cos)`` of frequency ``omega`` turns by the angle ``k * omega``::

        [sin((p+k)w)]   [ cos(kw)  sin(kw)] [sin(pw)]
        [cos((p+k)w)] = [-sin(kw)  cos(kw)] [cos(pw)]

    The matrix depends on the offset ``k`` only, never on ``pos``. Shape ``(d_model, d_model)``.
    """
    theta = k * pair_frequencies(d_model)
    c, s = torch.cos(theta), torch.sin(theta)
    r = torch.zeros(d_model, d_model, dtype=torch.float64)
    even = torch.arange(0, d_model, 2)
    r[even, even] = c
    r[even, even + 1] = s
    r[even + 1, even] = -s
    r[even + 1, even + 1] = c
    return r.to(dtype)


class PositionalEncoding(nn.Module):
    """Add the sinusoid table to a batch of embeddings, then apply dropout.

    The table is a buffer named ``pe`` of shape ``(1, max_len, d_model)``: saved in the
    ``state_dict`` and moved by ``.to(device)``, but never trained.

    Shapes:
        x: ``(batch, seq_len, d_model)`` with ``seq_len <= max_len``  ->  same shape.
    """

    def __init__(self, d_model: int, dropout: float, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.register_buffer("pe", positional_encoding(max_len, d_model).unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(1) > self.pe.size(1):
            raise ValueError(f"sequence of length {x.size(1)} exceeds max_len={self.pe.size(1)}")
        return self.dropout(x + self.pe[:, : x.size(1)].to(x.dtype))
