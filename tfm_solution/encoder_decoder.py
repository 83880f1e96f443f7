"""Chapter 8 — encoder and decoder stacks (编码器 / 解码器), the generator and ``make_model``."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.functional import log_softmax

from .cloning import clones
from .embeddings import Embeddings
from .feed_forward import PositionwiseFeedForward
from .multihead import AttentionKernel, MultiHeadedAttention
from .norm import LayerNorm, LayerNormKind, NormPosition, SublayerConnection
from .positional_encoding import PositionalEncoding


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in a ``SublayerConnection``.

    Shapes: x ``(batch, src_len, size)``, mask ``(batch, 1, src_len)``  ->  ``(batch, src_len, size)``.
    """

    def __init__(
        self,
        size: int,
        self_attn: MultiHeadedAttention,
        feed_forward: PositionwiseFeedForward,
        dropout: float,
        norm_position: NormPosition = "pre",
        layer_norm: LayerNormKind = "notes",
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_position, layer_norm), 2)
        self.size = size

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, source (cross) attention over the encoder memory, feed-forward.

    Shapes: x ``(batch, tgt_len, size)``, memory ``(batch, src_len, size)``,
    src_mask ``(batch, 1, src_len)``, tgt_mask ``(batch, tgt_len, tgt_len)``
    ->  ``(batch, tgt_len, size)``.
    """

    def __init__(
        self,
        size: int,
        self_attn: MultiHeadedAttention,
        src_attn: MultiHeadedAttention,
        feed_forward: PositionwiseFeedForward,
        dropout: float,
        norm_position: NormPosition = "pre",
        layer_norm: LayerNormKind = "notes",
    ) -> None:
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_position, layer_norm), 3)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        m = memory
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.sublayer[1](x, lambda y: self.src_attn(y, m, m, src_mask))
        return self.sublayer[2](x, self.feed_forward)


def _final_norm(layer: EncoderLayer | DecoderLayer) -> nn.Module:
    """A Pre-LN stack ends with one more LayerNorm (its residual stream was never normalised);
    a Post-LN stack already ends normalised, so it gets none, as in the paper. A layer built from the
    notes' own classes (a student's, in chapter 12) may lack these options: it is Pre-LN, notes' flavour."""
    connection: SublayerConnection = layer.sublayer[0]
    if getattr(connection, "norm_position", "pre") == "post":
        return nn.Identity()
    return LayerNorm(layer.size, kind=getattr(connection.norm, "kind", "notes"))


class Encoder(nn.Module):
    """``N`` identical encoder layers (independent weights) and, for Pre-LN, a final LayerNorm.

    Shapes: x ``(batch, src_len, d_model)``, mask ``(batch, 1, src_len)``  ->  memory, same shape as x.
    """

    def __init__(self, layer: EncoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = _final_norm(layer)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class Decoder(nn.Module):
    """``N`` identical decoder layers and, for Pre-LN, a final LayerNorm.

    Shapes: as ``DecoderLayer``; returns ``(batch, tgt_len, d_model)``.
    """

    def __init__(self, layer: DecoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = _final_norm(layer)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


class Generator(nn.Module):
    """Project decoder states to the vocabulary and return log-probabilities.

    Shapes: ``(..., d_model) -> (..., vocab)``, log-softmax over the last axis.
    """

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax(self.proj(x), dim=-1)


class EncoderDecoder(nn.Module):
    """The whole model: embed and encode the source, embed and decode the target.

    ``forward`` returns the decoder's *states* ``(batch, tgt_len, d_model)``, not
    log-probabilities: apply ``self.generator`` to get those.

    Shapes: src ``(batch, src_len)``, tgt ``(batch, tgt_len)``, src_mask ``(batch, 1, src_len)``,
    tgt_mask ``(batch, tgt_len, tgt_len)``.
    """

    def __init__(
        self,
        encoder: Encoder,
        decoder: Decoder,
        src_embed: nn.Module,
        tgt_embed: nn.Module,
        generator: Generator,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """``(batch, src_len)`` ids  ->  memory ``(batch, src_len, d_model)``."""
        return self.encoder(self.src_embed(src), src_mask)

    def decode(
        self, memory: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        """Target ids ``(batch, tgt_len)`` attending to ``memory``  ->  ``(batch, tgt_len, d_model)``."""
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


def make_model(
    src_vocab: int,
    tgt_vocab: int,
    N: int = 6,
    d_model: int = 512,
    d_ff: int = 2048,
    h: int = 8,
    dropout: float = 0.1,
    *,
    norm_position: NormPosition = "pre",
    layer_norm: LayerNormKind = "notes",
    tie_embeddings: bool = False,
    attention_kernel: AttentionKernel = "matmul",
    max_len: int = 5000,
) -> EncoderDecoder:
    """Build the encoder–decoder Transformer with Xavier-uniform initialised matrices.

    The defaults build exactly the notes' model (same ``state_dict`` keys and shapes),
    with one correction: ``dropout`` also reaches the attention weights (the notes'
    ``make_model`` leaves every attention block at its default 0.1).

    Keyword options:
        norm_position: ``"pre"`` (the notes' code) or ``"post"`` (the paper).
        layer_norm: ``"notes"`` (unbiased std, eps outside the root) or ``"torch"``.
        tie_embeddings: one matrix for source embedding, target embedding and the
            generator's projection, as the paper does for a shared vocabulary;
            requires ``src_vocab == tgt_vocab``.
        attention_kernel: ``"matmul"`` or ``"sdpa"`` (see ``MultiHeadedAttention``).
        max_len: longest sequence the positional table covers.
    """
    if tie_embeddings and src_vocab != tgt_vocab:
        raise ValueError(f"tie_embeddings needs one shared vocabulary, got {src_vocab} and {tgt_vocab}")
    c = copy.deepcopy
    attn = MultiHeadedAttention(h, d_model, dropout, kernel=attention_kernel)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = PositionalEncoding(d_model, dropout, max_len)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout, norm_position, layer_norm), N),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout, norm_position, layer_norm), N),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    if tie_embeddings:
        shared = model.src_embed[0].lut.weight
        model.tgt_embed[0].lut.weight = shared
        model.generator.proj.weight = shared
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model
