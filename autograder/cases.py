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
    """

    title: str
    checks: str
    public: bool
    args: tuple
    kwargs: dict = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-5
    construct: tuple | None = None


PUBLIC_SEED = 0


def _randn(gen: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=dtype) * scale


def _dim(gen: torch.Generator, low: int, high: int) -> int:
    return int(torch.randint(low, high + 1, (1,), generator=gen))


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


# What the items of a returned tuple are called in the feedback.
RETURN_NAMES: dict[str, tuple[str, ...]] = {"ch03.attention": ("output", "p_attn")}

CASES: dict[str, Callable[[int], list[Case]]] = {
    "ch03.attention": attention_cases,
    "ch03.softmax_saturation": softmax_saturation_cases,
}

