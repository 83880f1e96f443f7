"""Wrong answers that once kept (nearly) full marks: each now loses points on the cases written for it, and
the feedback names its declared mistake.

* chapter 7: a Post-LN ``SublayerConnection`` without dropout kept 4/4, because the training-mode cases (fixed
  dropout masks) only built the Pre-LN form; ``no_dropout`` (dropout in neither form) now names it;
* chapter 9: a ``LabelSmoothing`` that zeroes column 2 (a padding column hard-coded as 2, besides
  ``padding_idx`` or instead of it) kept 92%, because a single case had another padding id.
"""

from __future__ import annotations

import pytest

from autograder.cases import graded_cases
from autograder.exercises.shared import MUTANT_CEILING
from autograder.registry import by_id

from .grader_fixtures.inprocess import grade_source

SEEDS = (5, 7)

_SUBLAYER = '''
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        return self.a_2 * (x - mean) / (x.std(-1, keepdim=True) + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout, norm_position="pre"):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)
        self.norm_position = norm_position

    def forward(self, x, sublayer):
        if self.norm_position == "post":
            return self.norm(x + sublayer(x))
        return x + self.dropout(sublayer(self.norm(x)))
'''

_LABEL_SMOOTHING = '''
from torch import nn


class LabelSmoothing(nn.Module):
    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        self.criterion = nn.KLDivLoss(reduction="sum")
        self.padding_idx = padding_idx
        self.confidence = 1.0 - smoothing
        self.smoothing = smoothing
        self.size = size
        self.true_dist = None

    def forward(self, x, target):
        true_dist = x.detach().clone()
        true_dist.fill_(self.smoothing / (self.size - 2))
        true_dist.scatter_(1, target.unsqueeze(1), self.confidence)
        {columns}
        true_dist[target == self.padding_idx] = 0
        self.true_dist = true_dist
        return self.criterion(x, true_dist)
'''

COLUMN_2 = {
    "also_column_2": _LABEL_SMOOTHING.format(columns="true_dist[:, self.padding_idx] = 0\n        true_dist[:, 2] = 0"),
    "column_2_instead": _LABEL_SMOOTHING.format(columns="true_dist[:, 2] = 0"),
}


def _post(case) -> bool:
    """A case that builds the Post-LN form."""
    return case.construct is not None and case.construct[2:] == ("post",)


def _pre(case) -> bool:
    """A case that builds the Pre-LN form."""
    return case.construct is not None and case.construct[2:] != ("post",)


def _failed_where(graded, cases, chosen) -> list[bool]:
    """For each case that ``chosen`` picks, whether the answer's line for it failed (lines are in case order)."""
    return [line.status == "failed" for line, case in zip(graded.lines, cases, strict=False) if chosen(case)]


@pytest.mark.parametrize("seed", SEEDS)
def test_post_ln_without_dropout_loses_points_and_is_named(seed):
    exercise = by_id("ch07.SublayerConnection")
    cases = graded_cases(exercise, seed)
    post_train = [c for c in cases if c.train and _post(c)]
    assert any(c.public for c in post_train) and any(not c.public for c in post_train)
    graded = grade_source(exercise, _SUBLAYER, seed)
    assert graded.share < MUTANT_CEILING, graded.score
    assert all(_failed_where(graded, cases, lambda c: c.train and _post(c)))
    assert not any(_failed_where(graded, cases, _pre))
    assert graded.says("**Diagnosis: no_dropout**"), [t.output for t in graded.failed()]


@pytest.mark.filterwarnings("ignore:reduction. .mean. divides")  # the diagnosis runs mean_reduction too
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(COLUMN_2))
def test_a_padding_column_hard_coded_as_2_scores_nothing_where_padding_is_another_id(name, seed):
    exercise = by_id("ch09.label_smoothing")
    cases = graded_cases(exercise, seed)

    def elsewhere(case) -> bool:
        """A case whose padding id is not 2 and where class 2 is the label of a row."""
        return (case.construct is not None and not case.structure and case.construct[1] != 2
                and bool((case.args[1] == 2).any()))

    chosen = [c for c in cases if elsewhere(c)]
    assert any(c.public for c in chosen) and sum(not c.public for c in chosen) >= 2
    assert any("true_dist" in c.keep for c in chosen if c.public)
    assert any("true_dist" in c.keep for c in chosen if not c.public)
    graded = grade_source(exercise, COLUMN_2[name], seed)
    assert graded.share < MUTANT_CEILING, graded.score
    assert all(_failed_where(graded, cases, elsewhere))
    assert graded.says("**Diagnosis: padding_hard_coded_as_2**"), [t.output for t in graded.failed()]
