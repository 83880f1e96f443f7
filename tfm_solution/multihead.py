"""Chapter 5 — multi-head attention (多头注意力)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .attention import attention, mask_fill_value
from .cloning import clones

AttentionKernel = Literal["matmul", "sdpa"]


def sdpa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
) -> torch.Tensor:
    """Same contract as ``attention`` (minus the weights), through PyTorch's fused kernel.

    The boolean mask becomes an additive one filled with the dtype's finite minimum,
    so a fully masked row gives the same uniform weights as the matmul path, never NaN.

    Shapes: query ``(b, h, len_q, d_k)``, key/value ``(b, h, len_k, d_k)``,
    mask broadcastable to ``(b, h, len_q, len_k)``  ->  ``(b, h, len_q, d_k)``.
    """
    attn_mask = None
    if mask is not None:
        attn_mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
        attn_mask = attn_mask.masked_fill(mask == 0, mask_fill_value(query.dtype))
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p)


def split_heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """Cut the last axis into ``h`` heads and move the head axis in front of the positions.

    Head ``i`` gets the contiguous block of features ``i * d_k : (i + 1) * d_k``, with
    ``d_k = d_model / h``. ``view`` regroups the features of each position (it needs no copy);
    ``transpose(1, 2)`` then puts the heads before the positions, so that one batched matmul
    computes every head's attention.

    Shapes: ``(batch, len, d_model) -> (batch, h, len, d_k)``, a view of ``x`` (no copy).
    """
    if x.size(-1) % h:
        raise ValueError(f"d_model={x.size(-1)} is not divisible by h={h}")
    return x.view(x.size(0), -1, h, x.size(-1) // h).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Undo ``split_heads``: put the positions back in front and concatenate the heads in order.

    After ``transpose(1, 2)`` the tensor is no longer laid out row by row in memory, and ``view``
    refuses to regroup it; ``contiguous()`` copies it into that layout first.

    Shapes: ``(batch, h, len, d_k) -> (batch, len, h * d_k)``.
    """
    return x.transpose(1, 2).contiguous().view(x.size(0), -1, x.size(1) * x.size(3))


class MultiHeadedAttention(nn.Module):
    """``h`` attention heads of width ``d_k = d_model / h`` computed in parallel.

    ``linears[0..2]`` project query, key and value (all heads at once); ``linears[3]``
    is the output projection W^O applied to the concatenated heads.

    Args:
        h: number of heads.
        d_model: model width, divisible by ``h``.
        dropout: dropout on the attention weights.
        kernel: ``"matmul"`` (the explicit softmax path; keeps the weights in ``self.attn``
            for visualisation) or ``"sdpa"`` (``F.scaled_dot_product_attention``; ``self.attn``
            stays None).

    Shapes:
        query ``(batch, len_q, d_model)``, key/value ``(batch, len_k, d_model)``,
        mask ``(batch, 1 or len_q, len_k)``  ->  ``(batch, len_q, d_model)``.
    """

    def __init__(self, h: int, d_model: int, dropout: float = 0.1, kernel: AttentionKernel = "matmul") -> None:
        super().__init__()
        if d_model % h:
            raise ValueError(f"d_model={d_model} is not divisible by h={h}")
        if kernel not in ("matmul", "sdpa"):
            raise ValueError(f"kernel must be 'matmul' or 'sdpa', got {kernel!r}")
        self.d_k = d_model // h
        self.h = h
        self.kernel = kernel
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn: torch.Tensor | None = None
        self.dropout = nn.Dropout(p=dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, len, d_model) -> (batch, h, len, d_k)``; see the module function ``split_heads``."""
        return split_heads(x, self.h)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, h, len, d_k) -> (batch, len, d_model)``; see the module function ``merge_heads``."""
        return merge_heads(x)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if mask is not None:
            mask = mask.unsqueeze(1)  # one mask for all heads
        query, key, value = (self.split_heads(lin(x)) for lin, x in zip(self.linears, (query, key, value)))
        x = self.attend(query, key, value, mask)
        return self.linears[-1](self.merge_heads(x))

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention over already split heads with the configured kernel; ``(b, h, len_q, d_k)``."""
        if self.kernel == "sdpa":
            self.attn = None
            p = self.dropout.p if self.training else 0.0
            return sdpa_attention(query, key, value, mask, p)
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        return x
