"""Chapter 11 — the encoder–decoder KV cache (KV 缓存).

At decoding step ``t`` the uncached decoder re-embeds and re-projects the whole prefix
``y_0 .. y_t``, although the keys and values of ``y_0 .. y_{t-1}`` did not change. The
cache keeps, per decoder layer,

* the **self-attention** keys and values of every token decoded so far, grown by one
  position per step (``torch.cat`` along the length axis, or written into a buffer
  preallocated for the whole output), and
* the **cross-attention** (source attention) keys and values, projected from the encoder
  memory *once* before the first step: the memory never changes while decoding.

A step then feeds only the newest token: one query row per layer instead of ``t + 1``.
No causal mask is needed, since the cache holds no future positions. ``cached_self_attention``
(and the module ``CachedSelfAttention``) is that step for one layer as a plain function;
``decode_step`` runs it through the whole decoder.

The notes' memory formula counts K *or* V; both are stored, so the self-attention cache of
a whole decoder holds ``2 * batch * layers * heads * length * head_dim`` numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .encoder_decoder import DecoderLayer, EncoderDecoder
from .multihead import MultiHeadedAttention


def kv_cache_bytes(
    batch: int, layers: int, heads: int, head_dim: int, length: int, dtype: torch.dtype | float, src_len: int = 0
) -> int:
    """Bytes held by a decoder's KV cache.

    Self-attention: K and V of ``length`` target positions; cross-attention: K and V of
    ``src_len`` source positions; each a ``(batch, heads, positions, head_dim)`` tensor per layer.
    ``heads`` counts the key/value heads (``h`` for multi-head attention, ``h / group`` for
    grouped-query attention, 1 for multi-query attention). ``dtype`` is a torch dtype or the
    bytes one number takes (2 for float16, 0.5 for a 4-bit format).
    """
    itemsize = dtype if isinstance(dtype, int | float) else torch.empty((), dtype=dtype).element_size()
    return round(2 * batch * layers * heads * head_dim * (length + src_len) * itemsize)


@dataclass
class LayerCache:
    """One decoder layer's cached projections, each ``(batch, heads, positions, d_k)``.

    ``cross_k``/``cross_v`` are projected once from the encoder memory. ``self_k``/``self_v``
    grow by one position per step: by concatenation (``capacity=None``, the notes' formula), or
    written into buffers of ``capacity`` positions allocated at the first step, of which the
    first ``length`` are filled (the notes' preallocation with a length pointer).
    """

    cross_k: torch.Tensor | None = None
    cross_v: torch.Tensor | None = None
    self_k: torch.Tensor | None = None
    self_v: torch.Tensor | None = None
    capacity: int | None = None
    length: int = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new positions' ``k``, ``v`` ``(batch, heads, new, d_k)``; return all keys and values so far."""
        new = k.size(2)
        if self.capacity is None:
            self.self_k = k if self.self_k is None else torch.cat([self.self_k, k], dim=2)
            self.self_v = v if self.self_v is None else torch.cat([self.self_v, v], dim=2)
            self.length += new
            return self.self_k, self.self_v
        if self.self_k is None:
            shape = (k.size(0), k.size(1), self.capacity, k.size(3))
            self.self_k, self.self_v = k.new_empty(shape), v.new_empty(shape)
        if self.length + new > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; position {self.length + new} does not fit")
        self.self_k[:, :, self.length: self.length + new] = k
        self.self_v[:, :, self.length: self.length + new] = v
        self.length += new
        return self.self_k[:, :, : self.length], self.self_v[:, :, : self.length]

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
    def from_memory(cls, model: EncoderDecoder, memory: torch.Tensor, capacity: int | None = None) -> "KVCache":
        """Project the encoder memory ``(batch, src_len, d_model)`` to every layer's cross K/V once.

        ``capacity``: preallocate room for that many target positions (else grow by concatenation).
        """
        layers = []
        for layer in model.decoder.layers:
            attn: MultiHeadedAttention = layer.src_attn
            k = attn.split_heads(attn.linears[1](memory))
            v = attn.split_heads(attn.linears[2](memory))
            layers.append(LayerCache(cross_k=k, cross_v=v, capacity=capacity))
        return cls(layers)

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (1-D, may repeat): how beams follow their parents."""
        for lc in self.layers:
            lc.cross_k, lc.cross_v = lc.cross_k.index_select(0, index), lc.cross_v.index_select(0, index)
            if lc.self_k is not None:
                lc.self_k, lc.self_v = lc.self_k.index_select(0, index), lc.self_v.index_select(0, index)

    def nbytes(self) -> int:
        """Bytes of every tensor the cache holds right now (whole buffers when preallocated)."""
        return sum(t.numel() * t.element_size() for lc in self.layers for t in lc.tensors())


def _self_attention_step(attn: MultiHeadedAttention, x: torch.Tensor, lc: LayerCache) -> torch.Tensor:
    """The newest position ``x`` ``(batch, 1, d_model)`` attends to every cached position and itself.

    Its key and value join the cache *before* attending: the query must see its own position,
    as row ``t`` of the causal mask does. No mask is needed, the cache holds no future.
    """
    q, k, v = (attn.split_heads(lin(x)) for lin in attn.linears[:3])
    keys, values = lc.append(k, v)
    return attn.linears[-1](attn.merge_heads(attn.attend(q, keys, values, None)))


def cached_self_attention(
    attn: MultiHeadedAttention, x: torch.Tensor, past_k: torch.Tensor | None = None,
    past_v: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of cached self-attention with ``attn``'s weights, as a plain function.

    Shapes: x ``(batch, 1, d_model)`` (the newest position), past_k/past_v ``(batch, h, t, d_k)``
    or None (the first step)  ->  ``(out, k, v)``: out ``(batch, 1, d_model)``, equal to the last
    row of ``attn(y, y, y, causal_mask)`` over the whole prefix ``y``; k, v ``(batch, h, t + 1, d_k)``,
    the cache with the new position appended.
    """
    lc = LayerCache(self_k=past_k, self_v=past_v, length=0 if past_k is None else past_k.size(2))
    out = _self_attention_step(attn, x, lc)
    return out, lc.self_k, lc.self_v


class CachedSelfAttention(MultiHeadedAttention):
    """``MultiHeadedAttention`` called one new position at a time with its cache.

    ``forward(x, past_k=None, past_v=None) -> (out, k, v)`` as ``cached_self_attention``.
    """

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, past_k: torch.Tensor | None = None, past_v: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return cached_self_attention(self, x, past_k, past_v)


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
    x = layer.sublayer[0](x, lambda y: _self_attention_step(layer.self_attn, y, lc))
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
