"""The results of a grading run: its lines, Gradescope's ``results.json`` and a readable table.

The harness writes results once, after every worker is dead, to a path no worker can
see. The JSON schema below is the subset of Gradescope's format we emit; every file we
write is validated against it in the self-tests.

A report is English inside. Its ``language`` is the language the graded notebook records: for "zh" the
results and the table are rendered in Chinese (``autograder.feedback_zh``), names and feedback alike, and
``results.json`` keeps the English the grader wrote in ``extra_data["english"]``, for the tools that read
the grader's own words (the class report, ``graded``).
"""

from __future__ import annotations

import json
import os
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from autograder.feedback import clean, fenced
from autograder.feedback_zh import render

ERROR_NOTE = "autograder error (not your fault)"
ERROR_TEST = ERROR_NOTE
UNISOLATED_PREFIX = "process group and resource limits only"  # how ``sandbox.isolation`` says so
NOT_GRADED = ("**Not graded yet**: the grader could not run {n} case(s) of this submission, even after trying "
              "again (its fault, not yours). The score below leaves them out; your instructor has been told and "
              "will grade it again.")


@dataclass
class TestResult:
    """One line of the results: Gradescope's test fields."""

    __test__ = False  # not a pytest class, despite the name
    name: str
    score: float
    max_score: float
    output: str
    visibility: str = "visible"
    passed: bool | None = None  # for 0-point lines (policy, performance); else score decides
    not_graded: bool = False  # the grader could not run this case (its fault): no grade, not a lost point

    @property
    def status(self) -> str:
        ok = self.score >= self.max_score if self.passed is None else self.passed
        return "passed" if ok else "failed"


def split_points(points: float, parts: int) -> list[float]:
    """``points`` shared among ``parts`` cases: whole cents that add up to ``points`` exactly.

    Largest remainder: each case gets its quota rounded down to the cent, and the cents left
    over go one each to the cases with the largest remainders; all quotas are equal here, so
    those are the first cases. ``split_points(4, 3) == [1.34, 1.33, 1.33]``.
    """
    cents = round(points * 100)
    base, left = divmod(cents, parts)
    return [(base + (i < left)) / 100 for i in range(parts)]


@dataclass
class Report:
    """Everything a grading run found: per-test results plus run-level facts."""

    tests: list[TestResult] = field(default_factory=list)
    seeds: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    execution_time: float = 0.0
    sandbox: str = ""
    language: str = "en"  # the language the graded notebook records: "zh" renders the feedback in Chinese

    # Every score is a whole number of cents (see split_points): rounding the float sum to
    # cents gives the exact total.
    @property
    def score(self) -> float:
        return round(sum(t.score for t in self.tests), 2)

    @property
    def max_score(self) -> float:
        return round(sum(t.max_score for t in self.tests), 2)

    def exercise_score(self, exercise_id: str) -> float:
        return round(sum(t.score for t in self.tests if t.name.startswith(exercise_id + " ")), 2)

    @property
    def not_graded(self) -> list[str]:
        """The cases the grader could not run after retrying: while there are any, the run is no grade."""
        return [t.name for t in self.tests if t.not_graded]


GRADESCOPE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["score", "execution_time", "output", "tests"],
    "additionalProperties": False,
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "execution_time": {"type": "number", "minimum": 0},
        "output": {"type": "string"},
        "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "visibility": {"enum": ["visible", "hidden", "after_due_date", "after_published"]},
        "stdout_visibility": {"enum": ["visible", "hidden", "after_due_date", "after_published"]},
        "extra_data": {"type": "object"},
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "score", "max_score", "status", "output", "visibility"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "score": {"type": "number", "minimum": 0},
                    "max_score": {"type": "number", "minimum": 0},
                    "status": {"enum": ["passed", "failed"]},
                    "output": {"type": "string"},
                    "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
                    "visibility": {"enum": ["visible", "hidden", "after_due_date", "after_published"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


def to_gradescope(report: Report) -> dict:
    """The results dictionary Gradescope reads, in the report's language (see the module's docstring)."""
    summary = f"Score: {report.score:g} / {report.max_score:g}"
    extra = {"seeds": report.seeds, "max_score": report.max_score, "sandbox": report.sandbox}
    if report.not_graded:
        summary = NOT_GRADED.format(n=len(report.not_graded)) + "\n\n" + summary
        extra["not_graded"] = report.not_graded
    output = "\n\n".join([summary, *report.notes])
    tests = [_test(t) for t in report.tests]
    if report.language != "en":
        extra["language"] = report.language
        extra["english"] = {"output": output, "tests": [{"name": t["name"], "output": t["output"]} for t in tests]}
        output = render(output, report.language)
        for test in tests:
            test["name"], test["output"] = render(test["name"], report.language), render(test["output"],
                                                                                          report.language)
    return {
        "score": report.score,
        "execution_time": round(report.execution_time, 3),
        "output": output,
        "output_format": "md",
        "stdout_visibility": "hidden",
        "extra_data": extra,
        "tests": tests,
    }


def graded(results: dict) -> dict:
    """``results`` (as ``to_gradescope`` made them) with the grader's own English words: for a report rendered in
    another language, its names and feedback as the grader wrote them (``extra_data["english"]``)."""
    english = (results.get("extra_data") or {}).get("english")
    if not isinstance(english, dict) or len(english.get("tests") or []) != len(results.get("tests") or []):
        return results
    tests = [{**test, "name": own.get("name", test.get("name")), "output": own.get("output", test.get("output"))}
             for test, own in zip(results["tests"], english["tests"])]
    return {**results, "output": english.get("output", results.get("output")), "tests": tests}


def _test(test: TestResult) -> dict:
    return {"name": test.name, "score": round(test.score, 2), "max_score": round(test.max_score, 2),
            "status": test.status, "output": test.output, "output_format": "md", "visibility": test.visibility}


GRADER_FAILED = "The autograder failed; your instructor has been shown the error."


def error_results(message: str, execution_time: float = 0.0) -> dict:
    """Results for a run in which the grader itself failed: still valid, still visible. The message
    (a traceback, a reason) may quote the submission: it is shown as code. The run may have failed before the
    notebook's language was read, so the verdict is given in both languages (the line keeps the name the class
    report looks for)."""
    both = [GRADER_FAILED, render(GRADER_FAILED, "zh")]
    return {"score": 0.0, "execution_time": round(execution_time, 3),
            "output": "\n\n".join(dict.fromkeys(both)), "output_format": "md",
            "tests": [{"name": ERROR_TEST, "score": 0.0, "max_score": 0.0, "status": "failed",
                       "output": fenced(message[-4000:], 4000), "output_format": "md", "visibility": "visible"}]}


def write_results(results: dict, path: str | os.PathLike) -> None:
    """Write atomically (temp file + rename), so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-")
    with os.fdopen(fd, "w") as handle:
        json.dump(_cleaned(results), handle, indent=2)
    os.replace(tmp, path)


def _cleaned(value):
    """``value`` (JSON data) with every string cleaned of control characters (``feedback.clean``)."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k): _cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    return value


def _width(text: str) -> int:
    """Columns ``text`` takes in a terminal: a CJK character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int, right: bool = False) -> str:
    space = " " * max(width - _width(text), 0)
    return space + text if right else text + space


def table(report: Report) -> str:
    """A fixed-width table of the tests, followed by the feedback of each failed one, in the report's language."""
    words = TABLE_WORDS.get(report.language, TABLE_WORDS["en"])

    def say(text: str) -> str:
        return render(text, report.language)

    rows = [(say(t.name), f"{t.score:g}/{t.max_score:g}", words["ok"] if t.status == "passed" else words["FAIL"])
            for t in report.tests]
    width = max([_width(r[0]) for r in rows] + [20])
    rule = "-" * (width + 19)
    lines = [f"{_pad(words['test'], width)}  {_pad(words['points'], 9, True)}  {words['status']}", rule]
    lines += [f"{_pad(n, width)}  {p:>9}  {s}" for n, p, s in rows]
    lines += [rule, f"{_pad(words['total'], width)}  {f'{report.score:g}/{report.max_score:g}':>9}"]
    if report.not_graded:
        lines.append(say(NOT_GRADED.format(n=len(report.not_graded))).replace("**", ""))
    if report.sandbox.startswith(UNISOLATED_PREFIX):
        lines.append(say(f"Note: graded without the sandbox's isolation ({report.sandbox})."))
    details = [f"\n## {say(t.name)}\n{say(t.output)}" for t in report.tests
               if t.status == "failed" or t.name.endswith(" notes")]
    notes = [say(note) for note in report.notes]
    return clean("\n".join(lines + details + ([""] + notes if notes else [])))


TABLE_WORDS = {
    "en": {"test": "test", "points": "points", "status": "status", "ok": "ok", "FAIL": "FAIL", "total": "total"},
    "zh": {"test": "测试", "points": "得分", "status": "结果", "ok": "通过", "FAIL": "未通过", "total": "总分"},
}
"""The table's own words in each language."""
