"""The graded cases of every exercise: inputs drawn fresh from a seed, checked live.

Each chapter module gives its exercises a builder ``(seed) -> list[Case]`` (see
``autograder/exercises``). Public cases use a fixed seed (their inputs may be shown);
hidden cases use the submission's seed, change shapes from one submission to the next,
and are compared with the reference computed in the harness.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from autograder.exercises.shared import Case
from autograder.registry import REGISTRY, Exercise


def graded_cases(exercise: Exercise, seed: int) -> list[Case]:
    """Every case the grader runs for ``exercise`` on ``seed``, in order."""
    return exercise.cases(seed)


CASES: dict[str, Callable[[int], list[Case]]] = {e.id: functools.partial(graded_cases, e) for e in REGISTRY}
