"""Grade an answer's source in this process, through the worker's own request handler.

``grade_source(exercise, source, seed)`` runs every graded case as ``grade.ExerciseRun`` does: the
request is built by ``grade.build_request`` and crosses as JSON and bytes, the worker's ``respond``
answers it (the code a sandboxed worker runs, here without the process around it) and
``grade._judge`` scores the reply against the reference. Only our own answers (declared mistakes,
alternatives, mutants) are graded this way: it is the cheap path for the registry-wide tests, the
sandboxed one is tested on real notebooks in ``test_grader_submissions``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass

import torch

from autograder.sandboxed import __main__ as worker_main
from autograder.sandboxed import procedure
from autograder.cases import case_points, graded_cases
from autograder.exercises.shared import Exercise, resolve
from autograder.extract import Extraction
from autograder.grade import _case_name, _judge, _policy, _record, build_request
from autograder.results import TestResult

PRELUDE = "import math\nimport torch\n"


@dataclass
class Graded:
    """What an answer scored: its lines (``TestResult``), in case order."""

    exercise: Exercise
    lines: list[TestResult]

    @property
    def score(self) -> float:
        return round(sum(t.score for t in self.lines), 2)

    @property
    def share(self) -> float:
        return self.score / self.exercise.points

    def failed(self) -> list[TestResult]:
        """The lines that failed: cases that lost points, and a failed policy line (worth none)."""
        return [t for t in self.lines if t.status == "failed"]

    def says(self, words: str) -> bool:
        """Whether a failed line names ``words`` (in its name or its feedback)."""
        return any(words in t.name or words in t.output for t in self.failed())


def _provided(exercise: Exercise) -> dict:
    """The prerequisites, as the worker receives them (here: the reference package's own objects)."""
    found = {}
    for target in exercise.prerequisites:
        module, _, attr = target.partition(":")
        found[attr] = getattr(importlib.import_module(module), attr)
    return found


class Session:
    """The requests of an exercise's cases on one seed, and the reference's records, computed once for
    every answer graded with them (they do not depend on the answer)."""

    def __init__(self, exercise: Exercise, seed: int) -> None:
        self.exercise, self.seed = exercise, seed
        self.reference = resolve(exercise.reference)
        self.cases = graded_cases(exercise, seed)
        self.weights = case_points(exercise.points, self.cases)
        self._made: dict[int, tuple] = {}

    def case(self, number: int) -> tuple:
        """``(request as JSON data, buffers, state, the reference's record)`` of case ``number``."""
        if number not in self._made:
            case, seed = self.cases[number], self.seed + number
            request, buffers, state = build_request(self.exercise, case, self.reference, seed)
            with torch.random.fork_rng(devices=[]):
                expected = _record(self.exercise, self.reference, case, state, seed)
            self._made[number] = json.dumps(request), buffers, state, expected
        return self._made[number]


_SESSIONS: dict[tuple[str, int], Session] = {}


def grade_source(exercise: Exercise, source: str, seed: int, diagnose: tuple[str, ...] | None = None) -> Graded:
    """Every graded case of ``exercise`` on the answer cell ``source`` (``math`` and ``torch`` imported).

    ``diagnose`` names the declared mistakes a failed case is compared with (``None``: all of them, as
    the grader does; fewer is faster where only some can matter)."""
    if diagnose is not None:
        exercise = dataclasses.replace(exercise, mistakes={n: exercise.mistakes[n] for n in diagnose})
    namespace: dict = {"__name__": "submission"}
    convolution = (torch.conv1d, torch.nn.functional.conv1d)
    procedure.marks("conv1d")[0]()  # before the answer runs, as in the worker: `import conv1d` gets it
    try:
        exec(compile(PRELUDE + source, f"answer to {exercise.id}", "exec"), namespace)  # noqa: S102 - our own
        return _graded(exercise, source, seed, namespace)
    finally:
        torch.conv1d, torch.nn.functional.conv1d = convolution


def _graded(exercise: Exercise, source: str, seed: int, namespace: dict) -> Graded:
    provided = _provided(exercise)
    namespace.update(provided)  # as the worker does: prerequisites are the reference's
    import tfm_solution

    classes = {**{n: getattr(tfm_solution, n) for n in tfm_solution.__all__}, **provided}
    session = _SESSIONS.setdefault((exercise.id, seed), Session(exercise, seed))
    saved = (torch.nn.functional.dropout, torch.dropout)
    dropout = procedure.FixedDropout()
    lines = []
    try:
        with torch.random.fork_rng(devices=[]):
            for number, case in enumerate(session.cases):
                request, buffers, state, expected = session.case(number)
                try:
                    reply, out = worker_main.respond(namespace, exercise.name, json.loads(request), buffers, classes,
                                              1 << 28, dropout)
                finally:
                    torch.nn.functional.dropout, torch.dropout = saved
                reply = json.loads(json.dumps(reply, allow_nan=False))
                lines.append(_judge(exercise, case, _case_name(exercise, case), session.weights[number],
                                    session.reference, reply, out, state, seed + number, expected))
    finally:
        torch.nn.functional.dropout, torch.dropout = saved
    policy = _policy(exercise, Extraction(chunks=[{"source": source, "label": "answer"}], answer_source=source))
    return Graded(exercise, lines + ([policy] if policy else []))
