"""Declared mistakes, compiled in the harness: classic wrong answers the grader recognises and names.

Each chapter module declares its exercises' mistakes (``Exercise.mistakes``: name ->
``Mistake``). When a submission fails a case, the harness runs the declared mistakes of that
exercise on the same inputs (here, in the trusted process) and, if the submission's output
matches one of them, names it in the feedback. The self-tests submit each one and check
that it fails its exercise and only its exercise.
"""

from __future__ import annotations

import functools

from autograder.exercises.shared import Mistake
from autograder.registry import by_id

_PRELUDE = "import math\nimport torch\n"

@functools.cache
def compiled(mistake: Mistake, attr: str):
    """The callable named ``attr`` that a declared mistake defines (our own code, compiled here)."""
    namespace: dict = {}
    exec(compile(_PRELUDE + mistake.source, f"mistake {attr}", "exec"), namespace)  # noqa: S102
    return namespace[attr]


def mistake_function(exercise_id: str, name: str, attr: str):
    """The callable of the declared mistake ``name`` of a registry exercise."""
    return compiled(by_id(exercise_id).mistakes[name], attr)


def submission_source(exercise_id: str, name: str) -> str:
    """The mistake as a student's answer cell (imports included), for fixtures and demos."""
    return _PRELUDE + by_id(exercise_id).mistakes[name].source.lstrip("\n")
