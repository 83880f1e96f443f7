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


def softmax_saturation(query: torch.Tensor, key: torch.Tensor, scaled: bool = True) -> torch.Tensor:
    """The largest attention weight of each query row: how close softmax is to one-hot.

    Dot products of random unit-variance vectors have variance ``d_k``; without the
    ``1/sqrt(d_k)`` factor the scores spread out as ``d_k`` grows, softmax puts almost all
    weight on one key and its gradient vanishes. This number makes that visible.

    Args:
        query: ``(..., len_q, d_k)``.
        key: ``(..., len_k, d_k)``, broadcastable with ``query`` in the leading dimensions.
        scaled: divide the scores by ``sqrt(d_k)`` first, as attention does.

    Returns:
        ``(..., len_q)``: ``softmax(q k^T [/ sqrt(d_k)]).max(-1)``, each value in ``[1/len_k, 1]``.
    """
    if query.dim() < 2 or key.dim() < 2:
        raise ValueError(
            f"query and key need at least 2 dimensions (..., len, d_k); got {tuple(query.shape)} and {tuple(key.shape)}"
        )
    if query.size(-1) != key.size(-1):
        raise ValueError(f"query and key must share d_k (last dimension); got {query.size(-1)} and {key.size(-1)}")
    scores = torch.matmul(query, key.transpose(-2, -1))
    if scaled:
        scores = scores / math.sqrt(query.size(-1))
    return scores.softmax(dim=-1).amax(dim=-1)
