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
