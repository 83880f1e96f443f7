"""A fast forward pass over the model's own parameters: for training, and for encoding at inference.

It computes what ``EncoderDecoder.forward`` computes, dropout included, with fewer and larger kernels:

* the query, key and value projections of each self-attention run as one matrix product, with the
  three ``nn.Linear`` weights concatenated (``torch.cat`` keeps the gradient flowing back to each);
* the cross-attention keys and values of *all* decoder layers are one product over the encoder
  memory, which every layer reads unchanged;
* each boolean mask becomes an additive one once per pass, not once per attention call;
* attention is ``F.scaled_dot_product_attention``; LayerNorm goes through ``fast.layer_norm``.

Dropout sites, shapes and their order are the model's, so with the same seed the same units are
dropped and training gives the same numbers. Gradients land in the model's parameters
(``state_dict`` keys unchanged): ``run_epoch(batches, FastTraining(model), ...)`` trains ``model``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import mask_fill_value
from ..encoder_decoder import EncoderDecoder
from ..multihead import MultiHeadedAttention
from ..norm import SublayerConnection
from .layer_norm import apply_norm, layer_norm


class Projection(NamedTuple):
    """Several ``nn.Linear`` over the same input as one: weight ``(sum of outs, in)``, bias ``(sum of outs,)``."""

    weight: torch.Tensor
    bias: torch.Tensor


def fuse(linears: Sequence[nn.Linear]) -> Projection:
    """Concatenate the weights and biases of ``linears`` along their output axis (differentiable)."""
    return Projection(torch.cat([lin.weight for lin in linears]), torch.cat([lin.bias for lin in linears]))


class FusedWeights(NamedTuple):
    """The concatenated projections a pass needs: each encoder and decoder self-attention's Q/K/V,
    and every decoder layer's cross-attention K/V in one product (layer after layer, K then V)."""

    encoder_qkv: list[Projection]
    decoder_qkv: list[Projection]
    cross_kv: Projection


def fused_weights(model: EncoderDecoder) -> FusedWeights:
    """Build ``FusedWeights`` from the model's ``linears`` (fresh tensors, differentiable)."""
    return FusedWeights(
        [fuse(layer.self_attn.linears[:3]) for layer in model.encoder.layers],
        [fuse(layer.self_attn.linears[:3]) for layer in model.decoder.layers],
        fuse([lin for layer in model.decoder.layers for lin in layer.src_attn.linears[1:3]]),
    )


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean ``(batch, rows, keys)`` mask -> additive ``(batch, 1, rows, keys)``: 0 where it may
    attend, the dtype's finite minimum where not (as the model's ``sdpa_attention`` builds it)."""
    zeros = torch.zeros(mask.unsqueeze(1).shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(mask.unsqueeze(1) == 0, mask_fill_value(dtype))


class _Masks:
    """A pass's masks, each made additive once per activation dtype (autocast may change it)."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask
        self.by_dtype: dict[torch.dtype, torch.Tensor] = {}

    def get(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self.by_dtype:
            self.by_dtype[dtype] = additive_mask(self.mask, dtype)
        return self.by_dtype[dtype]


def _heads(x: torch.Tensor, parts: int, h: int) -> torch.Tensor:
    """``(batch, len, parts * d_model) -> (parts, batch, h, len, d_k)``, a view."""
    b, n, width = x.shape
    return x.view(b, n, parts, h, width // (parts * h)).permute(2, 0, 3, 1, 4)


def _attend(attn: MultiHeadedAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            mask: _Masks) -> torch.Tensor:
    """sdpa over split heads, then W^O: ``(b, h, len_q, d_k) -> (b, len_q, d_model)``."""
    p = attn.dropout.p if attn.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.get(q.dtype), dropout_p=p)
    lin = attn.linears[3]
    return F.linear(out.transpose(1, 2).flatten(2), lin.weight, lin.bias)


def self_attention(x: torch.Tensor, attn: MultiHeadedAttention, qkv: Projection, mask: _Masks) -> torch.Tensor:
    """Multi-head self-attention of ``x`` ``(batch, len, d_model)`` with one fused Q/K/V product."""
    q, k, v = _heads(F.linear(x, qkv.weight, qkv.bias), 3, attn.h)
    return _attend(attn, q, k, v, mask)


def _sublayer(conn: SublayerConnection, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``SublayerConnection.forward`` with the fast LayerNorm."""
    if conn.norm_position == "post":
        return layer_norm(x + conn.dropout(fn(x)), conn.norm)
    return x + conn.dropout(fn(layer_norm(x, conn.norm)))


def encode(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor,
           qkv: Sequence[Projection] | None = None) -> torch.Tensor:
    """``model.encode`` over fused projections: ``(batch, src_len)`` ids -> memory ``(batch, src_len, d_model)``.

    ``qkv``: each encoder layer's fused Q/K/V projection; built from the parameters when omitted.
    """
    qkv = qkv if qkv is not None else [fuse(layer.self_attn.linears[:3]) for layer in model.encoder.layers]
    mask = _Masks(src_mask)
    x = model.src_embed(src)
    for layer, proj in zip(model.encoder.layers, qkv):
        x = _sublayer(layer.sublayer[0], x, lambda y: self_attention(y, layer.self_attn, proj, mask))
        x = _sublayer(layer.sublayer[1], x, layer.feed_forward)
    return apply_norm(x, model.encoder.norm)


def decode(model: EncoderDecoder, memory: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor,
           tgt_mask: torch.Tensor, weights: FusedWeights) -> torch.Tensor:
    """``model.decode`` over fused projections: target ids ``(batch, tgt_len)`` -> ``(batch, tgt_len, d_model)``."""
    layers = model.decoder.layers
    cross = _heads(F.linear(memory, weights.cross_kv.weight, weights.cross_kv.bias), 2 * len(layers),
                   layers[0].src_attn.h)
    self_mask, src = _Masks(tgt_mask), _Masks(src_mask)
    x = model.tgt_embed(tgt)
    for i, (layer, proj) in enumerate(zip(layers, weights.decoder_qkv)):
        attn = layer.src_attn

        def cross_attention(y: torch.Tensor) -> torch.Tensor:
            q = _heads(F.linear(y, attn.linears[0].weight, attn.linears[0].bias), 1, attn.h)[0]
            return _attend(attn, q, cross[2 * i], cross[2 * i + 1], src)

        x = _sublayer(layer.sublayer[0], x, lambda y: self_attention(y, layer.self_attn, proj, self_mask))
        x = _sublayer(layer.sublayer[1], x, cross_attention)
        x = _sublayer(layer.sublayer[2], x, layer.feed_forward)
    return apply_norm(x, model.decoder.norm)


def fast_forward(model: EncoderDecoder, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor,
                 tgt_mask: torch.Tensor) -> torch.Tensor:
    """``model(src, tgt, src_mask, tgt_mask)``, same numbers, fused: decoder states ``(batch, tgt_len, d_model)``."""
    weights = fused_weights(model)
    return decode(model, encode(model, src, src_mask, weights.encoder_qkv), src_mask, tgt, tgt_mask, weights)


class FastTraining(nn.Module):
    """The model behind the fast forward pass, for ``run_epoch`` and DDP: ``FastTraining(model)``
    has exactly ``model``'s parameters, and its ``forward`` is ``fast_forward(model, ...)``.

    ``run_epoch(batches, FastTraining(model), SimpleLossCompute(model.generator, criterion), ...)``
    trains ``model`` itself; save ``model`` (the wrapper's ``state_dict`` keys gain ``model.``).
    """

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        return fast_forward(self.model, src, tgt, src_mask, tgt_mask)
