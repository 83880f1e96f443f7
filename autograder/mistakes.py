"""Declared mistakes: classic wrong answers the grader recognises and names.

Each entry is a small wrong implementation of an exercise, written as the student would
write it. When a submission fails a case, the harness runs the declared mistakes of that
exercise on the same inputs (here, in the trusted process) and, if the submission's output
matches one of them, names it in the feedback. The self-tests submit each one and check
that it fails its exercise and only its exercise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

_PRELUDE = "import math\nimport torch\n"


@dataclass(frozen=True)
class Mistake:
    """A named wrong answer: what to tell the student, and code that makes the mistake."""

    message: str
    source: str


_PE = '''
def positional_encoding(seq_len, d_model):
    pos = torch.arange(seq_len, dtype=torch.float64)[:, None]
    {frequencies}
    pe = torch.zeros(seq_len, d_model, dtype=torch.float64)
    {fill}
    return pe.float()
'''
_PE_GOOD = {"frequencies": "omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)",
            "fill": "pe[:, 0::2] = torch.sin(pos * omega)\n    pe[:, 1::2] = torch.cos(pos * omega)"}


def _pe(**change: str) -> str:
    return _PE.format(**dict(_PE_GOOD, **change))


_PE_MODULE = '''
from torch import nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.d_model = d_model
        self.dropout = nn.Dropout(p=dropout)
        self.register_buffer("pe", torch.zeros(1, max_len, d_model))

    def forward(self, x):
        return self.dropout({result})
'''

_ROTATION = '''
def rotation_matrix(k, d_model):
    omega = 10000.0 ** (-torch.arange({pairs}, dtype=torch.float64) / d_model)
    theta = {theta}
    r = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        c, s = torch.cos(theta[i]), torch.sin(theta[i])
        r[2 * i, 2 * i], r[2 * i, 2 * i + 1] = c, {sign}s
        r[2 * i + 1, 2 * i], r[2 * i + 1, 2 * i + 1] = {other}s, c
    return r
'''
_ROTATION_GOOD = {"pairs": "0, d_model, 2", "theta": "k * omega", "sign": "", "other": "-"}


def _rotation(**change: str) -> str:
    return _ROTATION.format(**dict(_ROTATION_GOOD, **change))


_EMBEDDINGS = '''
from torch import nn


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x):
        return {result}
'''

_COSINE = '''
def cosine_similarity_matrix(vectors, eps=1e-8):
    {body}
'''

_ATTENTION = '''
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
'''
_GOOD = {"scores": "torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)",
         "before": "scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)",
         "dim": "-1", "after": "pass"}


def _attention(**change: str) -> str:
    return _ATTENTION.format(**dict(_GOOD, **change))


_SATURATION = '''
def softmax_saturation(query, key, scaled=True):
    scores = torch.matmul(query, key.transpose(-2, -1))
    if {condition}:
        scores = scores / math.sqrt(query.size(-1))
    return scores.softmax(dim=-1).{reduce}(dim=-1).values
'''

_SUBSEQUENT = '''
def subsequent_mask(size):
    return {body}
'''

_BATCH = '''
class Batch:
    def __init__(self, src, tgt=None, pad=2):
        self.src = src
        self.src_mask = (src != {pad}).unsqueeze(-2)
        if tgt is not None:
            self.tgt, self.tgt_y = {shift}
            causal = torch.ones(1, self.tgt.size(-1), self.tgt.size(-1), dtype=torch.bool).tril()
            self.tgt_mask = {tgt_mask}
            self.ntokens = ({counted} != {pad}).sum()
'''
_BATCH_GOOD = {"pad": "pad", "shift": "tgt[:, :-1], tgt[:, 1:]",
               "tgt_mask": "(self.tgt != pad).unsqueeze(-2) & causal", "counted": "self.tgt_y"}


def _batch(**change: str) -> str:
    return _BATCH.format(**dict(_BATCH_GOOD, **change))


_MASKED_SOFTMAX = '''
def masked_softmax(scores, mask=None):
    if mask is not None:
        {body}
    return scores.softmax(dim=-1)
'''

MISTAKES: dict[str, dict[str, Mistake]] = {
    "ch01.embeddings": {
        "missing_scale": Mistake(
            "the lookup is not multiplied by sqrt(d_model)",
            _EMBEDDINGS.format(result="self.lut(x)")),
        "divides_by_sqrt": Mistake(
            "the lookup is divided by sqrt(d_model); the notes multiply by it",
            _EMBEDDINGS.format(result="self.lut(x) / math.sqrt(self.d_model)")),
        "scale_by_d_model": Mistake(
            "the lookup is multiplied by d_model instead of sqrt(d_model)",
            _EMBEDDINGS.format(result="self.lut(x) * self.d_model")),
    },
    "ch01.cosine_similarity_matrix": {
        "dot_product_only": Mistake(
            "these are plain dot products: each vector must first be divided by its length",
            _COSINE.format(body="return vectors @ vectors.transpose(-2, -1)")),
        "normalised_wrong_axis": Mistake(
            "the lengths were taken over the wrong axis (dim=-2, across vectors); a vector's length is over "
            "its own entries, the last axis",
            _COSINE.format(body="unit = vectors / vectors.norm(dim=-2, keepdim=True).clamp_min(eps)\n"
                                "    return unit @ unit.transpose(-2, -1)")),
        "zero_vector_nan": Mistake(
            "a zero vector gives 0/0 = NaN: clamp each length below at eps (norm.clamp_min(eps))",
            _COSINE.format(body="unit = vectors / vectors.norm(dim=-1, keepdim=True)\n"
                                "    return unit @ unit.transpose(-2, -1)")),
    },
    "ch02.positional_encoding": {
        "sin_cos_swapped": Mistake(
            "sine and cosine are swapped: even columns take sin(pos * w_i), odd columns cos(pos * w_i)",
            _pe(fill="pe[:, 0::2] = torch.cos(pos * omega)\n    pe[:, 1::2] = torch.sin(pos * omega)")),
        "exponent_per_dimension": Mistake(
            "each dimension j got its own exponent j / d_model: i indexes dimension *pairs*, so columns "
            "2i and 2i+1 share the frequency 10000^(-2i/d_model)",
            _pe(frequencies="omega = 10000.0 ** (-torch.arange(d_model, dtype=torch.float64) / d_model)",
                fill="pe[:, 0::2] = torch.sin(pos * omega[0::2])\n    pe[:, 1::2] = torch.cos(pos * omega[1::2])")),
        "pair_index_not_doubled": Mistake(
            "the exponent is i / d_model with i the pair index; it must be 2i / d_model",
            _pe(frequencies="omega = 10000.0 ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)")),
        "halves_not_interleaved": Mistake(
            "the sines fill the first half and the cosines the second; they must interleave "
            "(sin in even columns, cos in odd ones)",
            _pe(fill="pe[:, : d_model // 2] = torch.sin(pos * omega)\n    pe[:, d_model // 2 :] = torch.cos(pos * omega)")),
        "positions_start_at_one": Mistake(
            "the first row is position 1; positions start at 0 (the first row is sin 0 = 0, cos 0 = 1)",
            _pe(fill="pe[:, 0::2] = torch.sin((pos + 1) * omega)\n    pe[:, 1::2] = torch.cos((pos + 1) * omega)")),
    },
    "ch02.PositionalEncoding": {
        "positions_start_at_one": Mistake(
            "the slice skips row 0 of the table: a sequence of length n takes rows 0 .. n-1, pe[:, :n]",
            _PE_MODULE.format(result="x + self.pe[:, 1 : x.size(1) + 1].to(x.dtype)")),
        "scales_by_sqrt_d_model": Mistake(
            "x was multiplied by sqrt(d_model): that scale belongs to the embeddings (chapter 1), "
            "the positional encoding only adds",
            _PE_MODULE.format(result="x * math.sqrt(self.d_model) + self.pe[:, : x.size(1)].to(x.dtype)")),
        "result_dtype_promoted": Mistake(
            "adding the float32 table to a lower-precision batch promoted the result to float32; "
            "cast the slice with .to(x.dtype)",
            _PE_MODULE.format(result="x + self.pe[:, : x.size(1)]")),
    },
    "ch02.rotation_matrix": {
        "rotates_backwards": Mistake(
            "the signs of sin(k w_i) are swapped: this is R_(-k), which maps PE(pos) to PE(pos - k)",
            _rotation(sign="-", other="")),
        "angle_without_frequency": Mistake(
            "every pair turns by k radians: pair i must turn by k * w_i, with w_i = 10000^(-2i/d_model)",
            _rotation(theta="k * torch.ones_like(omega)")),
        "pair_index_not_doubled": Mistake(
            "the frequency exponent is i / d_model with i the pair index; it must be 2i / d_model",
            _rotation(pairs="d_model // 2")),
    },
    "ch03.attention": {
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
    },
    "ch03.softmax_saturation": {
        "ignores_scaled_flag": Mistake(
            "the `scaled` argument is ignored: scaled=False must skip the 1/sqrt(d_k) factor",
            _SATURATION.format(condition="True", reduce="max")),
        "min_instead_of_max": Mistake(
            "the smallest weight of each row was returned; saturation is measured by the largest",
            _SATURATION.format(condition="scaled", reduce="min")),
    },
    "ch04.subsequent_mask": {
        "upper_triangle": Mistake(
            "True marks the future positions (the upper triangle): in this course True means *may attend*, "
            "so position i sees j <= i; the notes' triu(..., diagonal=1) still needs `== 0`",
            _SUBSEQUENT.format(body="torch.triu(torch.ones(1, size, size), diagonal=1).bool()")),
        "diagonal_hidden": Mistake(
            "the diagonal is hidden: a position must see itself (j <= i, not j < i)",
            _SUBSEQUENT.format(body="torch.ones(1, size, size, dtype=torch.bool).tril(diagonal=-1)")),
        "no_batch_axis": Mistake(
            "the mask has shape (size, size): it needs a leading axis of 1, (1, size, size), to broadcast "
            "over the batch",
            _SUBSEQUENT.format(body="torch.ones(size, size, dtype=torch.bool).tril()")),
        "float_mask": Mistake(
            "the mask is a float tensor of 0.0/1.0: return a bool tensor (`& ` with the padding mask needs one)",
            _SUBSEQUENT.format(body="torch.ones(1, size, size).tril()")),
    },
    "ch04.batch": {
        "no_shift": Mistake(
            "tgt and tgt_y are not shifted: the decoder reads tgt[:, :-1] and must predict tgt[:, 1:]",
            _batch(shift="tgt, tgt")),
        "causal_only": Mistake(
            "tgt_mask hides the future but not the padding: combine both masks with `&`",
            _batch(tgt_mask="causal.expand(self.tgt.size(0), -1, -1)")),
        "padding_only": Mistake(
            "tgt_mask hides the padding but not the future: combine it with subsequent_mask using `&`",
            _batch(tgt_mask="(self.tgt != pad).unsqueeze(-2).expand(-1, self.tgt.size(-1), -1)")),
        "ntokens_from_tgt": Mistake(
            "ntokens counts the decoder input tgt; the loss is taken over the labels, so count non-pad tgt_y",
            _batch(counted="self.tgt")),
        "ignores_pad_argument": Mistake(
            "the padding id 2 is hard-coded: use the `pad` argument",
            _batch(pad="2", tgt_mask="(self.tgt != 2).unsqueeze(-2) & causal")),
    },
    "ch04.masked_softmax": {
        "neg_inf_nan_rows": Mistake(
            "hidden scores are filled with -inf: a row with every entry hidden becomes NaN; fill with "
            "torch.finfo(scores.dtype).min",
            _MASKED_SOFTMAX.format(body="scores = scores.masked_fill(mask == 0, float('-inf'))")),
        "fill_minus_1e9": Mistake(
            "hidden scores are filled with -1e9, which float16 cannot hold (its range ends at -65504); fill "
            "with torch.finfo(scores.dtype).min",
            _MASKED_SOFTMAX.format(body="scores = scores.masked_fill(mask == 0, -1e9)")),
        "additive_mask": Mistake(
            "a large negative number is added to hidden scores instead of replacing them: a fully hidden row "
            "keeps its old ranking, and the addition can change the dtype; use masked_fill",
            _MASKED_SOFTMAX.format(body="scores = scores + (mask == 0) * -1e9")),
        "mask_after_softmax": Mistake(
            "the weights are zeroed after the softmax: the rows no longer sum to 1",
            _MASKED_SOFTMAX.format(body="return scores.softmax(dim=-1).masked_fill(mask == 0, 0.0)")),
        "inverted_mask": Mistake(
            "the mask is inverted: entries where mask == 1 were hidden instead of those where mask == 0",
            _MASKED_SOFTMAX.format(body="scores = scores.masked_fill(mask != 0, torch.finfo(scores.dtype).min)")),
    },
}


@functools.cache
def mistake_function(exercise_id: str, name: str, attr: str):
    """The callable a declared mistake defines (compiled here, in the harness, from our own code)."""
    namespace: dict = {}
    exec(compile(_PRELUDE + MISTAKES[exercise_id][name].source, f"mistake {name}", "exec"), namespace)  # noqa: S102
    return namespace[attr]


def submission_source(exercise_id: str, name: str) -> str:
    """The mistake as a student's answer cell (imports included), for fixtures and demos."""
    return _PRELUDE + MISTAKES[exercise_id][name].source.lstrip("\n")
