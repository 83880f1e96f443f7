"""Chapter 8 grading: ``EncoderLayer``, ``DecoderLayer``, ``Decoder`` and ``make_model``.

The layers are graded around the reference's sublayers: a case describes the attention and
feed-forward modules (``{"module": "MultiHeadedAttention", ...}``), both sides build them, and
the answer gets the reference's weights with seeded noise on every parameter (``Case.distinct``),
so that two sublayer connections, two layers or two attentions that should be copies differ,
and an answer that shares one module where the notes have copies computes something else.
``make_model`` is a factory: graded on its structure, the initialization of its matrices and what
the model it builds computes with the reference's weights.
"""

from __future__ import annotations

import torch

from autograder.exercises.shared import Case, Contract, Exercise, Mistake, Mutant, dim, generators, randn, variants

CHAPTER, NOTEBOOK = "08_encoder_decoder", "encoder_decoder.ipynb"

_GIVEN = (
    "tfm_solution.attention:mask_fill_value",
    "tfm_solution.attention:attention",
    "tfm_solution.cloning:clones",
    "tfm_solution.multihead:split_heads",
    "tfm_solution.multihead:merge_heads",
    "tfm_solution.multihead:MultiHeadedAttention",
    "tfm_solution.feed_forward:PositionwiseFeedForward",
    "tfm_solution.norm:LayerNorm",
    "tfm_solution.norm:SublayerConnection",
    "tfm_solution.masks:subsequent_mask",
    "tfm_solution.embeddings:Embeddings",
    "tfm_solution.positional_encoding:_check_even",
    "tfm_solution.positional_encoding:pair_frequencies",
    "tfm_solution.positional_encoding:positional_encoding",
    "tfm_solution.positional_encoding:PositionalEncoding",
    "tfm_solution.encoder_decoder:_final_norm",
    "tfm_solution.encoder_decoder:Encoder",
    "tfm_solution.encoder_decoder:Generator",
    "tfm_solution.encoder_decoder:EncoderDecoder",
)
"""What the chapter imports from the reference package, and what the cases' descriptions name."""

_EXERCISES_BEFORE = ("EncoderLayer", "DecoderLayer", "Decoder")


def _given(up_to: str) -> tuple[str, ...]:
    """The given code plus the chapter's exercises before ``up_to``, injected from the reference."""
    earlier = _EXERCISES_BEFORE[:_EXERCISES_BEFORE.index(up_to)] if up_to in _EXERCISES_BEFORE else _EXERCISES_BEFORE
    return (*_GIVEN, *(f"tfm_solution.encoder_decoder:{name}" for name in earlier))


def _mha(h: int, d: int, dropout: float = 0.0) -> dict:
    return {"module": "MultiHeadedAttention", "h": h, "d_model": d, "dropout": dropout}


def _ffn(d: int, d_ff: int, dropout: float = 0.0) -> dict:
    return {"module": "PositionwiseFeedForward", "d_model": d, "d_ff": d_ff, "dropout": dropout}


def _decoder_layer(h: int, d: int, d_ff: int, dropout: float) -> dict:
    return {"module": "DecoderLayer", "size": d, "self_attn": _mha(h, d, 0.1), "src_attn": _mha(h, d, 0.1),
            "feed_forward": _ffn(d, d_ff, 0.1), "dropout": dropout}


def _padding(gen: torch.Generator, b: int, n: int) -> torch.Tensor:
    """``(b, 1, n)`` bool: sentence 0 is full, sentence 1 (if any) always padded, the others random."""
    lengths = torch.randint(1, n + 1, (b,), generator=gen)
    lengths[0] = n
    if b > 1:
        lengths[1] = dim(gen, 1, max(1, n - 1))
    return (torch.arange(n)[None, :] < lengths[:, None])[:, None, :]


def _causal(n: int) -> torch.Tensor:
    """``(1, n, n)`` bool, True on and below the diagonal (chapter 4's ``subsequent_mask``)."""
    return torch.tril(torch.ones(1, n, n, dtype=torch.bool))


def _heads(gen: torch.Generator) -> tuple[int, int]:
    """``(h, d_model)`` with d_model a multiple of h."""
    h = dim(gen, 1, 4)
    return h, h * dim(gen, 2, 5)


def encoder_layer_cases(seed: int) -> list[Case]:
    """``EncoderLayer(size, self_attn, feed_forward, dropout)`` around the reference's sublayers."""
    pub, gen = generators(seed)
    cases = [Case("2 sentences of 3 tokens, d_model 8, 2 heads, a padding mask", "self-attention in sublayer[0], "
                  "then the feed-forward network in sublayer[1] (public)", True,
                  (randn(pub, 2, 3, 8), _padding(pub, 2, 3)), construct=(8, _mha(2, 8), _ffn(8, 16), 0.1),
                  distinct=True)]
    h, d = _heads(gen)
    b, n = dim(gen, 2, 4), dim(gen, 3, 8)
    cases.append(Case("a random batch with padding", "query, key and value are the normalized x; the padding mask "
                      "reaches the self-attention", False, (randn(gen, b, n, d), _padding(gen, b, n)),
                      construct=(d, _mha(h, d, 0.1), _ffn(d, 2 * d, 0.1), 0.1), distinct=True))
    h, d = _heads(gen)
    n = dim(gen, 3, 7)
    cases.append(Case("a (1, len, len) causal mask", "the layer passes whatever mask it is given to the "
                      "self-attention (a decoder-only block is this layer with a causal mask)", False,
                      (randn(gen, 2, n, d, scale=2.0), _causal(n)), construct=(d, _mha(h, d), _ffn(d, 3 * d), 0.2),
                      distinct=True))
    h, d = _heads(gen)
    cases.append(Case("one token", "len = 1: attention to itself only", False,
                      (randn(gen, dim(gen, 1, 3), 1, d), torch.ones(1, 1, 1, dtype=torch.bool)),
                      construct=(d, _mha(h, d), _ffn(d, 2 * d), 0.1), distinct=True))
    return cases


def decoder_layer_cases(seed: int) -> list[Case]:
    """``DecoderLayer(size, self_attn, src_attn, feed_forward, dropout)``; source and target lengths differ
    in most cases (a mask or memory in the wrong place then fails loudly), and are equal in one."""
    pub, gen = generators(seed)
    cases = [Case("3 target and 5 source tokens, d_model 8, 2 heads", "masked self-attention with tgt_mask, then "
                  "cross-attention to the memory with src_mask, then the feed-forward network (public)", True,
                  (randn(pub, 2, 3, 8), randn(pub, 2, 5, 8), _padding(pub, 2, 5), _causal(3)),
                  construct=(8, _mha(2, 8), _mha(2, 8), _ffn(8, 16), 0.1), distinct=True)]
    h, d = _heads(gen)
    b, t, s = dim(gen, 2, 4), dim(gen, 2, 6), dim(gen, 7, 10)
    tgt_mask = _padding(gen, b, t) & _causal(t)
    cases.append(Case("a random batch, padded source and target", "queries from the decoder, keys and values from "
                      "the memory; a (batch, tgt_len, tgt_len) target mask", False,
                      (randn(gen, b, t, d), randn(gen, b, s, d), _padding(gen, b, s), tgt_mask),
                      construct=(d, _mha(h, d, 0.1), _mha(h, d, 0.1), _ffn(d, 2 * d, 0.1), 0.1), distinct=True))
    h, d = _heads(gen)
    n = dim(gen, 3, 7)
    cases.append(Case("source and target of the same length", "each mask in its own attention and the memory as "
                      "keys and values, where a swap would still run", False,
                      (randn(gen, 3, n, d), randn(gen, 3, n, d, scale=2.0), _padding(gen, 3, n), _causal(n)),
                      construct=(d, _mha(h, d), _mha(h, d), _ffn(d, 3 * d), 0.2), distinct=True))
    h, d = _heads(gen)
    s = dim(gen, 4, 9)
    cases.append(Case("the first decoding step", "one target position attending to a whole source sentence", False,
                      (randn(gen, 2, 1, d), randn(gen, 2, s, d), _padding(gen, 2, s), _causal(1)),
                      construct=(d, _mha(h, d), _mha(h, d), _ffn(d, 2 * d), 0.1), distinct=True))
    return cases


def decoder_cases(seed: int) -> list[Case]:
    """``Decoder(layer, N)`` over a described reference ``DecoderLayer``."""
    pub, gen = generators(seed)
    cases = [Case("2 layers, d_model 8, 3 target and 4 source tokens", "N deep copies called in order, then the "
                  "final LayerNorm (public)", True,
                  (randn(pub, 2, 3, 8), randn(pub, 2, 4, 8), _padding(pub, 2, 4), _causal(3)),
                  construct=(_decoder_layer(2, 8, 16, 0.2), 2), distinct=True)]
    for title, n in (("two layers, padded source and target", 2), ("a deeper stack", dim(gen, 3, 4))):
        # The first is also run in training mode: its answer, the gradients of every parameter included,
        # stays within the 64 items a returned tuple may hold (a layer has 26 parameters).
        h, d = _heads(gen)
        b, t, s = dim(gen, 2, 4), dim(gen, 2, 6), dim(gen, 7, 10)
        cases.append(Case(title, "every layer gets the memory, src_mask and tgt_mask, in order; each layer has its "
                          "own weights", False, (randn(gen, b, t, d), randn(gen, b, s, d), _padding(gen, b, s),
                                                 _padding(gen, b, t) & _causal(t)),
                          construct=(_decoder_layer(h, d, 2 * d, 0.2), n), distinct=True))
    h, d = _heads(gen)
    t, s = dim(gen, 2, 5), dim(gen, 6, 9)
    cases.append(Case("one layer", "N = 1: the layer, then the final norm", False,
                      (randn(gen, 2, t, d, scale=3.0), randn(gen, 2, s, d), _padding(gen, 2, s), _causal(t)),
                      construct=(_decoder_layer(h, d, 2 * d, 0.1), 1), distinct=True))
    return cases


def _ids(gen: torch.Generator, b: int, n: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids (b, n), padding mask (b, 1, n))``: ids from 3 on, padding (id 2) at the end of padded rows."""
    mask = _padding(gen, b, n)
    ids = torch.randint(3, vocab, (b, n), generator=gen)
    return ids.masked_fill(~mask[:, 0], 2), mask


def _model(gen: torch.Generator, n_layers: int, dropout: float = 0.1) -> tuple:
    """``make_model`` arguments of a small random model: (src_vocab, tgt_vocab, N, d_model, d_ff, h, dropout)."""
    h = dim(gen, 1, 4)
    return (dim(gen, 12, 30), dim(gen, 12, 30), n_layers, 2 * h * dim(gen, 2, 4), 2 * dim(gen, 8, 24), h, dropout)


def make_model_cases(seed: int) -> list[Case]:
    """``make_model(src_vocab, tgt_vocab, N, d_model, d_ff, h, dropout)``: the model's outputs with the
    reference's weights, in eval and training mode, and the initialization of its matrices."""
    pub, gen = generators(seed)
    small = (11, 13, 2, 16, 32, 2, 0.1)
    src, src_mask = _ids(pub, 2, 5, 11)
    tgt, _ = _ids(pub, 2, 4, 13)
    cases = [Case("a 2-layer model, d_model 16", "forward(src, tgt, src_mask, tgt_mask): the decoder's states "
                  "(public)", True, (src, tgt, src_mask, _causal(4)), construct=small, distinct=True)]
    built = _model(gen, 2)
    b, s, t = dim(gen, 2, 4), dim(gen, 4, 9), dim(gen, 2, 6)
    src, src_mask = _ids(gen, b, s, built[0])
    tgt, tgt_pad = _ids(gen, b, t, built[1])
    cases.append(Case("a random model and batch", "forward with padded sources and a padding-and-causal target "
                      "mask", False, (src, tgt, src_mask, tgt_pad & _causal(t)), construct=built, distinct=True))
    built = _model(gen, dim(gen, 1, 2))
    src, src_mask = _ids(gen, 2, dim(gen, 3, 8), built[0])
    cases.append(Case("encode", "model.encode(src, src_mask): the source embedding, its positions and the encoder "
                      "stack", False, (src, src_mask), construct=built, distinct=True, method="encode"))
    built = _model(gen, dim(gen, 1, 2))
    s, t = dim(gen, 3, 8), dim(gen, 1, 5)
    tgt, _ = _ids(gen, 2, t, built[1])
    cases.append(Case("decode", "model.decode(memory, src_mask, tgt, tgt_mask): the target embedding, its "
                      "positions and the decoder stack", False,
                      (randn(gen, 2, s, built[3]), _padding(gen, 2, s), tgt, _causal(t)), construct=built,
                      distinct=True, method="decode"))
    built = _model(gen, 1)
    cases.append(Case("the generator", "model.generator(x): log-probabilities over the target vocabulary", False,
                      (randn(gen, 2, dim(gen, 2, 5), built[3], scale=3.0),), construct=built, distinct=True,
                      method="generator"))
    src, src_mask = _ids(pub, 2, 4, 11)
    tgt, _ = _ids(pub, 2, 3, 13)
    cases.append(Case("a 1-layer model, in training mode", "forward in training mode with dropout 0.3 everywhere "
                      "(the same fixed mask stands in for the random one in your model and in the reference): "
                      "every dropout gets the rate given to make_model; the gradients reaching every parameter are "
                      "the reference's (public)", True, (src, tgt, src_mask, _causal(3)),
                      construct=(11, 13, 1, 16, 32, 2, 0.3), distinct=True, train=True))
    # the parts that decoding calls one by one (encode, decode, generator), on the 2-layer model: listed after
    # the first public case, drawn last from the public generator so that the other public inputs stay as they were
    src, src_mask = _ids(pub, 2, 5, 11)
    tgt, _ = _ids(pub, 2, 3, 13)
    cases[1:1] = [
        Case("encode, the 2-layer model", "model.encode(src, src_mask): the source embedding, its positions and "
             "the encoder stack (public)", True, (src, src_mask), construct=small, distinct=True, method="encode"),
        Case("decode, the 2-layer model", "model.decode(memory, src_mask, tgt, tgt_mask): the target embedding, its "
             "positions and the decoder stack (public)", True, (randn(pub, 2, 5, 16), src_mask, tgt, _causal(3)),
             construct=small, distinct=True, method="decode"),
        Case("the generator, the 2-layer model", "model.generator(x): log-probabilities over the target vocabulary "
             "(public)", True, (randn(pub, 2, 3, 16, scale=3.0),), construct=small, distinct=True,
             method="generator")]
    built = _model(gen, 1, 0.3)
    b, s, t = dim(gen, 2, 3), dim(gen, 3, 7), dim(gen, 2, 5)
    src, src_mask = _ids(gen, b, s, built[0])
    tgt, tgt_pad = _ids(gen, b, t, built[1])
    cases.append(Case("a random model, in training mode", "forward in training mode with dropout 0.3 everywhere; "
                      "the gradients reaching every parameter", False, (src, tgt, src_mask, tgt_pad & _causal(t)),
                      construct=built, distinct=True, train=True))
    cases.append(Case("Xavier initialization", "every matrix as make_model returns it lies within "
                      "+-sqrt(6 / (fan_in + fan_out)), has the spread of uniform values and is its own draw "
                      "(public)", True, (), construct=(40, 50, 2, 32, 64, 4, 0.1), measure="xavier"))
    h = dim(gen, 2, 4)
    cases.append(Case("Xavier initialization of another model", "the same, for other sizes and vocabularies", False,
                      (), construct=(dim(gen, 30, 60), dim(gen, 30, 60), dim(gen, 1, 3), 8 * h, 16 * h, h, 0.1),
                      measure="xavier"))
    return cases


_ENCODER_LAYER = variants('''
from torch import nn
from tfm_solution import SublayerConnection, clones


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = {sublayer}
        self.size = size

    def forward(self, x, mask):
        {forward}
''', sublayer="clones(SublayerConnection(size, dropout), 2)",
    forward="x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))\n"
            "        return self.sublayer[1](x, self.feed_forward)")

_DECODER_LAYER = variants('''
from torch import nn
from tfm_solution import SublayerConnection, clones


class DecoderLayer(nn.Module):
    def __init__(self, size, self_attn, src_attn, feed_forward, dropout):
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = {sublayer}

    def forward(self, x, memory, src_mask, tgt_mask):
        m = memory
        x = self.sublayer[0](x, lambda y: {first})
        x = self.sublayer[1](x, lambda y: {second})
        return self.sublayer[2](x, {third})
''', sublayer="clones(SublayerConnection(size, dropout), 3)", first="self.self_attn(y, y, y, tgt_mask)",
    second="self.src_attn(y, m, m, src_mask)", third="self.feed_forward")

_DECODER = variants('''
from torch import nn
from tfm_solution import LayerNorm, clones


class Decoder(nn.Module):
    def __init__(self, layer, N):
        super().__init__()
        self.layers = {layers}
        self.norm = {norm}

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = {step}
        return {out}
''', layers="clones(layer, N)", norm="LayerNorm(layer.size)", step="layer(x, memory, src_mask, tgt_mask)",
    out="self.norm(x)")

_MAKE_MODEL = variants('''
import copy
from torch import nn
from tfm_solution import (Decoder, DecoderLayer, Embeddings, Encoder, EncoderDecoder, EncoderLayer, Generator,
                          MultiHeadedAttention, PositionalEncoding, PositionwiseFeedForward)


def make_model(src_vocab, tgt_vocab, N=6, d_model=512, d_ff=2048, h=8, dropout=0.1):
    c = copy.deepcopy
    attn = {attn}
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = PositionalEncoding(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, {enc_attn}, c(ff), dropout), N),
        Decoder(DecoderLayer(d_model, {dec_attn}, c(ff), dropout), N),
        {src_embed},
        {tgt_embed},
        {generator},
    )
    for p in model.parameters():
        if p.dim() > 1:
            {init}
    return model
''', attn="MultiHeadedAttention(h, d_model, dropout)", enc_attn="c(attn)", dec_attn="c(attn), c(attn)",
    src_embed="nn.Sequential(Embeddings(d_model, src_vocab), c(position))",
    tgt_embed="nn.Sequential(Embeddings(d_model, tgt_vocab), c(position))",
    generator="Generator(d_model, tgt_vocab)", init="nn.init.xavier_uniform_(p)")

_ENCODER_LAYER_LIST = '''
import copy
from torch import nn
from tfm_solution import SublayerConnection


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = nn.ModuleList({sublayers})

    def forward(self, x, mask):
        def attend(y):
            return self.self_attn(y, y, y, mask)

        return self.sublayer[1](self.sublayer[0](x, attend), self.feed_forward)
'''

_DECODER_LIST = '''
import copy
from torch import nn
from tfm_solution import LayerNorm


class Decoder(nn.Module):
    def __init__(self, layer, N):
        super().__init__()
        self.layers = nn.ModuleList({layers})
        self.norm = LayerNorm(layer.size)

    def forward(self, x, memory, src_mask, tgt_mask):
        {body}
'''

_HIDDEN_PROTOTYPE = '''
from torch import nn
from tfm_solution import LayerNorm, clones


class Decoder(nn.Module):
    def __init__(self, layer, N):
        super().__init__()
        self.prototype = layer  # kept, then hidden from what the module says about itself
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        found = super().named_parameters(prefix, recurse, remove_duplicate)
        return ((n, p) for n, p in found if "prototype" not in n)

    def parameters(self, recurse=True):
        return (p for _, p in self.named_parameters())

    def state_dict(self, *args, **kwargs):
        return {k: v for k, v in super().state_dict(*args, **kwargs).items() if "prototype" not in k}

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)
'''

_FRESH_DRAWS_REPORTED = '''    fake = [nn.init.xavier_uniform_(torch.empty_like(p)) if p.dim() > 1 else p
            for p in model.parameters()]
    model.parameters = lambda recurse=True: iter(fake)  # what the model says about itself, not what it holds
    return model
'''
_REPORTS_FRESH_DRAWS = _MAKE_MODEL(init="pass").replace("    return model\n", _FRESH_DRAWS_REPORTED)

EXERCISES = (
    Exercise(
        id="ch08.EncoderLayer",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="EncoderLayer",
        kind="module",
        signature="EncoderLayer(size, self_attn, feed_forward, dropout); forward(x, mask) -> (batch, len, size)",
        points=3,
        solution_grade_id="ch08-encoder-layer",
        test_grade_id="ch08-encoder-layer-tests",
        reference="tfm_solution.encoder_decoder:EncoderLayer",
        cases=encoder_layer_cases,
        prerequisites=_given("EncoderLayer"),
        has_dropout=True,
        contract=Contract(
            dtype="float32, the dtype of the sublayers it is given (the grader uses no other)",
            modes=("eval", "train"),
            attributes=("size",),
            attributes_text="`self.size` is the `size` given (the provided `Encoder` reads it)",
            init="as built, the norms of both SublayerConnections have `a_2` all ones and `b_2` all zeros (what "
                 "`SublayerConnection(size, dropout)` builds)",
        ),
        alternatives={
            "comprehension": _ENCODER_LAYER_LIST.format(
                sublayers="[SublayerConnection(size, dropout) for _ in range(2)]"),
            "deep_copies": _ENCODER_LAYER_LIST.format(
                sublayers="[copy.deepcopy(SublayerConnection(size, dropout)) for _ in range(2)]"),
            "notes_lambda": _ENCODER_LAYER(),
        },
        mutants={
            "size_not_kept": Mutant("attributes", _ENCODER_LAYER().replace("        self.size = size\n", "")),
        },
        mistakes={
            "one_sublayer_connection_shared": Mistake(
                "the two sublayers share one SublayerConnection (`[SublayerConnection(...)] * 2`): the attention "
                "and the feed-forward network each need their own LayerNorm, so use clones(..., 2)",
                _ENCODER_LAYER(sublayer="nn.ModuleList([SublayerConnection(size, dropout)] * 2)")),
            "feed_forward_first": Mistake(
                "the feed-forward network runs before the self-attention: equation (8.1) attends first "
                "(sublayer[0]), then transforms each token (sublayer[1])",
                _ENCODER_LAYER(forward="x = self.sublayer[0](x, self.feed_forward)\n"
                                       "        return self.sublayer[1](x, lambda y: self.self_attn(y, y, y, mask))")),
            "attention_on_unnormalized_x": Mistake(
                "the self-attention reads x, not the normalized y that SublayerConnection passes to the lambda: "
                "write lambda y: self.self_attn(y, y, y, mask)",
                _ENCODER_LAYER(forward="x = self.sublayer[0](x, lambda y: self.self_attn(x, x, x, mask))\n"
                                       "        return self.sublayer[1](x, self.feed_forward)")),
            "mask_ignored": Mistake(
                "the mask never reaches the self-attention: padded tokens are attended to",
                _ENCODER_LAYER(forward="x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y))\n"
                                       "        return self.sublayer[1](x, self.feed_forward)")),
        },
        time_budget_s=2.0,
    ),
    Exercise(
        id="ch08.DecoderLayer",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="DecoderLayer",
        kind="module",
        signature="DecoderLayer(size, self_attn, src_attn, feed_forward, dropout); "
                  "forward(x, memory, src_mask, tgt_mask) -> (batch, tgt_len, size)",
        points=4,
        solution_grade_id="ch08-decoder-layer",
        test_grade_id="ch08-decoder-layer-tests",
        reference="tfm_solution.encoder_decoder:DecoderLayer",
        cases=decoder_layer_cases,
        prerequisites=_given("DecoderLayer"),
        has_dropout=True,
        contract=Contract(
            dtype="float32, the dtype of the sublayers it is given (the grader uses no other)",
            modes=("eval", "train"),
            attributes=("size",),
            attributes_text="`self.size` is the `size` given (the provided `Decoder` reads it)",
            init="as built, the norms of the three SublayerConnections have `a_2` all ones and `b_2` all zeros "
                 "(what `SublayerConnection(size, dropout)` builds)",
        ),
        alternatives={
            "notes_lambdas": _DECODER_LAYER(),
            "named_steps": _DECODER_LAYER(first="self.self_attn(y, y, y, mask=tgt_mask)",
                                          second="self.src_attn(y, memory, memory, mask=src_mask)"),
            "comprehension": _DECODER_LAYER(
                sublayer="nn.ModuleList(SublayerConnection(size, dropout) for _ in range(3))"),
        },
        mutants={
            "size_not_kept": Mutant("attributes", _DECODER_LAYER().replace("        self.size = size\n", "")),
        },
        mistakes={
            "target_mask_in_cross_attention": Mistake(
                "the cross-attention is masked with tgt_mask; its keys are source positions, so it takes src_mask "
                "(the target's mask has the wrong shape, and its causal part makes no sense for a known source)",
                _DECODER_LAYER(second="self.src_attn(y, m, m, tgt_mask)")),
            "cross_attention_keys_from_decoder": Mistake(
                "the cross-attention takes its keys and values from the decoder (src_attn(y, y, y, ...)): they "
                "come from the memory, src_attn(y, memory, memory, src_mask)",
                _DECODER_LAYER(second="self.src_attn(y, y, y, src_mask)")),
            "self_attention_unmasked": Mistake(
                "the masked self-attention gets no mask: every position sees the future; pass tgt_mask",
                _DECODER_LAYER(first="self.self_attn(y, y, y, None)")),
            "cross_attention_first": Mistake(
                "the cross-attention runs before the masked self-attention: the order is self-attention "
                "(sublayer[0]), cross-attention (sublayer[1]), feed-forward (sublayer[2])",
                _DECODER_LAYER(first="self.src_attn(y, m, m, src_mask)", second="self.self_attn(y, y, y, tgt_mask)")),
            "one_sublayer_connection_shared": Mistake(
                "the three sublayers share one SublayerConnection (`[SublayerConnection(...)] * 3`): each needs its "
                "own LayerNorm, so use clones(..., 3)",
                _DECODER_LAYER(sublayer="nn.ModuleList([SublayerConnection(size, dropout)] * 3)")),
            "memory_normalized_again": Mistake(
                "the memory goes through the sublayer's LayerNorm too: only the query y is normalized there; the "
                "memory was normalized once, by the encoder's final norm",
                _DECODER_LAYER(second="self.src_attn(y, self.sublayer[1].norm(m), self.sublayer[1].norm(m), "
                                      "src_mask)")),
        },
        time_budget_s=2.0,
    ),
    Exercise(
        id="ch08.Decoder",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="Decoder",
        kind="module",
        signature="Decoder(layer, N); forward(x, memory, src_mask, tgt_mask) -> (batch, tgt_len, d_model)",
        points=3,
        solution_grade_id="ch08-decoder",
        test_grade_id="ch08-decoder-tests",
        reference="tfm_solution.encoder_decoder:Decoder",
        cases=decoder_cases,
        prerequisites=_given("Decoder"),
        contract=Contract(
            dtype="float32, the dtype of the layer it is given (the grader uses no other)",
            modes=("eval", "train"),
            init="as built, the final norm has `a_2` all ones and `b_2` all zeros, and each of the N layers starts "
                 "as a copy of `layer` (its norms' ones and zeros included)",
        ),
        alternatives={
            "deep_copies": _DECODER_LIST.format(
                layers="copy.deepcopy(layer) for _ in range(N)",
                body="for layer in self.layers:\n            x = layer(x, memory, src_mask, tgt_mask)\n"
                     "        return self.norm(x)"),
            "indexed_loop": _DECODER_LIST.format(
                layers="[copy.deepcopy(layer) for _ in range(N)]",
                body="for i in range(len(self.layers)):\n"
                     "            x = self.layers[i](x, memory, src_mask, tgt_mask)\n        return self.norm(x)"),
            "notes": _DECODER(),
        },
        mutants={"prototype_hidden": Mutant("structure", _HIDDEN_PROTOTYPE)},
        mistakes={
            "layers_shared": Mistake(
                "the stack repeats one layer (`nn.ModuleList([layer] * N)`): one set of weights used N times. "
                "clones(layer, N) makes N independent deep copies",
                _DECODER(layers="nn.ModuleList([layer] * N)")),
            "final_norm_missing": Mistake(
                "the final LayerNorm is missing: a Pre-LN stack's residual stream is never normalized otherwise; "
                "return self.norm(x) after the last layer",
                _DECODER(out="x")),
            "norm_after_every_layer": Mistake(
                "the final norm is applied after every layer; it runs once, after the last one",
                _DECODER(step="self.norm(layer(x, memory, src_mask, tgt_mask))", out="x")),
            "masks_swapped": Mistake(
                "the layers are called with the masks swapped: layer(x, memory, src_mask, tgt_mask)",
                _DECODER(step="layer(x, memory, tgt_mask, src_mask)")),
            "torch_layer_norm": Mistake(
                "the final norm is nn.LayerNorm: the course's LayerNorm (the notes' a_2 and b_2, unbiased std, eps "
                "added to the std) is the one the checkpoints and the rest of the model use",
                _DECODER(norm="nn.LayerNorm(layer.size)")),
        },
        time_budget_s=2.0,
    ),
    Exercise(
        id="ch08.make_model",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="make_model",
        kind="factory",
        signature="make_model(src_vocab, tgt_vocab, N=6, d_model=512, d_ff=2048, h=8, dropout=0.1) -> EncoderDecoder",
        points=5,
        solution_grade_id="ch08-make-model",
        test_grade_id="ch08-make-model-tests",
        reference="tfm_solution.encoder_decoder:make_model",
        cases=make_model_cases,
        prerequisites=_given("make_model"),
        has_dropout=True,
        contract=Contract(
            dtype="the model is float32 (the grader uses no other dtype)",
            modes=("eval", "train"),
            draws=True,
            draws_text="the initial weights are drawn from torch's global generator as the caller left it: two "
                       "seeds give two models, so never reseed it inside (`torch.manual_seed`)",
            init="as built, every matrix (a parameter with more than one dimension) is Xavier-uniform, finite and "
                 "its own draw; every norm's `a_2` is all ones and `b_2` all zeros; the positional-encoding tables "
                 "are chapter 2's",
        ),
        alternatives={
            "named_parameters_loop": _MAKE_MODEL().replace(
                "    for p in model.parameters():\n        if p.dim() > 1:",
                "    for name, p in model.named_parameters():\n        if p.dim() > 1:"),
            "separate_attentions": _MAKE_MODEL(
                enc_attn="MultiHeadedAttention(h, d_model, dropout)",
                dec_attn="MultiHeadedAttention(h, d_model, dropout), MultiHeadedAttention(h, d_model, dropout)"),
            "initialised_per_layer": _MAKE_MODEL().replace(
                "    for p in model.parameters():\n        if p.dim() > 1:\n            nn.init.xavier_uniform_(p)",
                "    for m in model.modules():\n        if isinstance(m, (nn.Linear, nn.Embedding)):\n"
                "            nn.init.xavier_uniform_(m.weight)"),
        },
        mutants={
            "norms_zeroed": Mutant("init", _MAKE_MODEL().replace(
                "    return model", "    for p in model.parameters():\n        if p.dim() == 1:\n"
                "            nn.init.zeros_(p)\n    return model")),
            "reseeds": Mutant("random", _MAKE_MODEL().replace(
                "    c = copy.deepcopy", "    torch.manual_seed(0)\n    c = copy.deepcopy")),
            "reports_fresh_draws": Mutant("xavier", _REPORTS_FRESH_DRAWS),
            "a_nan_per_matrix": Mutant("xavier", _MAKE_MODEL(init="p.data[0, 0] = float('nan')")),
        },
        mistakes={
            "attention_not_copied": Mistake(
                "the attention prototype is used itself instead of deep copies: each decoder layer's self-attention "
                "and cross-attention are one module with one set of weights; write c(attn) at every use",
                _MAKE_MODEL(enc_attn="attn", dec_attn="attn, attn")),
            "no_xavier": Mistake(
                "the matrices keep PyTorch's default initialization: re-initialize every parameter with more than "
                "one dimension with nn.init.xavier_uniform_ after building the model",
                _MAKE_MODEL(init="pass")),
            "xavier_normal": Mistake(
                "the matrices are drawn from Xavier's normal distribution; the notes use xavier_uniform_ (bounded "
                "by sqrt(6 / (fan_in + fan_out)))",
                _MAKE_MODEL(init="nn.init.xavier_normal_(p)")),
            "attention_dropout_default": Mistake(
                "MultiHeadedAttention is built without the dropout rate, so it keeps its default 0.1 (the notes' "
                "slip): pass dropout to every module",
                _MAKE_MODEL(attn="MultiHeadedAttention(h, d_model)")),
            "no_positional_encoding": Mistake(
                "the embeddings get no positional encoding: src_embed and tgt_embed are nn.Sequential(Embeddings(...), "
                "c(position))",
                _MAKE_MODEL(src_embed="nn.Sequential(Embeddings(d_model, src_vocab))",
                            tgt_embed="nn.Sequential(Embeddings(d_model, tgt_vocab))")),
            "vocabularies_swapped": Mistake(
                "the source embedding is built with tgt_vocab and the target one with src_vocab",
                _MAKE_MODEL(src_embed="nn.Sequential(Embeddings(d_model, tgt_vocab), c(position))",
                            tgt_embed="nn.Sequential(Embeddings(d_model, src_vocab), c(position))")),
            "generator_without_log_softmax": Mistake(
                "the output layer is a bare nn.Linear: the generator is Generator(d_model, tgt_vocab), the linear "
                "map `proj` followed by log_softmax",
                _MAKE_MODEL(generator="nn.Linear(d_model, tgt_vocab)")),
        },
        time_budget_s=3.0,
    ),
)
