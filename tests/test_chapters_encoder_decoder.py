"""Chapter 8: the reference's stacks against independent oracles, and the notebook's visible tests
against the wrong answers the chapter names (each must fail its exercise's visible tests)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from tfm_solution import (Decoder, DecoderLayer, Embeddings, Encoder, EncoderDecoder, EncoderLayer, Generator,
                          LayerNorm, MultiHeadedAttention, PositionalEncoding, PositionwiseFeedForward,
                          SublayerConnection, clones, make_model, subsequent_mask)

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "08_encoder_decoder" / "encoder_decoder.ipynb"

pytestmark = pytest.mark.fast


# ----------------------------------------------------------------------------- the reference


def test_decoder_is_n_layers_then_the_final_norm_written_out():
    torch.manual_seed(0)
    layer = DecoderLayer(16, MultiHeadedAttention(4, 16, 0.0), MultiHeadedAttention(4, 16, 0.0),
                         PositionwiseFeedForward(16, 32, 0.0), 0.0)
    decoder = Decoder(layer, 3).eval()
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 6, 16)
    src_mask, tgt_mask = torch.ones(2, 1, 6, dtype=torch.bool), subsequent_mask(4)
    expected = x
    for lyr in decoder.layers:
        expected = lyr(expected, memory, src_mask, tgt_mask)
    mean, std = expected.mean(-1, keepdim=True), expected.std(-1, keepdim=True)
    expected = decoder.norm.a_2 * (expected - mean) / (std + 1e-6) + decoder.norm.b_2
    torch.testing.assert_close(decoder(x, memory, src_mask, tgt_mask), expected)
    params = [p for lyr in decoder.layers for p in lyr.parameters()]
    assert len({id(p) for p in params}) == len(params)  # three independent layers


def test_generator_is_log_softmax_of_a_linear_map():
    gen = Generator(8, 11).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    logits = x @ gen.proj.weight.T + gen.proj.bias
    expected = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    torch.testing.assert_close(gen(x), expected)


def test_cross_attention_reads_only_unpadded_memory_rows():
    torch.manual_seed(2)
    model = make_model(15, 15, N=2, d_model=16, d_ff=32, h=4, dropout=0.0).eval()
    src_mask = torch.tensor([[[1, 1, 1, 0, 0]]]).bool()
    memory = torch.randn(1, 5, 16)
    changed = memory.clone()
    changed[:, 3:] = 50 * torch.randn(1, 2, 16)
    tgt = torch.tensor([[0, 4, 5]])
    with torch.no_grad():
        a = model.decode(memory, src_mask, tgt, subsequent_mask(3))
        b = model.decode(changed, src_mask, tgt, subsequent_mask(3))
        c = model.decode(changed, torch.ones(1, 1, 5, dtype=torch.bool), tgt, subsequent_mask(3))
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)


# ----------------------------------------------------------------------------- visible tests vs mutants


class _SublayersSwapped(EncoderLayer):
    def forward(self, x, mask):
        x = self.sublayer[0](x, self.feed_forward)
        return self.sublayer[1](x, lambda y: self.self_attn(y, y, y, mask))


class _MaskNotPassed(EncoderLayer):
    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y))
        return self.sublayer[1](x, self.feed_forward)


class _AttendsToOuterX(EncoderLayer):
    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class _OneSharedConnection(EncoderLayer):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__(size, self_attn, feed_forward, dropout)
        self.sublayer = nn.ModuleList([SublayerConnection(size, dropout)] * 2)


class _TgtMaskInCross(DecoderLayer):
    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.sublayer[1](x, lambda y: self.src_attn(y, memory, memory, tgt_mask))
        return self.sublayer[2](x, self.feed_forward)


class _CrossFromDecoder(DecoderLayer):
    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.sublayer[1](x, lambda y: self.src_attn(y, y, y, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class _CrossFirst(DecoderLayer):
    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda y: self.src_attn(y, memory, memory, src_mask))
        x = self.sublayer[1](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        return self.sublayer[2](x, self.feed_forward)


class _MasksSwapped(DecoderLayer):
    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, src_mask))
        x = self.sublayer[1](x, lambda y: self.src_attn(y, memory, memory, tgt_mask))
        return self.sublayer[2](x, self.feed_forward)


class _StudentDecoder(nn.Module):
    """The notes' Decoder as a student writes it (the reference's omits the norm for Post-LN layers)."""

    def __init__(self, layer, N):
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size)

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


class _SharedClones(_StudentDecoder):
    def __init__(self, layer, N):
        super().__init__(layer, N)
        self.layers = nn.ModuleList([layer] * N)


class _NoFinalNorm(_StudentDecoder):
    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return x


class _NormEveryLayer(_StudentDecoder):
    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = self.norm(layer(x, memory, src_mask, tgt_mask))
        return x


def _variant_make_model(shared_attention=False, attention_dropout=True, src_vocab_of_tgt=False, xavier=True):
    def build(src_vocab, tgt_vocab, N=6, d_model=512, d_ff=2048, h=8, dropout=0.1):
        c = copy.deepcopy
        attn = MultiHeadedAttention(h, d_model, dropout) if attention_dropout else MultiHeadedAttention(h, d_model)
        ff = PositionwiseFeedForward(d_model, d_ff, dropout)
        position = PositionalEncoding(d_model, dropout)
        model = EncoderDecoder(
            Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), N),
            # One prototype passed twice: each deep-copied layer keeps its self- and cross-attention as one module.
            Decoder(DecoderLayer(d_model, *((attn, attn) if shared_attention else (c(attn), c(attn))), c(ff),
                                 dropout), N),
            nn.Sequential(Embeddings(d_model, tgt_vocab if src_vocab_of_tgt else src_vocab), c(position)),
            nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
            Generator(d_model, tgt_vocab),
        )
        if xavier:
            for p in model.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        return model
    return build


MUTANTS = {
    "ch08-encoder-layer": ("EncoderLayer", EncoderLayer,
                           [_SublayersSwapped, _MaskNotPassed, _AttendsToOuterX, _OneSharedConnection]),
    "ch08-decoder-layer": ("DecoderLayer", DecoderLayer, [_TgtMaskInCross, _CrossFromDecoder, _CrossFirst, _MasksSwapped]),
    "ch08-decoder": ("Decoder", _StudentDecoder, [_SharedClones, _NoFinalNorm, _NormEveryLayer]),
    "ch08-make-model": ("make_model", _variant_make_model(),
                        [_variant_make_model(shared_attention=True), _variant_make_model(attention_dropout=False),
                         _variant_make_model(src_vocab_of_tgt=True), _variant_make_model(xavier=False)]),
}


def _visible_tests(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    return [c.source for c in cells
            if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]


def _run_visible(prefix: str, names: dict) -> None:
    sources = _visible_tests(prefix)
    assert sources, f"no visible tests for {prefix}"
    namespace = {"math": math, "torch": torch, "nn": nn, "copy": copy, "subsequent_mask": subsequent_mask,
                 "SublayerConnection": SublayerConnection, "LayerNorm": LayerNorm, "clones": clones,
                 "EncoderDecoder": EncoderDecoder, "print": lambda *a, **k: None}
    for source in sources:
        exec(source, {**namespace, **names})  # noqa: S102


@pytest.mark.parametrize("prefix", sorted(MUTANTS))
def test_visible_tests_pass_on_the_reference_and_fail_on_every_mutant(prefix):
    name, right, wrongs = MUTANTS[prefix]
    _run_visible(prefix, {name: right})
    for wrong in wrongs:
        with pytest.raises((AssertionError, RuntimeError)):
            _run_visible(prefix, {name: wrong})
