"""``clones``: N independent deep copies of a module (used by every stack in the model)."""

from __future__ import annotations

import copy

from torch import nn


def clones(module: nn.Module, N: int) -> nn.ModuleList:
    """Return ``N`` deep copies of ``module`` that share no parameters."""
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])
