"""Chapter 3 — scaled dot-product attention (缩放点积注意力).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
"""

from __future__ import annotations

import math

import torch
from torch import nn


def mask_fill_value(dtype: torch.dtype) -> float:
    """The most negative finite number of ``dtype``.

    The notes fill masked scores with ``-1e9``: that overflows float16 (its range ends
    at -65504), and ``-inf`` would turn a fully masked row into NaN (``exp(-inf - -inf)``).
    The finite minimum does neither: masked weights underflow to exactly 0, and a row
    with every key masked becomes uniform instead of NaN.
    """
    return torch.finfo(dtype).min


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention.

    Args:
        query: ``(..., len_q, d_k)``.
        key: ``(..., len_k, d_k)``.
        value: ``(..., len_k, d_v)``.
        mask: broadcastable to ``(..., len_q, len_k)``; nonzero/True = may attend, 0/False = hidden.
        dropout: applied to the attention weights (training only, as ``nn.Dropout`` does).

    Returns:
        ``(output, p_attn)``: output ``(..., len_q, d_v)``; weights ``(..., len_q, len_k)``,
        each row a probability distribution over the keys.
    """
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, mask_fill_value(scores.dtype))
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn
