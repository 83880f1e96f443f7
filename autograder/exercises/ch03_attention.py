"""Chapter 3 grading: ``attention`` and ``softmax_saturation``."""

from __future__ import annotations

import torch

from autograder.exercises.shared import (Case, Contract, Exercise, Mistake, Mutant, dim, generators, key_padding_mask,
                                         padded_lengths, randn, variants)

CHAPTER, NOTEBOOK = "03_attention", "attention.ipynb"


def attention_cases(seed: int) -> list[Case]:
    """``attention(query, key, value, mask=None, dropout=None)``."""
    pub, gen = generators(seed)
    cases = [Case("2 queries, 3 keys, no mask", "output and weights on a small 3-D batch (public)", True,
                  (randn(pub, 1, 2, 4), randn(pub, 1, 3, 4), randn(pub, 1, 3, 5)))]
    b, h, lq, lk, d = dim(gen, 2, 3), dim(gen, 2, 4), dim(gen, 3, 7), dim(gen, 8, 12), dim(gen, 5, 7)
    pad = key_padding_mask(padded_lengths(gen, b, lk))
    cases.append(Case("multi-head batch with a padding mask", "4-D inputs, key padding mask of shape (b, 1, 1, len_k)",
                      False, (randn(gen, b, h, lq, d), randn(gen, b, h, lk, d), randn(gen, b, h, lk, d)),
                      {"mask": pad}))
    n, d = dim(gen, 5, 9), dim(gen, 4, 8)
    causal = torch.tril(torch.ones(1, n, n, dtype=torch.bool))
    cases.append(Case("causal mask", "a subsequent (causal) boolean mask, len_q = len_k", False,
                      (randn(gen, 2, n, d), randn(gen, 2, n, d), randn(gen, 2, n, d)), {"mask": causal}))
    n = dim(gen, 4, 6)
    full = torch.ones(1, n, n, dtype=torch.int64)
    full[0, dim(gen, 0, n - 1)] = 0
    cases.append(Case("a query row with every key masked", "an integer 0/1 mask with one fully masked row: "
                      "weights must stay finite (uniform)", False,
                      (randn(gen, 1, n, n), randn(gen, 1, n, n), randn(gen, 1, n, 3)), {"mask": full}))
    lq, lk, d = dim(gen, 2, 5), dim(gen, 6, 9), dim(gen, 10, 16)
    cases.append(Case("dropout module on the weights", "the `dropout` argument is applied to the weights, "
                      "and both outputs use the weights after it", False,
                      (randn(gen, 2, lq, d, scale=2.0), randn(gen, 2, lk, d, scale=2.0), randn(gen, 2, lk, d)),
                      {"dropout": {"module": "scale", "factor": 0.5}}))
    lq, lk, d = dim(gen, 2, 5), dim(gen, 3, 6), dim(gen, 16, 64)
    cases.append(Case("float64 inputs, wide d_k", "dtype is kept (float64) and the 1/sqrt(d_k) scale matters", False,
                      tuple(randn(gen, 3, L, d, dtype=torch.float64, scale=3.0) for L in (lq, lk, lk)),
                      rtol=1e-9, atol=1e-12))
    return cases


def softmax_saturation_cases(seed: int) -> list[Case]:
    """``softmax_saturation(query, key, scaled=True)``."""
    pub, gen = generators(seed)
    cases = [Case("3 queries, 4 keys, scaled", "the largest weight of each query row (public)", True,
                  (randn(pub, 3, 8), randn(pub, 4, 8)))]
    lq, lk, d = dim(gen, 3, 7), dim(gen, 4, 9), dim(gen, 16, 64)
    cases.append(Case("unscaled scores", "`scaled=False` uses softmax(q k^T) without 1/sqrt(d_k)", False,
                      (randn(gen, 2, lq, d), randn(gen, 2, lk, d)), {"scaled": False}))
    b, h, lq, lk, d = dim(gen, 2, 3), dim(gen, 2, 4), dim(gen, 3, 6), dim(gen, 4, 8), dim(gen, 32, 64)
    cases.append(Case("multi-head batch, scaled", "4-D inputs; result has shape (..., len_q)", False,
                      (randn(gen, b, h, lq, d, scale=2.0), randn(gen, b, h, lk, d, scale=2.0)), {"scaled": True}))
    lq, lk, d = dim(gen, 2, 6), dim(gen, 2, 6), dim(gen, 8, 32)
    cases.append(Case("float64, default argument", "`scaled` defaults to True; dtype is kept", False,
                      (randn(gen, lq, d, dtype=torch.float64, scale=4.0),
                       randn(gen, lk, d, dtype=torch.float64, scale=4.0)),
                      rtol=1e-9, atol=1e-12))
    return cases


_attention = variants('''
def attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = {scores}
    if mask is not None:
        {before}
    p_attn = scores.softmax(dim={dim})
    if mask is not None:
        {after}
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn
''', scores="torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)",
                      before="scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)",
                      dim="-1", after="pass")

_SATURATION = '''
def softmax_saturation(query, key, scaled=True):
    scores = torch.matmul(query, key.transpose(-2, -1))
    if {condition}:
        scores = scores / math.sqrt(query.size(-1))
    return scores.softmax(dim=-1).{reduce}(dim=-1).values
'''

_ATTENTION_WHERE = '''
def attention(query, key, value, mask=None, dropout=None):
    scores = query @ key.transpose(-2, -1) / query.size(-1) ** 0.5
    if mask is not None:
        scores = torch.where(mask.bool(), scores, torch.finfo(scores.dtype).min)
    p_attn = torch.softmax(scores, dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return p_attn @ value, p_attn
'''

_ATTENTION_WIDE = '''
def attention(query, key, value, mask=None, dropout=None):
    # scores and softmax in float64, the results back in the inputs' dtype
    scores = (query.double() / math.sqrt(query.size(-1))) @ key.double().transpose(-2, -1)
    if mask is not None:
        scores.masked_fill_(mask == 0, torch.finfo(torch.float64).min)
    p_attn = scores.softmax(dim=-1).to(query.dtype)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn
'''

_SATURATION_ALTERNATIVE = '''
def softmax_saturation(query, key, scaled=True):
    {body}
'''

EXERCISES = (
    Exercise(
        id="ch03.attention",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="attention",
        kind="function",
        signature="attention(query, key, value, mask=None, dropout=None) -> (output, p_attn)",
        points=6,
        solution_grade_id="ch03-attention",
        test_grade_id="ch03-attention-tests",
        reference="tfm_solution.attention:attention",
        cases=attention_cases,
        return_names=("output", "p_attn"),
        contract=Contract(
            dtype="`output` and `p_attn` have the dtype of `query` (float32 in, float32 out; float64 in, float64 out)",
            keeps_dtype=True,
            gradients=("query", "key", "value"),
        ),
        alternatives={
            "notes_minus_1e9": _attention(before="scores = scores.masked_fill(mask == 0, -1e9)"),
            "where_and_power": _ATTENTION_WHERE,
            "float64_inside": _ATTENTION_WIDE,
        },
        mutants={
            "query_scaled_in_place": Mutant("inputs", _attention(
                scores="torch.matmul(query.div_(math.sqrt(d_k)), key.transpose(-2, -1))")),
            "weights_detached": Mutant("gradients", _ATTENTION_WHERE.replace(
                "return p_attn @ value, p_attn", "return p_attn @ value, p_attn.detach()")),
        },
        mistakes={
            "missing_scale": Mistake(
                "the scores are not divided by sqrt(d_k) (missing scale): softmax saturates for large d_k",
                _attention(scores="torch.matmul(query, key.transpose(-2, -1))")),
            "scale_by_d_k": Mistake(
                "the scores are divided by d_k instead of sqrt(d_k)",
                _attention(scores="torch.matmul(query, key.transpose(-2, -1)) / d_k")),
            "softmax_wrong_axis": Mistake(
                "softmax is taken over the wrong axis (the queries, dim=-2): each row must sum to 1 over the keys",
                _attention(dim="-2")),
            "inverted_mask": Mistake(
                "the mask is inverted: positions where mask == 1 were hidden instead of those where mask == 0",
                _attention(before="scores = scores.masked_fill(mask != 0, torch.finfo(scores.dtype).min)")),
            "mask_after_softmax": Mistake(
                "the mask is applied after softmax: masked weights were zeroed but the rows no longer sum to 1",
                _attention(before="pass", after="p_attn = p_attn.masked_fill(mask == 0, 0.0)")),
            "neg_inf_nan_rows": Mistake(
                "masked scores are filled with -inf: a row whose keys are all masked becomes NaN; "
                "use a large finite negative number such as torch.finfo(dtype).min",
                _attention(before="scores = scores.masked_fill(mask == 0, float('-inf'))")),
            "no_transpose": Mistake(
                "key is not transposed: the scores must be query @ key^T (key.transpose(-2, -1))",
                _attention(scores="torch.matmul(query, key) / math.sqrt(d_k)")),
            "weights_before_dropout": Mistake(
                "p_attn is returned before dropout: return the dropped-out weights, the ones the output was "
                "computed with",
                '''
def attention(query, key, value, mask=None, dropout=None):
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
    p_attn = scores.softmax(dim=-1)
    dropped = p_attn if dropout is None else dropout(p_attn)
    return torch.matmul(dropped, value), p_attn
'''),
        },
        banned=("scaled_dot_product_attention", "MultiheadAttention"),
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch03.softmax_saturation",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="softmax_saturation",
        kind="function",
        signature="softmax_saturation(query, key, scaled=True) -> torch.Tensor",
        points=4,
        solution_grade_id="ch03-softmax-saturation",
        test_grade_id="ch03-softmax-saturation-tests",
        reference="tfm_solution.attention:softmax_saturation",
        cases=softmax_saturation_cases,
        contract=Contract(dtype="the result has the dtype of `query` (float32 in, float32 out; float64 in, "
                                "float64 out)", keeps_dtype=True),
        alternatives={
            "amax": _SATURATION_ALTERNATIVE.format(
                body="scores = query @ key.transpose(-2, -1)\n"
                     "    if scaled:\n        scores = scores / math.sqrt(query.size(-1))\n"
                     "    return scores.softmax(-1).amax(-1)"),
            "max_values": _SATURATION_ALTERNATIVE.format(
                body="scale = 1 / math.sqrt(query.size(-1)) if scaled else 1.0\n"
                     "    weights = torch.softmax(scale * torch.matmul(query, key.transpose(-2, -1)), dim=-1)\n"
                     "    return torch.max(weights, dim=-1).values"),
            "keys_scaled": _SATURATION_ALTERNATIVE.format(
                body="if scaled:\n        key = key / math.sqrt(key.size(-1))\n"
                     "    return (query @ key.transpose(-2, -1)).softmax(dim=-1).max(dim=-1).values"),
        },
        mutants={
            "keys_scaled_in_place": Mutant("inputs", _SATURATION_ALTERNATIVE.format(
                body="if scaled:\n        key /= math.sqrt(key.size(-1))\n"
                     "    return (query @ key.transpose(-2, -1)).softmax(dim=-1).max(dim=-1).values")),
        },
        mistakes={
            "ignores_scaled_flag": Mistake(
                "the `scaled` argument is ignored: scaled=False must skip the 1/sqrt(d_k) factor",
                _SATURATION.format(condition="True", reduce="max")),
            "min_instead_of_max": Mistake(
                "the smallest weight of each row was returned; saturation is measured by the largest",
                _SATURATION.format(condition="scaled", reduce="min")),
        },
        banned=("scaled_dot_product_attention",),
        time_budget_s=1.0,
    ),
)
