"""The graded tests: pytest collects one test per case of every exercise being graded.

pytest runs here, in the harness, never in a worker: in-process, with its own rootdir and
an empty configuration, no conftest, no plugins from the environment and no output. Each
test asks the exercise's run for one case's result (judged from the worker's returned
data) and asserts on it; a case earns its points exactly when its test passes. Nothing the
submission contains is ever collected as a test.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from dataclasses import dataclass

import pytest

from autograder.results import ERROR_NOTE, TestResult


@dataclass(frozen=True)
class GradedCase:
    """Case ``number`` of the exercise run ``run`` (an ``autograder.grade.ExerciseRun``)."""

    run: object
    number: int

    def __str__(self) -> str:
        return f"{self.run.exercise.id}-{self.number}"


def test_graded_case(graded_case: GradedCase) -> None:
    result = graded_case.run.case_result(graded_case.number)
    assert result.score >= result.max_score, result.output


class _Plugin:
    """Parametrizes the test with the cases and records each one's verdict."""

    def __init__(self, cases: list[GradedCase]) -> None:
        self.cases = cases
        self.outcomes: dict[str, tuple[str, str]] = {}

    def pytest_generate_tests(self, metafunc) -> None:
        if "graded_case" in metafunc.fixturenames:
            metafunc.parametrize("graded_case", self.cases, ids=[str(c) for c in self.cases])

    def pytest_runtest_logreport(self, report) -> None:
        key = report.nodeid.rsplit("[", 1)[-1].rstrip("]")
        if report.when == "call" or report.outcome != "passed":
            self.outcomes.setdefault(key, (report.outcome, report.longreprtext[-1500:]))


def run_checks(runs: list) -> None:
    """Run every case of ``runs`` as pytest tests; scores follow pytest's verdicts."""
    cases = [GradedCase(run, number) for run in runs for number in range(len(run.cases))]
    if not cases:
        return
    plugin = _Plugin(cases)
    saved = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # nothing installed in the environment joins in
    try:
        with tempfile.TemporaryDirectory(prefix="grade-pytest-") as root, \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ini = os.path.join(root, "pytest.ini")
            with open(ini, "w") as handle:
                handle.write("[pytest]\n")
            pytest.main([__file__, "-c", ini, "--rootdir", root, "--noconftest", "--import-mode=importlib", "-q",
                         "-s", "-p", "no:cacheprovider", "-p", "no:faulthandler", "-W", "ignore"], plugins=[plugin])
    finally:
        if saved is None:
            os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
        else:
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = saved
    for case in cases:
        outcome, text = plugin.outcomes.get(str(case), ("not run", ""))
        result = case.run.results.get(case.number)
        if result is None:
            case.run.results[case.number] = TestResult(case.run.name(case.number), 0.0, case.run.weights[case.number],
                                                       f"{ERROR_NOTE}: this case {outcome}.\n\n```\n{text}\n```",
                                                       not_graded=True)
        elif outcome != "passed":
            result.score = 0.0
