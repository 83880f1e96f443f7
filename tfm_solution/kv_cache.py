"""Chapter 11 — the encoder–decoder KV cache (KV 缓存).

At decoding step ``t`` the uncached decoder re-embeds and re-projects the whole prefix
``y_0 .. y_t``, although the keys and values of ``y_0 .. y_{t-1}`` did not change. The
cache keeps, per decoder layer,

* the **self-attention** keys and values of every token decoded so far, grown by one
  position per step (``torch.cat`` along the length axis), and
* the **cross-attention** (source attention) keys and values, projected from the encoder
  memory *once* before the first step: the memory never changes while decoding.

A step then feeds only the newest token: one query row per layer instead of ``t + 1``.
No causal mask is needed, since the cache holds no future positions.

The notes' memory formula counts K *or* V; both are stored, so the self-attention cache of
a whole decoder holds ``2 * batch * layers * heads * length * head_dim`` numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .encoder_decoder import DecoderLayer, EncoderDecoder
from .multihead import MultiHeadedAttention


def kv_cache_bytes(
    batch: int, layers: int, heads: int, head_dim: int, length: int, dtype: torch.dtype, src_len: int = 0
) -> int:
    """Bytes held by a decoder's KV cache.

    Self-attention: K and V of ``length`` target positions; cross-attention: K and V of
    ``src_len`` source positions; each a ``(batch, heads, positions, head_dim)`` tensor per layer.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * batch * layers * heads * head_dim * (length + src_len) * itemsize


@dataclass
class LayerCache:
    """One decoder layer's cached projections, each ``(batch, heads, positions, d_k)``."""

    cross_k: torch.Tensor
    cross_v: torch.Tensor
    self_k: torch.Tensor | None = None
    self_v: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.self_k, self.self_v, self.cross_k, self.cross_v) if t is not None]


class KVCache:
    """The cache of a whole decoder: one ``LayerCache`` per layer plus the decoded length.

    Build it with ``KVCache.from_memory(model, memory)``; ``decode_step`` fills it.
    """

    def __init__(self, layers: list[LayerCache]) -> None:
        self.layers = layers
        self.length = 0

    @classmethod
    def from_memory(cls, model: EncoderDecoder, memory: torch.Tensor) -> "KVCache":
        """Project the encoder memory ``(batch, src_len, d_model)`` to every layer's cross K/V once."""
        layers = []
        for layer in model.decoder.layers:
            attn: MultiHeadedAttention = layer.src_attn
            k = attn.split_heads(attn.linears[1](memory))
            v = attn.split_heads(attn.linears[2](memory))
            layers.append(LayerCache(cross_k=k, cross_v=v))
        return cls(layers)

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (1-D, may repeat): how beams follow their parents."""
        for lc in self.layers:
            lc.cross_k, lc.cross_v = lc.cross_k.index_select(0, index), lc.cross_v.index_select(0, index)
            if lc.self_k is not None:
                lc.self_k, lc.self_v = lc.self_k.index_select(0, index), lc.self_v.index_select(0, index)

    def nbytes(self) -> int:
        """Bytes of every tensor the cache holds right now."""
        return sum(t.numel() * t.element_size() for lc in self.layers for t in lc.tensors())


def _cached_self_attention(attn: MultiHeadedAttention, x: torch.Tensor, lc: LayerCache) -> torch.Tensor:
    """Attend from the newest position ``x`` ``(batch, 1, d_model)`` to all cached positions and itself."""
    q, k, v = (attn.split_heads(lin(x)) for lin in attn.linears[:3])
    lc.self_k = k if lc.self_k is None else torch.cat([lc.self_k, k], dim=2)
    lc.self_v = v if lc.self_v is None else torch.cat([lc.self_v, v], dim=2)
    return attn.linears[-1](attn.merge_heads(attn.attend(q, lc.self_k, lc.self_v, None)))


def _cached_cross_attention(
    attn: MultiHeadedAttention, x: torch.Tensor, lc: LayerCache, src_mask: torch.Tensor
) -> torch.Tensor:
    q = attn.split_heads(attn.linears[0](x))
    out = attn.attend(q, lc.cross_k, lc.cross_v, src_mask.unsqueeze(1))
    return attn.linears[-1](attn.merge_heads(out))


def _layer_step(
    layer: DecoderLayer, x: torch.Tensor, lc: LayerCache, src_mask: torch.Tensor
) -> torch.Tensor:
    # The same residual/norm wrappers as DecoderLayer.forward, with cached attention inside.
    x = layer.sublayer[0](x, lambda y: _cached_self_attention(layer.self_attn, y, lc))
    x = layer.sublayer[1](x, lambda y: _cached_cross_attention(layer.src_attn, y, lc, src_mask))
    return layer.sublayer[2](x, layer.feed_forward)


def decode_step(
    model: EncoderDecoder, token: torch.Tensor, src_mask: torch.Tensor, cache: KVCache
) -> torch.Tensor:
    """Decode one new position with the cache; the cache grows by one.

    Args:
        token: ``(batch, 1)`` ids of the newest target token, at position ``cache.length``.
        src_mask: ``(batch, 1, src_len)`` source padding mask.

    Returns:
        the decoder state of that position, ``(batch, 1, d_model)`` (apply ``model.generator``).
    """
    embed, position = model.tgt_embed[0], model.tgt_embed[1]
    pos = cache.length
    if pos >= position.pe.size(1):
        raise ValueError(f"position {pos} exceeds the positional table (max_len={position.pe.size(1)})")
    x = embed(token)
    x = position.dropout(x + position.pe[:, pos : pos + 1].to(x.dtype))
    for layer, lc in zip(model.decoder.layers, cache.layers):
        x = _layer_step(layer, x, lc, src_mask)
    cache.length += 1
    return model.decoder.norm(x)
