"""Chapter 9 grading: ``LabelSmoothing`` and ``rate``."""

from __future__ import annotations

import torch

from autograder.exercises.shared import Case, Exercise, Mistake, dim, generators, randn, variants

CHAPTER, NOTEBOOK = "09_training", "training.ipynb"

# KL divergences summed over up to a few hundred float32 terms: nn.KLDivLoss and the reference's
# xlogy form agree to ~1e-6 relative; the declared mistakes are off by several percent at least.
_KL_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _targets(gen: torch.Generator, n: int, size: int, pad: int, padded: int) -> torch.Tensor:
    """``(n,)`` label ids in ``0 .. size-1``: ``padded`` of them (at random places) are ``pad``, the rest are not."""
    ids = torch.randint(0, size - 1, (n,), generator=gen)
    ids = ids + (ids >= pad).long()  # real labels never equal the padding id
    where = torch.randperm(n, generator=gen)[:padded]
    ids[where] = pad
    return ids


def _log_probs(gen: torch.Generator, n: int, size: int, scale: float = 2.0) -> torch.Tensor:
    return randn(gen, n, size, scale=scale).log_softmax(-1)


def label_smoothing_cases(seed: int) -> list[Case]:
    """``LabelSmoothing(size, padding_idx, smoothing)``: the summed KL divergence on log-probabilities."""
    pub, gen = generators(seed)
    cases = [Case("size 6, padding 2, smoothing 0.4", "the summed KL divergence of 5 rows, one labelled with "
                  "padding (public)", True, (_log_probs(pub, 5, 6), torch.tensor([4, 2, 0, 5, 1])),
                  construct=(6, 2, 0.4), **_KL_TOL)]
    size, n = dim(gen, 8, 40), dim(gen, 10, 30)
    cases.append(Case("a random vocabulary", "ε spread over size - 2 classes, padding column and padded rows at 0",
                      False, (_log_probs(gen, n, size), _targets(gen, n, size, 2, dim(gen, 2, 5))),
                      construct=(size, 2, 0.1), **_KL_TOL))
    size, n, pad = dim(gen, 6, 20), dim(gen, 6, 16), dim(gen, 0, 1)
    cases.append(Case("another padding id", "`padding_idx` is an argument (here not 2)", False,
                      (_log_probs(gen, n, size), _targets(gen, n, size, pad, 2)), construct=(size, pad, 0.2),
                      **_KL_TOL))
    size, n = dim(gen, 6, 20), dim(gen, 4, 12)
    cases.append(Case("no smoothing", "smoothing 0: the summed negative log-likelihood of the real labels", False,
                      (_log_probs(gen, n, size), _targets(gen, n, size, 2, 1)), construct=(size, 2, 0.0), **_KL_TOL))
    size, n = dim(gen, 6, 20), dim(gen, 4, 12)
    cases.append(Case("no padded label", "every row is a real label", False,
                      (_log_probs(gen, n, size), _targets(gen, n, size, 2, 0)), construct=(size, 2, 0.3), **_KL_TOL))
    size, n = dim(gen, 500, 2000), dim(gen, 40, 80)
    cases.append(Case("a large vocabulary", "hundreds of classes share ε; dozens of positions are summed", False,
                      (_log_probs(gen, n, size, scale=3.0), _targets(gen, n, size, 2, dim(gen, 5, 15))),
                      construct=(size, 2, 0.1), **_KL_TOL))
    return cases


def rate_cases(seed: int) -> list[Case]:
    """``rate(step, model_size, factor, warmup)``: one float per call."""
    _, gen = generators(seed)
    d, warmup = 2 ** dim(gen, 6, 10), 100 * dim(gen, 5, 60)
    factor = float(dim(gen, 1, 8)) / 4
    return [
        Case("step 1 of the paper's setting", "rate(1, 512, 1.0, 4000): the first warm-up step (public)", True,
             (1, 512, 1.0, 4000)),
        Case("step 0", "step 0 counts as step 1 (LambdaLR asks for it when it is created)", False,
             (0, d, factor, warmup)),
        Case("during the warm-up", "the linear ramp, step * warmup^-1.5", False,
             (dim(gen, 2, warmup - 1), d, factor, warmup)),
        Case("at the peak", "step == warmup: factor * (d_model * warmup)^-0.5", False, (warmup, d, factor, warmup)),
        Case("after the warm-up", "the 1/sqrt(step) decay", False, (warmup + dim(gen, 1, 20 * warmup), d, factor, warmup)),
        Case("a long run", "hundreds of thousands of steps, another factor", False,
             (dim(gen, 100_000, 500_000), d, 2 * factor, warmup)),
    ]


_label_smoothing = variants('''
from torch import nn


class LabelSmoothing(nn.Module):
    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        self.criterion = nn.KLDivLoss(reduction={reduction})
        self.padding_idx = padding_idx
        self.confidence = 1.0 - smoothing
        self.smoothing = smoothing
        self.size = size
        self.true_dist = None

    def forward(self, x, target):
        true_dist = x.detach().clone()
        true_dist.fill_(self.smoothing / ({share}))
        true_dist.scatter_(1, target.unsqueeze(1), self.confidence)
        {pad_column}
        {pad_rows}
        self.true_dist = true_dist
        return {loss}
''', reduction='"sum"', share="self.size - 2", pad_column="true_dist[:, self.padding_idx] = 0",
                            pad_rows="true_dist[target == self.padding_idx] = 0", loss="self.criterion(x, true_dist)")

_rate = variants('''
def rate(step, model_size, factor, warmup):
    {guard}
    return factor * ({scale} * {pick}(step ** (-0.5), step * warmup ** ({exponent})))
''', guard="step = max(step, 1)", scale="model_size ** (-0.5)", pick="min", exponent="-1.5")

EXERCISES = (
    Exercise(
        id="ch09.label_smoothing",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="LabelSmoothing",
        kind="module",
        signature="LabelSmoothing(size, padding_idx, smoothing=0.0); forward(x, target) -> summed KL divergence",
        points=5,
        solution_grade_id="ch09-label-smoothing",
        test_grade_id="ch09-label-smoothing-tests",
        reference="tfm_solution.training:LabelSmoothing",
        cases=label_smoothing_cases,
        mistakes={
            "share_over_size_minus_1": Mistake(
                "ε is spread as smoothing / (size - 1): it is shared by size - 2 classes (every class but the "
                "label and the padding class), so each gets smoothing / (size - 2)",
                _label_smoothing(share="self.size - 1")),
            "padding_column_kept": Mistake(
                "the padding column of the target is not 0: the model must never be taught to predict padding",
                _label_smoothing(pad_column="pass")),
            "padded_rows_kept": Mistake(
                "rows whose label is padding are not all zero: padded positions must add nothing to the loss",
                _label_smoothing(pad_rows="pass")),
            "mean_reduction": Mistake(
                "the KL divergence is averaged (reduction='mean'); the notes sum it (reduction='sum') and "
                "SimpleLossCompute divides by ntokens",
                _label_smoothing(reduction='"mean"')),
            "cross_entropy_not_kl": Mistake(
                "this is the cross-entropy against the smoothed target, -sum q log p; the KL divergence also "
                "subtracts the target's entropy: sum q (log q - log p)",
                _label_smoothing(loss="-(true_dist * x).sum()")),
        },
        time_budget_s=2.0,
    ),
    Exercise(
        id="ch09.rate",
        chapter=CHAPTER,
        notebook=NOTEBOOK,
        name="rate",
        kind="function",
        signature="rate(step, model_size, factor, warmup) -> float",
        points=3,
        solution_grade_id="ch09-rate",
        test_grade_id="ch09-rate-tests",
        reference="tfm_solution.schedule:rate",
        cases=rate_cases,
        mistakes={
            "step_zero_unguarded": Mistake(
                "step 0 is not treated as step 1: 0 ** -0.5 divides by zero (LambdaLR asks for step 0 when it "
                "is created)",
                _rate(guard="pass")),
            "warmup_exponent": Mistake(
                "the warm-up term uses warmup ** -0.5: it is step * warmup ** -1.5, so that the two terms meet "
                "at step == warmup",
                _rate(exponent="-0.5")),
            "max_not_min": Mistake(
                "max instead of min: the rate must follow the smaller of the two terms (the ramp, then the decay)",
                _rate(pick="max")),
            "no_model_size_scale": Mistake(
                "the factor d_model ** -0.5 is missing: wider models need smaller rates",
                _rate(scale="1.0")),
        },
        time_budget_s=1.0,
    ),
)
