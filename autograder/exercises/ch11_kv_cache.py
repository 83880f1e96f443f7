"""Chapter 11 grading: ``CachedSelfAttention`` and ``kv_cache_bytes``."""

from __future__ import annotations

import torch

from autograder.exercises.shared import Case, Contract, Exercise, Mistake, Mutant, dim, generators, randn, variants

CHAPTER, NOTEBOOK = "11_kv_cache", "kv_cache.ipynb"


def cached_self_attention_cases(seed: int) -> list[Case]:
    """``CachedSelfAttention(h, d_model, dropout)``; ``forward(x, past_k=None, past_v=None)``."""
    pub, gen = generators(seed)

    def step(g: torch.Generator, batch: int, h: int, d_k: int, t: int) -> tuple:
        x = randn(g, batch, 1, h * d_k)
        if t == 0:
            return (x,)
        return x, randn(g, batch, h, t, d_k), randn(g, batch, h, t, d_k)

    cases = [Case("the first step", "2 heads, d_model 8, an empty cache: the token attends to itself (public)",
                  True, step(pub, 1, 2, 4, 0), construct=(2, 8, 0.1))]
    h, d_k = dim(gen, 2, 4), dim(gen, 4, 8)
    cases.append(Case("a cache of several positions", "the new key and value appended before attending; out, "
                      "and the cache one position longer", False, step(gen, dim(gen, 2, 3), h, d_k, dim(gen, 4, 9)),
                      construct=(h, h * d_k, 0.1)))
    h, d_k = dim(gen, 1, 2), dim(gen, 2, 6)
    cases.append(Case("one cached position", "t = 1: attention over two positions", False,
                      step(gen, 2, h, d_k, 1), construct=(h, h * d_k, 0.1)))
    h, d_k = dim(gen, 4, 8), dim(gen, 8, 16)
    cases.append(Case("first step, wider layer", "past_k = past_v = None with a batch of 3", False,
                      step(gen, 3, h, d_k, 0), construct=(h, h * d_k, 0.2)))
    return cases


def kv_cache_bytes_cases(seed: int) -> list[Case]:
    """``kv_cache_bytes(batch, layers, heads, head_dim, length, dtype, src_len=0)``: dtype as bytes per number, or
    as a torch dtype (the wire carries those by name)."""
    _, gen = generators(seed)
    cases = [Case("course-sized cache, float32", "batch 1, 3 layers, 4 heads of 32, 10 positions, 4 bytes "
                  "(public)", True, (1, 3, 4, 32, 10, 4))]
    cases.append(Case("an encoder-decoder cache", "self-attention and cross-attention positions, 2 bytes per "
                      "number", False, (dim(gen, 2, 8), dim(gen, 2, 6), dim(gen, 2, 8), 8 * dim(gen, 2, 8),
                                        dim(gen, 10, 90), 2), {"src_len": dim(gen, 5, 40)}))
    cases.append(Case("a decoder-only LLM, 4-bit", "0.5 bytes per number, src_len left at 0", False,
                      (dim(gen, 1, 4), 32, 8, 128, 1024 * dim(gen, 1, 8), 0.5)))
    cases.append(Case("int8, one key/value head", "1 byte per number (multi-query attention)", False,
                      (dim(gen, 8, 64), dim(gen, 12, 48), 1, 64, dim(gen, 100, 2000), 1)))
    cases.append(Case("a torch dtype: float16", "dtype given as torch.float16: 2 bytes per number", False,
                      (dim(gen, 1, 8), dim(gen, 2, 12), dim(gen, 2, 8), 8 * dim(gen, 2, 16), dim(gen, 10, 500),
                       torch.float16), {"src_len": dim(gen, 0, 40)}))
    cases.append(Case("a torch dtype: bfloat16 or float32", "dtype given as torch.bfloat16 or torch.float32", False,
                      (dim(gen, 1, 4), dim(gen, 2, 24), dim(gen, 1, 8), 64, dim(gen, 10, 900),
                       (torch.bfloat16, torch.float32)[dim(gen, 0, 1)])))
    cases.append(Case("a torch dtype: int8", "dtype given as torch.int8: 1 byte per number", False,
                      (dim(gen, 1, 4), dim(gen, 2, 24), dim(gen, 1, 4), 128, dim(gen, 10, 900), torch.int8)))
    return cases


_ATTENTION_MODULE = variants('''
from torch import nn
from tfm_solution import attention, clones


class CachedSelfAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, past_k=None, past_v=None):
        batch = x.size(0)
        q, k, v = (lin(x).view(batch, -1, self.h, self.d_k).transpose(1, 2) for lin in self.linears[:3])
        new_k, new_v = k, v
        {before}
        if past_k is not None:
            k = torch.cat([past_k, {append_k}], dim={axis})
            v = torch.cat([past_v, {append_v}], dim={axis})
        {attend}
        out = out.transpose(1, 2).contiguous().view(batch, -1, self.h * self.d_k)
        return {project}, {returned}
''', before="pass", append_k="k", append_v="v", axis="2",
   attend="out, _ = attention(q, k, v, dropout=self.dropout)", project="self.linears[-1](out)", returned="k, v")

_BYTES = '''
def kv_cache_bytes(batch, layers, heads, head_dim, length, dtype, src_len=0):
    size = dtype if isinstance(dtype, (int, float)) else torch.empty((), dtype=dtype).element_size()
    return round({formula})
'''

_OWN_FORWARD = '''    def forward(self, x, past_k=None, past_v=None):
        {body}
'''

_BYTES_OWN = '''
def kv_cache_bytes(batch, layers, heads, head_dim, length, dtype, src_len=0):
    {body}
'''

EXERCISES = (
    Exercise(
        id="ch11.CachedSelfAttention",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="CachedSelfAttention",
        kind="module",
        signature="CachedSelfAttention(h, d_model, dropout=0.1); forward(x, past_k=None, past_v=None) -> (out, k, v)",
        points=4,
        solution_grade_id="ch11-cached-self-attention",
        test_grade_id="ch11-cached-self-attention-tests",
        reference="tfm_solution.kv_cache:CachedSelfAttention",
        cases=cached_self_attention_cases,
        prerequisites=(
            "tfm_solution.attention:mask_fill_value",
            "tfm_solution.attention:attention",
            "tfm_solution.cloning:clones",
        ),
        return_names=("out", "k", "v"),
        contract=Contract(
            dtype="`out`, `k` and `v` have the dtype of the module and of `x`: float32, or float64 after `.double()`",
            keeps_dtype=True,
            modes=("eval", "train"),
        ),
        alternatives={
            "unflatten_and_softmax": _ATTENTION_MODULE().split("    def forward")[0] + _OWN_FORWARD.format(
                body="q, k, v = (lin(x).unflatten(-1, (self.h, self.d_k)).transpose(1, 2) "
                     "for lin in self.linears[:3])\n"
                     "        if past_k is not None:\n"
                     "            k, v = torch.cat((past_k, k), dim=-2), torch.cat((past_v, v), dim=-2)\n"
                     "        weights = self.dropout((q @ k.transpose(-2, -1) / math.sqrt(self.d_k)).softmax(-1))\n"
                     "        out = (weights @ v).transpose(1, 2).flatten(-2)\n"
                     "        return self.linears[3](out), k, v"),
            "all_true_mask": _ATTENTION_MODULE(attend="out, _ = attention(q, k, v, mask=torch.ones(1, 1, 1, k.size(2), "
                                                      "dtype=torch.bool), dropout=self.dropout)"),
            "cache_grown_on_axis_minus_2": _ATTENTION_MODULE(axis="-2"),
        },
        mutants={
            "without_gradients": Mutant("modes", _ATTENTION_MODULE().replace(
                "    def forward(self, x, past_k=None, past_v=None):",
                "    @torch.no_grad()\n    def forward(self, x, past_k=None, past_v=None):")),
            "output_detached": Mutant("modes", _ATTENTION_MODULE(project="self.linears[-1](out).detach()")),
        },
        mistakes={
            "attends_before_appending": Mistake(
                "the query attended to the cached positions only: append the new key and value first, the "
                "newest position must see itself",
                _ATTENTION_MODULE(before="out, _ = attention(q, past_k if past_k is not None else k, past_v if "
                                         "past_v is not None else v, dropout=self.dropout)",
                                  attend="pass")),
            "appended_twice": Mistake(
                "the new key and value were appended twice",
                _ATTENTION_MODULE(append_k="k, new_k", append_v="v, new_v")),
            "first_row_of_causal_mask": Mistake(
                "a causal mask was applied to the single query row: its first row hides every cached position "
                "but the first; with a cache every key is in the query's past, so no mask is needed",
                _ATTENTION_MODULE(attend="out, _ = attention(q, k, v, mask=torch.ones(k.size(2), k.size(2))."
                                         "tril()[:1], dropout=self.dropout)")),
            "no_output_projection": Mistake(
                "the heads were merged but W^O (self.linears[-1]) was not applied",
                _ATTENTION_MODULE(project="out")),
            "returns_new_positions_only": Mistake(
                "the returned k, v hold only the new position: return the whole cache, old positions first",
                _ATTENTION_MODULE(returned="new_k, new_v")),
            "cache_grown_on_heads_axis": Mistake(
                "the cache was concatenated along dim=1 (the heads); positions are dim=2 of (batch, h, t, d_k)",
                _ATTENTION_MODULE(axis="1")),
        },
        has_dropout=True,
        time_budget_s=2.0,
    ),
    Exercise(
        id="ch11.kv_cache_bytes",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="kv_cache_bytes",
        kind="function",
        signature="kv_cache_bytes(batch, layers, heads, head_dim, length, dtype, src_len=0) -> int",
        points=2,
        solution_grade_id="ch11-kv-cache-bytes",
        test_grade_id="ch11-kv-cache-bytes-tests",
        reference="tfm_solution.kv_cache:kv_cache_bytes",
        cases=kv_cache_bytes_cases,
        contract=Contract(
            dtype="a Python `int`, whether `dtype` is a torch dtype or a number of bytes (an int or a float)",
            rules=(("dtype-argument", "`dtype` may be a torch dtype (`torch.float16`: 2 bytes, `torch.int8`: 1) or "
                                      "the bytes one number takes; the grader passes both"),),
        ),
        alternatives={
            "itemsize": _BYTES_OWN.format(
                body="size = dtype.itemsize if isinstance(dtype, torch.dtype) else dtype\n"
                     "    return int(round(2 * batch * layers * heads * head_dim * (length + src_len) * size))"),
            "bits_over_8": _BYTES_OWN.format(
                body="if isinstance(dtype, torch.dtype):\n"
                     "        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)\n"
                     "        dtype = info.bits / 8\n"
                     "    return round(2 * batch * layers * heads * (length + src_len) * head_dim * dtype)"),
            "element_size": _BYTES_OWN.format(
                body="per_number = torch.tensor([], dtype=dtype).element_size() if isinstance(dtype, torch.dtype) "
                     "else dtype\n"
                     "    numbers = 2 * batch * layers * heads * head_dim * (length + src_len)\n"
                     "    return int(numbers * per_number)"),
        },
        mutants={
            "torch_dtypes_in_bits": Mutant("bits_not_bytes", _BYTES_OWN.format(
                body="size = dtype if isinstance(dtype, (int, float)) else torch.finfo(dtype).bits if "
                     "dtype.is_floating_point else torch.iinfo(dtype).bits\n"
                     "    return round(2 * batch * layers * heads * head_dim * (length + src_len) * size)")),
            "torch_dtypes_refused": Mutant("a torch dtype", _BYTES_OWN.format(
                body="return round(2 * batch * layers * heads * head_dim * (length + src_len) * float(dtype))")),
        },
        mistakes={
            "keys_only": Mistake(
                "only the keys (or only the values) were counted, as in the notes' formula: the cache holds "
                "both, twice as much",
                _BYTES.format(formula="batch * layers * heads * head_dim * (length + src_len) * size")),
            "layers_missing": Mistake(
                "the layers were not multiplied in: every decoder layer has its own cache",
                _BYTES.format(formula="2 * batch * heads * head_dim * (length + src_len) * size")),
            "source_ignored": Mistake(
                "the cross-attention cache (src_len source positions) was left out",
                _BYTES.format(formula="2 * batch * layers * heads * head_dim * length * size")),
            "bits_not_bytes": Mistake(
                "the result is in bits: one number takes `dtype` bytes, not 8 times as many",
                _BYTES.format(formula="2 * batch * layers * heads * head_dim * (length + src_len) * size * 8")),
            "dtype_ignored": Mistake(
                "every number was counted as 4 bytes: use the bytes of `dtype` (2 for float16, 1 for int8, ...)",
                _BYTES.format(formula="2 * batch * layers * heads * head_dim * (length + src_len) * 4")),
        },
        time_budget_s=1.0,
    ),
)
