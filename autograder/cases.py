"""The graded test cases of each exercise: inputs drawn fresh from a seed, checked live.

Each exercise id maps to a builder ``(seed) -> list[Case]``. Public cases use a fixed seed
(their inputs may be shown); hidden cases use the submission's seed, change shapes from
one submission to the next, and are compared with the reference computed in the harness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Case:
    """One graded call: ``fn(*args, **kwargs)`` in the worker vs the reference here.

    ``args``/``kwargs`` hold tensors, numbers, ``None`` and module stand-ins
    (``{"module": "scale", "factor": f}``, a dropout that multiplies by ``f``). For an
    ``nn.Module`` exercise, ``construct`` holds the constructor's arguments: the student's
    module is built with them, gets the reference's weights, and is called in eval mode.
    For a plain class exercise, ``attributes`` names the instance attributes that are
    compared: the instance never crosses, the tuple of those attributes does.
    """

    title: str
    checks: str
    public: bool
    args: tuple
    kwargs: dict = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-5
    construct: tuple | None = None
    attributes: tuple[str, ...] = ()


PUBLIC_SEED = 0


def _randn(gen: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=dtype) * scale


def _dim(gen: torch.Generator, low: int, high: int) -> int:
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def _even(gen: torch.Generator, low: int, high: int) -> int:
    return 2 * _dim(gen, low // 2, high // 2)


# The notes' float32 recipe is a correct answer: float32 tables may differ from the float64-then-cast
# reference by up to ~6e-5 at position 1000, far below the 0.1-size errors of the declared mistakes.
_PE_TOL = {"rtol": 1e-4, "atol": 2e-4}


def positional_encoding_cases(seed: int) -> list[Case]:
    """Chapter 2, ``positional_encoding(seq_len, d_model)``."""
    gen = torch.Generator().manual_seed(seed)
    return [
        Case("6 positions, d_model = 4", "the sinusoid table, sin in even and cos in odd columns (public)", True,
             (6, 4), **_PE_TOL),
        Case("a random table size", "shape (seq_len, d_model), float32, one frequency per pair", False,
             (_dim(gen, 20, 60), _even(gen, 8, 40)), **_PE_TOL),
        Case("one position, one pair", "seq_len = 1, d_model = 2: the row (sin 0, cos 0)", False, (1, 2), **_PE_TOL),
        Case("a long, wide table", "hundreds of positions, d_model in the hundreds", False,
             (_dim(gen, 300, 600), _even(gen, 128, 256)), **_PE_TOL),
    ]


def positional_encoding_module_cases(seed: int) -> list[Case]:
    """Chapter 2, ``PositionalEncoding(d_model, dropout, max_len=5000)``, in eval mode with the reference's buffer."""
    pub = torch.Generator().manual_seed(PUBLIC_SEED)
    gen = torch.Generator().manual_seed(seed)
    d, max_len = _even(gen, 4, 32), _dim(gen, 20, 60)
    full_d, default_d = _even(gen, 4, 16), _even(gen, 4, 16)
    long_len, bf_d = _dim(gen, 100, 300), _even(gen, 8, 32)
    return [
        Case("a batch of 2 sentences of length 5", "x + pe[:, :5] (public)", True, (_randn(pub, 2, 5, 8),),
             construct=(8, 0.1, 16)),
        Case("a random batch shorter than max_len", "the table sliced to the input length and added", False,
             (_randn(gen, _dim(gen, 1, 3), _dim(gen, 1, max_len - 1), d),), construct=(d, 0.1, max_len)),
        Case("a batch exactly max_len long", "every row of the table is used", False,
             (_randn(gen, 2, 24, full_d),), construct=(full_d, 0.2, 24)),
        Case("default max_len", "max_len defaults to 5000: a batch of a few hundred positions", False,
             (_randn(gen, 1, long_len, default_d),), construct=(default_d, 0.1)),
        Case("a bfloat16 batch", "the output keeps the dtype of x (bfloat16)", False,
             (_randn(gen, 2, 9, bf_d).to(torch.bfloat16),), construct=(bf_d, 0.1, 32), rtol=1e-2, atol=1e-2),
    ]


def rotation_matrix_cases(seed: int) -> list[Case]:
    """Chapter 2, ``rotation_matrix(k, d_model)``."""
    gen = torch.Generator().manual_seed(seed)
    return [
        Case("k = 1, d_model = 4", "the block-diagonal rotation R_1, float64 (public)", True, (1, 4)),
        Case("a random offset and width", "one 2x2 rotation by k * w_i per pair", False,
             (_dim(gen, 2, 40), _even(gen, 6, 32))),
        Case("k = 0", "R_0 is the identity", False, (0, _even(gen, 4, 16))),
        Case("a negative offset", "k < 0 turns the pairs backwards", False, (-_dim(gen, 1, 30), _even(gen, 6, 20))),
        Case("a large offset, wide table", "k in the hundreds, d_model = 128", False, (_dim(gen, 100, 300), 128),
             rtol=1e-4, atol=1e-4),
    ]


def embeddings_cases(seed: int) -> list[Case]:
    """Chapter 1, ``Embeddings(d_model, vocab)``: built with ``construct``, given the reference's table."""
    pub = torch.Generator().manual_seed(PUBLIC_SEED)
    gen = torch.Generator().manual_seed(seed)
    cases = [Case("d_model 4, vocab 6", "a batch of 2 sentences of 3 ids (public)", True,
                  (torch.randint(0, 6, (2, 3), generator=pub),), construct=(4, 6))]
    d, vocab = 2 * _dim(gen, 8, 32), _dim(gen, 20, 60)
    cases.append(Case("a batch of sentences", "ids (batch, seq_len) -> (batch, seq_len, d_model), times sqrt(d_model)",
                      False, (torch.randint(0, vocab, (_dim(gen, 2, 4), _dim(gen, 5, 12)), generator=gen),),
                      construct=(d, vocab)))
    d, vocab = _dim(gen, 5, 11) | 1, _dim(gen, 8, 16)
    cases.append(Case("odd d_model, repeated ids", "sqrt(d_model) is not an integer; every id appears several times",
                      False, (torch.randint(0, vocab, (3, 4 * vocab), generator=gen),), construct=(d, vocab)))
    d, vocab = _dim(gen, 64, 128), _dim(gen, 100, 300)
    cases.append(Case("three index dimensions, wide d_model", "ids of any shape: (a, b, c) -> (a, b, c, d_model)",
                      False, (torch.randint(0, vocab, (2, 3, _dim(gen, 2, 5)), generator=gen),), construct=(d, vocab)))
    return cases


def cosine_similarity_matrix_cases(seed: int) -> list[Case]:
    """Chapter 1, ``cosine_similarity_matrix(vectors, eps=1e-8)``."""
    pub = torch.Generator().manual_seed(PUBLIC_SEED)
    gen = torch.Generator().manual_seed(seed)
    cases = [Case("4 vectors of dimension 3", "every pair of rows (public)", True, (_randn(pub, 4, 3),))]
    b, n, d = _dim(gen, 2, 4), _dim(gen, 3, 8), _dim(gen, 4, 16)
    cases.append(Case("a batch of tables", "(batch, n, d) -> (batch, n, n)", False, (_randn(gen, b, n, d),)))
    n, d = _dim(gen, 4, 9), _dim(gen, 3, 8)
    lengths = torch.exp(torch.randn(n, 1, generator=gen) * 3)
    cases.append(Case("vectors of very different lengths", "each vector is divided by its own length (over the last "
                      "axis), so lengths from about 0.001 to 1000 do not matter", False, (_randn(gen, n, d) * lengths,),
                      atol=1e-5))
    n, d = _dim(gen, 4, 8), _dim(gen, 2, 6)
    x = _randn(gen, 2, n, d, dtype=torch.float64)
    x[_dim(gen, 0, 1), _dim(gen, 0, n - 1)] = 0
    cases.append(Case("a zero vector, float64", "a zero vector has similarity 0 with everything (no NaN); dtype kept",
                      False, (x,), rtol=1e-9, atol=1e-12))
    return cases


def attention_cases(seed: int) -> list[Case]:
    """Chapter 3, ``attention(query, key, value, mask=None, dropout=None)``."""
    pub = torch.Generator().manual_seed(PUBLIC_SEED)
    gen = torch.Generator().manual_seed(seed)
    cases = [Case("2 queries, 3 keys, no mask", "output and weights on a small 3-D batch (public)", True,
                  (_randn(pub, 1, 2, 4), _randn(pub, 1, 3, 4), _randn(pub, 1, 3, 5)))]
    b, h, lq, lk, d = _dim(gen, 2, 3), _dim(gen, 2, 4), _dim(gen, 3, 7), _dim(gen, 8, 12), _dim(gen, 5, 7)
    lengths = torch.randint(1, lk + 1, (b,), generator=gen)
    lengths[0] = lk
    pad = (torch.arange(lk)[None, :] < lengths[:, None])[:, None, None, :]
    cases.append(Case("multi-head batch with a padding mask", "4-D inputs, key padding mask of shape (b, 1, 1, len_k)",
                      False, (_randn(gen, b, h, lq, d), _randn(gen, b, h, lk, d), _randn(gen, b, h, lk, d)),
                      {"mask": pad}))
    n, d = _dim(gen, 5, 9), _dim(gen, 4, 8)
    causal = torch.tril(torch.ones(1, n, n, dtype=torch.bool))
    cases.append(Case("causal mask", "a subsequent (causal) boolean mask, len_q = len_k", False,
                      (_randn(gen, 2, n, d), _randn(gen, 2, n, d), _randn(gen, 2, n, d)), {"mask": causal}))
    n = _dim(gen, 4, 6)
    full = torch.ones(1, n, n, dtype=torch.int64)
    full[0, _dim(gen, 0, n - 1)] = 0
    cases.append(Case("a query row with every key masked", "an integer 0/1 mask with one fully masked row: "
                      "weights must stay finite (uniform)", False,
                      (_randn(gen, 1, n, n), _randn(gen, 1, n, n), _randn(gen, 1, n, 3)), {"mask": full}))
    lq, lk, d = _dim(gen, 2, 5), _dim(gen, 6, 9), _dim(gen, 10, 16)
    cases.append(Case("dropout module on the weights", "the `dropout` argument is applied to the weights, "
                      "and both outputs use the weights after it", False,
                      (_randn(gen, 2, lq, d, scale=2.0), _randn(gen, 2, lk, d, scale=2.0), _randn(gen, 2, lk, d)),
                      {"dropout": {"module": "scale", "factor": 0.5}}))
    lq, lk, d = _dim(gen, 2, 5), _dim(gen, 3, 6), _dim(gen, 16, 64)
    cases.append(Case("float64 inputs, wide d_k", "dtype is kept (float64) and the 1/sqrt(d_k) scale matters", False,
                      tuple(_randn(gen, 3, L, d, dtype=torch.float64, scale=3.0) for L in (lq, lk, lk)),
                      rtol=1e-9, atol=1e-12))
    return cases


def softmax_saturation_cases(seed: int) -> list[Case]:
    """Chapter 3, ``softmax_saturation(query, key, scaled=True)``."""
    pub = torch.Generator().manual_seed(PUBLIC_SEED)
    gen = torch.Generator().manual_seed(seed)
    cases = [Case("3 queries, 4 keys, scaled", "the largest weight of each query row (public)", True,
                  (_randn(pub, 3, 8), _randn(pub, 4, 8)))]
    lq, lk, d = _dim(gen, 3, 7), _dim(gen, 4, 9), _dim(gen, 16, 64)
    cases.append(Case("unscaled scores", "`scaled=False` uses softmax(q k^T) without 1/sqrt(d_k)", False,
                      (_randn(gen, 2, lq, d), _randn(gen, 2, lk, d)), {"scaled": False}))
    b, h, lq, lk, d = _dim(gen, 2, 3), _dim(gen, 2, 4), _dim(gen, 3, 6), _dim(gen, 4, 8), _dim(gen, 32, 64)
    cases.append(Case("multi-head batch, scaled", "4-D inputs; result has shape (..., len_q)", False,
                      (_randn(gen, b, h, lq, d, scale=2.0), _randn(gen, b, h, lk, d, scale=2.0)), {"scaled": True}))
    lq, lk, d = _dim(gen, 2, 6), _dim(gen, 2, 6), _dim(gen, 8, 32)
    cases.append(Case("float64, default argument", "`scaled` defaults to True; dtype is kept", False,
                      (_randn(gen, lq, d, dtype=torch.float64, scale=4.0), _randn(gen, lk, d, dtype=torch.float64,
                                                                                       scale=4.0)),
                      rtol=1e-9, atol=1e-12))
    return cases


def subsequent_mask_cases(seed: int) -> list[Case]:
    """Chapter 4, ``subsequent_mask(size)``."""
    gen = torch.Generator().manual_seed(seed)
    cases = [Case("size 3", "the (1, 3, 3) boolean lower triangle (public)", True, (3,))]
    cases.append(Case("size 1", "a single position sees itself: (1, 1, 1) True", False, (1,)))
    for _ in range(2):
        n = _dim(gen, 4, 16)
        cases.append(Case("a longer sequence", "shape (1, size, size), dtype bool, the diagonal included",
                          False, (n,)))
    return cases


def _padded_ids(gen: torch.Generator, lengths: list[int], pad: int, vocab: int = 12) -> torch.Tensor:
    """``(len(lengths), max_len)`` ids: row i has ``lengths[i]`` non-pad ids, then ``pad``."""
    width = max(lengths)
    ids = torch.randint(0, vocab - 1, (len(lengths), width), generator=gen)
    ids = ids + (ids >= pad).long()  # real tokens never equal the pad id
    keep = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~keep, pad)


_BATCH_ATTRIBUTES = ("src_mask", "tgt", "tgt_y", "tgt_mask", "ntokens")


def batch_cases(seed: int) -> list[Case]:
    """Chapter 4, ``Batch(src, tgt=None, pad=2)``: its attributes are compared."""
    pub = torch.Generator().manual_seed(PUBLIC_SEED)
    gen = torch.Generator().manual_seed(seed)
    cases = [Case("2 sentences, pad 2", "src_mask, tgt, tgt_y, tgt_mask and ntokens (public)", True,
                  (_padded_ids(pub, [4, 2], 2), _padded_ids(pub, [5, 3], 2)), {"pad": 2},
                  attributes=_BATCH_ATTRIBUTES)]
    b = _dim(gen, 3, 5)
    src_len, tgt_len = _dim(gen, 4, 9), _dim(gen, 4, 9)
    src = _padded_ids(gen, [src_len] + [_dim(gen, 1, src_len) for _ in range(b - 1)], 2)
    tgt = _padded_ids(gen, [tgt_len] + [_dim(gen, 2, tgt_len) for _ in range(b - 1)], 2)
    cases.append(Case("padded batch, default pad", "every attribute on a batch of sentences of mixed lengths",
                      False, (src, tgt), attributes=_BATCH_ATTRIBUTES))
    pad = _dim(gen, 0, 1)
    src = _padded_ids(gen, [_dim(gen, 1, 6) for _ in range(3)], pad)
    tgt = _padded_ids(gen, [_dim(gen, 2, 7) for _ in range(3)], pad)
    cases.append(Case("another pad id", "the `pad` argument is used (here it is not 2)", False, (src, tgt),
                      {"pad": pad}, attributes=_BATCH_ATTRIBUTES))
    src = _padded_ids(gen, [_dim(gen, 2, 6), 1], 2)
    cases.append(Case("source only", "without a target only src_mask is built", False, (src,),
                      attributes=("src_mask",)))
    return cases


def masked_softmax_cases(seed: int) -> list[Case]:
    """Chapter 4, ``masked_softmax(scores, mask=None)``."""
    pub = torch.Generator().manual_seed(PUBLIC_SEED)
    gen = torch.Generator().manual_seed(seed)
    cases = [Case("2 rows, one hidden entry", "weights of a (2, 4) float32 row pair (public)", True,
                  (_randn(pub, 2, 4), torch.tensor([[True, True, False, True], [True, True, True, True]])))]
    b, h, lq, lk = _dim(gen, 2, 3), _dim(gen, 2, 4), _dim(gen, 3, 6), _dim(gen, 5, 9)
    lengths = torch.randint(1, lk + 1, (b,), generator=gen)
    pad = (torch.arange(lk)[None, :] < lengths[:, None])[:, None, None, :]
    cases.append(Case("key padding mask, 4-D", "a (b, 1, 1, len_k) mask broadcast over heads and queries", False,
                      (_randn(gen, b, h, lq, lk, scale=3.0), pad)))
    n = _dim(gen, 4, 7)
    mask = (torch.rand(n, n, generator=gen) > 0.4).long()
    mask[_dim(gen, 0, n - 1)] = 0
    cases.append(Case("a fully hidden row, float32", "an integer 0/1 mask with one row hidden entirely: "
                      "that row must be uniform, not NaN", False, (_randn(gen, 2, n, n, scale=3.0), mask)))
    n = _dim(gen, 4, 7)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    mask[0] = False
    cases.append(Case("float16", "float16 scores with a causal mask and a fully hidden row: no overflow, no NaN",
                      False, (_randn(gen, 2, n, n, dtype=torch.float16), mask), rtol=2e-3, atol=2e-3))
    cases.append(Case("bfloat16", "bfloat16 scores with a causal mask: masked weights exactly 0", False,
                      (_randn(gen, 3, n, n, dtype=torch.bfloat16), torch.tril(torch.ones(n, n, dtype=torch.bool))),
                      rtol=2e-2, atol=2e-2))
    n = _dim(gen, 3, 6)
    mask = torch.ones(n, n, dtype=torch.bool)
    mask[-1] = False
    cases.append(Case("float64, a fully hidden row", "dtype kept; a hidden row is uniform whatever its scores",
                      False, (_randn(gen, n, n, dtype=torch.float64, scale=2.0), mask), rtol=1e-9, atol=1e-12))
    cases.append(Case("no mask", "mask=None is a plain softmax over the last axis", False,
                      (_randn(gen, 3, 5, scale=2.0),)))
    return cases


# What the items of a returned tuple are called in the feedback.
RETURN_NAMES: dict[str, tuple[str, ...]] = {"ch03.attention": ("output", "p_attn")}

CASES: dict[str, Callable[[int], list[Case]]] = {
    "ch01.embeddings": embeddings_cases,
    "ch01.cosine_similarity_matrix": cosine_similarity_matrix_cases,
    "ch02.positional_encoding": positional_encoding_cases,
    "ch02.PositionalEncoding": positional_encoding_module_cases,
    "ch02.rotation_matrix": rotation_matrix_cases,
    "ch03.attention": attention_cases,
    "ch03.softmax_saturation": softmax_saturation_cases,
    "ch04.subsequent_mask": subsequent_mask_cases,
    "ch04.batch": batch_cases,
    "ch04.masked_softmax": masked_softmax_cases,
}

