"""Chapter 5 grading: ``split_heads``, ``merge_heads`` and ``MultiHeadedAttention``."""

from __future__ import annotations

import torch

from autograder.exercises.shared import Case, Contract, Exercise, Mistake, Mutant, dim, generators, randn, variants

CHAPTER, NOTEBOOK = "05_multihead_attention", "multihead_attention.ipynb"


def split_heads_cases(seed: int) -> list[Case]:
    """``split_heads(x, h)``."""
    pub, gen = generators(seed)
    cases = [Case("2 sentences, 3 positions, d_model 8, 2 heads", "(batch, len, d_model) -> (batch, h, len, d_k) "
                  "(public)", True, (randn(pub, 2, 3, 8), 2))]
    b, n, h, d_k = dim(gen, 2, 4), dim(gen, 3, 9), dim(gen, 3, 6), dim(gen, 2, 8)
    cases.append(Case("a random batch", "head i holds features i*d_k .. (i+1)*d_k - 1 of every position", False,
                      (randn(gen, b, n, h * d_k), h)))
    b, n = dim(gen, 1, 3), dim(gen, 2, 6)
    cases.append(Case("one head", "h = 1: the only head holds every feature", False,
                      (randn(gen, b, n, dim(gen, 3, 10)), 1)))
    b, h = dim(gen, 2, 3), dim(gen, 4, 8)
    cases.append(Case("one feature per head, one position", "d_k = 1 and len = 1", False, (randn(gen, b, 1, h), h)))
    n, h, d_k = dim(gen, 10, 30), 8, dim(gen, 8, 16)
    cases.append(Case("a long sentence, 8 heads, float64", "the paper's 8 heads; the dtype is kept", False,
                      (randn(gen, 2, n, h * d_k, dtype=torch.float64), h), rtol=0, atol=0))
    return cases


def merge_heads_cases(seed: int) -> list[Case]:
    """``merge_heads(x)``."""
    pub, gen = generators(seed)
    cases = [Case("2 sentences, 2 heads, 3 positions, d_k 4", "(batch, h, len, d_k) -> (batch, len, h * d_k) "
                  "(public)", True, (randn(pub, 2, 2, 3, 4),))]
    b, h, n, d_k = dim(gen, 2, 4), dim(gen, 3, 6), dim(gen, 3, 9), dim(gen, 2, 8)
    cases.append(Case("a random batch", "each position's row is Concat(head_0, ..., head_{h-1})", False,
                      (randn(gen, b, h, n, d_k),)))
    cases.append(Case("one head", "h = 1: the row is that head's row", False,
                      (randn(gen, dim(gen, 1, 3), 1, dim(gen, 2, 6), dim(gen, 3, 8)),)))
    cases.append(Case("one position", "len = 1", False, (randn(gen, dim(gen, 2, 3), dim(gen, 2, 6), 1, dim(gen, 2, 5)),)))
    n, d_k = dim(gen, 10, 30), dim(gen, 8, 16)
    cases.append(Case("a long sentence, 8 heads, float64", "the paper's 8 heads; the dtype is kept", False,
                      (randn(gen, 2, 8, n, d_k, dtype=torch.float64),), rtol=0, atol=0))
    return cases


def _padding(gen: torch.Generator, b: int, n: int) -> torch.Tensor:
    """``(b, n)`` bool: sentence 0 is full, sentence 1 always has padding, the others random."""
    lengths = torch.randint(1, n + 1, (b,), generator=gen)
    lengths[0] = n
    lengths[1] = dim(gen, 1, n - 1)
    return torch.arange(n)[None, :] < lengths[:, None]


def multiheaded_attention_cases(seed: int) -> list[Case]:
    """``MultiHeadedAttention(h, d_model, dropout=0.1)``: built with ``construct``, given the reference's weights."""
    pub, gen = generators(seed)
    x = randn(pub, 2, 3, 8)
    cases = [Case("self-attention, 2 heads, no mask", "2 sentences of 3 tokens, d_model 8 (public)", True,
                  (x, x, x), construct=(2, 8, 0.1))]
    h = dim(gen, 2, 4)
    d_model, len_q, len_k = h * dim(gen, 2, 6), dim(gen, 2, 6), dim(gen, 4, 9)
    memory = randn(gen, h, len_k, d_model)
    cases.append(Case("cross-attention with a padding mask", "len_q != len_k; a (batch, 1, len_k) padding mask "
                      "hides the same keys in every head; here batch = h", False,
                      (randn(gen, h, len_q, d_model), memory, memory), {"mask": _padding(gen, h, len_k)[:, None, :]},
                      construct=(h, d_model, 0.1)))
    b, n, d_model = dim(gen, 3, 5), dim(gen, 4, 8), 2 * dim(gen, 2, 8)
    causal = _padding(gen, b, n)[:, None, :] & torch.tril(torch.ones(n, n, dtype=torch.bool))
    x = randn(gen, b, n, d_model)
    cases.append(Case("decoder self-attention", "a (batch, len, len) padding-and-causal mask, 2 heads, batch != h",
                      False, (x, x, x), {"mask": causal}, construct=(2, d_model, 0.1)))
    d_model, len_q, len_k = dim(gen, 3, 12), dim(gen, 2, 5), dim(gen, 3, 7)
    memory = randn(gen, 2, len_k, d_model)
    cases.append(Case("one head", "h = 1: chapter 3's attention between the projections", False,
                      (randn(gen, 2, len_q, d_model), memory, memory), {"mask": _padding(gen, 2, len_k)[:, None, :]},
                      construct=(1, d_model, 0.1)))
    n = dim(gen, 5, 10)
    x = randn(gen, 3, n, 16, scale=2.0)
    cases.append(Case("eight narrow heads", "h = 8 heads of d_k = 2: each head scales by sqrt(d_k), not sqrt(d_model)",
                      False, (x, x, x), construct=(8, 16, 0.1)))
    h = dim(gen, 2, 4)
    n, d_model = dim(gen, 3, 7), h * dim(gen, 3, 6)
    ones = torch.ones(2, n, n, dtype=torch.int64)
    ones[1, :, dim(gen, 1, n - 1):] = 0
    x = randn(gen, 2, n, d_model)
    cases.append(Case("a 0/1 integer mask", "an integer (batch, len, len) mask, 0 = hidden, as the notes' masks may be",
                      False, (x, x, x), {"mask": ones}, construct=(h, d_model, 0.1)))
    return cases


_SPLIT = '''
def split_heads(x, h):
    return {body}
'''

_MERGE = '''
def merge_heads(x):
    return {body}
'''

_MHA = '''
from torch import nn
from tfm_solution import attention, clones


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            {mask}
        b = query.size(0)
        query, key, value = [{split} for lin, x in zip({projections}, (query, key, value))]
        {attend}
        x = {merge}
        return {output}
'''

_mha = variants(
    _MHA,
    mask="mask = mask.unsqueeze(1)",
    split="lin(x).view(b, -1, self.h, self.d_k).transpose(1, 2)",
    projections="self.linears",
    attend="x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)",
    merge="x.transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)",
    output="self.linears[3](x)",
)

_OWN_SCORES = ("scores = query @ key.transpose(-2, -1) / math.sqrt(self.h * self.d_k)\n"
               "        if mask is not None:\n"
               "            scores = scores.masked_fill(mask == 0, -1e9)\n"
               "        self.attn = self.dropout(scores.softmax(dim=-1))\n"
               "        x = self.attn @ value")

_MHA_OWN = '''
from torch import nn
import torch.nn.functional as F


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        assert d_model % h == 0
        self.d_k, self.h = d_model // h, h
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        q, k, v = (lin(t).unflatten(-1, (self.h, self.d_k)).transpose(1, 2)
                   for lin, t in zip(self.linears[:3], (query, key, value)))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask[:, None] == 0, torch.finfo(scores.dtype).min)
        self.attn = self.dropout(F.softmax(scores, dim=-1))
        out = torch.einsum("bhqk,bhkd->bhqd", self.attn, v)
        return self.linears[3](out.transpose(1, 2).flatten(-2))
'''

EXERCISES = (
    Exercise(
        id="ch05.split_heads",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="split_heads",
        kind="function",
        signature="split_heads(x, h) -> (batch, h, len, d_model // h)",
        points=2,
        solution_grade_id="ch05-split-heads",
        test_grade_id="ch05-split-heads-tests",
        reference="tfm_solution.multihead:split_heads",
        cases=split_heads_cases,
        contract=Contract(dtype="the result has the dtype of `x`", keeps_dtype=True, gradients=("x",)),
        alternatives={
            "unflatten": _SPLIT.format(body="x.unflatten(-1, (h, x.size(-1) // h)).transpose(1, 2)"),
            "reshape_permute": _SPLIT.format(body="x.reshape(x.size(0), x.size(1), h, -1).permute(0, 2, 1, 3)"),
            "chunks_stacked": _SPLIT.format(body="torch.stack(x.chunk(h, dim=-1), dim=1)"),
        },
        mutants={
            "cut_with_data": Mutant("gradients", _SPLIT.format(
                body="x.data.view(x.size(0), -1, h, x.size(-1) // h).transpose(1, 2)")),
        },
        mistakes={
            "view_without_transpose": Mistake(
                "the features were viewed as (batch, h, len, d_k) directly: each 'head' then holds pieces of "
                "several positions. View as (batch, len, h, d_k), then transpose(1, 2)",
                _SPLIT.format(body="x.view(x.size(0), h, -1, x.size(-1) // h)")),
            "heads_not_moved": Mistake(
                "the heads are split but not moved in front of the positions: the result is (batch, len, h, d_k); "
                "transpose(1, 2)",
                _SPLIT.format(body="x.view(x.size(0), -1, h, x.size(-1) // h)")),
            "strided_heads": Mistake(
                "head i got every h-th feature (i, i + h, ...) instead of the block i*d_k .. (i+1)*d_k - 1",
                _SPLIT.format(body="x.view(x.size(0), -1, x.size(-1) // h, h).permute(0, 3, 1, 2)")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch05.merge_heads",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="merge_heads",
        kind="function",
        signature="merge_heads(x) -> (batch, len, h * d_k)",
        points=2,
        solution_grade_id="ch05-merge-heads",
        test_grade_id="ch05-merge-heads-tests",
        reference="tfm_solution.multihead:merge_heads",
        cases=merge_heads_cases,
        contract=Contract(dtype="the result has the dtype of `x`", keeps_dtype=True, gradients=("x",)),
        alternatives={
            "reshape": _MERGE.format(body="x.transpose(1, 2).reshape(x.size(0), x.size(2), -1)"),
            "heads_concatenated": _MERGE.format(body="torch.cat(x.unbind(1), dim=-1)"),
            "permute_flatten": _MERGE.format(body="x.permute(0, 2, 1, 3).flatten(-2)"),
        },
        mutants={
            "cut_with_data": Mutant("gradients", _MERGE.format(
                body="x.data.transpose(1, 2).reshape(x.size(0), x.size(2), -1)")),
        },
        mistakes={
            "view_without_transpose": Mistake(
                "the heads were merged without the transpose back: each row mixes several positions of one head. "
                "transpose(1, 2) first, then contiguous().view",
                _MERGE.format(body="x.contiguous().view(x.size(0), -1, x.size(1) * x.size(3))")),
            "no_contiguous": Mistake(
                "view() after transpose() needs contiguous() (or use reshape)",
                _MERGE.format(body="x.transpose(1, 2).view(x.size(0), -1, x.size(1) * x.size(3))")),
            "heads_interleaved": Mistake(
                "the heads' features are interleaved (feature j of every head side by side); each row should be "
                "head 0's d_k features, then head 1's, ...",
                _MERGE.format(body="x.permute(0, 2, 3, 1).reshape(x.size(0), x.size(2), -1)")),
        },
        time_budget_s=1.0,
    ),
    Exercise(
        id="ch05.multiheaded_attention",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="MultiHeadedAttention",
        kind="module",
        signature="MultiHeadedAttention(h, d_model, dropout=0.1); forward(query, key, value, mask=None) "
                  "-> (batch, len_q, d_model)",
        points=6,
        solution_grade_id="ch05-multiheaded-attention",
        test_grade_id="ch05-multiheaded-attention-tests",
        reference="tfm_solution.multihead:MultiHeadedAttention",
        cases=multiheaded_attention_cases,
        prerequisites=(
            "tfm_solution.attention:mask_fill_value",
            "tfm_solution.attention:attention",
            "tfm_solution.cloning:clones",
            "tfm_solution.multihead:split_heads",
            "tfm_solution.multihead:merge_heads",
        ),
        has_dropout=True,
        contract=Contract(
            dtype="the output has the dtype of the module and of the inputs: float32, or float64 after `.double()`",
            keeps_dtype=True,
            modes=("eval", "train"),
            attributes=("attn", "h", "d_k"),
            attributes_text="after a call, `self.attn` holds the attention weights `(batch, h, len_q, len_k)` (after "
                            "dropout in training mode); `self.h` and `self.d_k` are the number and width of the heads",
        ),
        alternatives={
            "notes": _mha(),
            "einsum_and_unflatten": _MHA_OWN,
            "exercises_reused": "from tfm_solution.multihead import merge_heads, split_heads\n" + _mha(
                split="split_heads(lin(x), self.h)", merge="merge_heads(x)", output="self.linears[-1](x)",
                attend="x, self.attn = attention(query, key, value, mask, self.dropout)"),
        },
        mutants={
            "mask_unsqueezed_in_place": Mutant("inputs", _mha(mask="mask.unsqueeze_(1)")),
            "computed_in_float32": Mutant("dtype", _mha(output="self.linears[3](x.float())").replace(
                "        b = query.size(0)", "        query, key, value = query.float(), key.float(), value.float()\n"
                                            "        b = query.size(0)").replace(
                "    def forward(self, query, key, value, mask=None):",
                "    def forward(self, query, key, value, mask=None):\n"
                "        self.linears.float()")),
            "weights_not_kept": Mutant("attributes", _mha(attend="x, _ = attention(query, key, value, mask=mask, "
                                                                 "dropout=self.dropout)")),
        },
        mistakes={
            "merge_without_transpose": Mistake(
                "the heads were merged without transposing them back behind the positions: each output row mixes "
                "several positions",
                _mha(merge="x.contiguous().view(b, -1, self.h * self.d_k)")),
            "split_without_transpose": Mistake(
                "the projections were viewed as (batch, h, len, d_k) directly: view as (batch, len, h, d_k), then "
                "transpose(1, 2)",
                _mha(split="lin(x).view(b, self.h, -1, self.d_k)")),
            "scale_by_d_model": Mistake(
                "the scores are divided by sqrt(d_model); each head divides by sqrt(d_k), the width of its own keys",
                _mha(attend=_OWN_SCORES)),
            "no_output_projection": Mistake(
                "W^O (linears[3]) is never applied: the heads are concatenated but not mixed",
                _mha(output="x")),
            "mask_not_broadcast_over_heads": Mistake(
                "the mask has no head axis, so broadcasting lines the batch up with the heads: give every head the "
                "same mask with mask.unsqueeze(1)",
                _mha(mask="pass")),
            "one_projection_for_all": Mistake(
                "query, key and value all go through linears[0]: each has its own projection, linears[0], [1], [2]",
                _mha(projections="[self.linears[0]] * 3")),
            "dropout_on_output": Mistake(
                "dropout was applied to the output; the notes apply it to the attention weights (pass "
                "dropout=self.dropout to attention)",
                _mha(attend="x, self.attn = attention(query, key, value, mask=mask)",
                     output="self.dropout(self.linears[3](x))")),
        },
        banned=("scaled_dot_product_attention", "MultiheadAttention"),
        time_budget_s=2.0,
    ),
)
