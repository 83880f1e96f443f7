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
