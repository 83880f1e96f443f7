"""The learning-rate schedule of the paper ("Noam"): linear warm-up, then inverse square root decay.

    lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
"""

from __future__ import annotations


def rate(step: int, model_size: int, factor: float, warmup: int) -> float:
    """Learning rate at optimizer ``step`` (1-based; step 0 is treated as 1).

    Meant as a ``torch.optim.lr_scheduler.LambdaLR`` multiplier, so the optimizer's
    base learning rate must be 1. The peak, ``factor * (model_size * warmup)^-0.5``,
    is reached at ``step == warmup``.
    """
    step = max(step, 1)
    return factor * (model_size ** (-0.5) * min(step ** (-0.5), step * warmup ** (-1.5)))
