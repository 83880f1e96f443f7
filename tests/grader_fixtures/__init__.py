"""Submissions for the grader's self-tests, built with nbformat (nothing hostile is stored).

``notebook(...)`` lays out a chapter-3 notebook the way the release does: an import cell,
each answer in a cell with the answer ``grade_id``, each graded test cell after it.
``guarded(condition)`` is an ``attention`` that answers correctly only if ``condition``
holds inside the worker: a hostile probe (can I see the network, the reference, a
secret?) that would earn points exactly when the sandbox leaks.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from autograder.mistakes import submission_source
from autograder.registry import by_id

ATTENTION = submission_source("ch03.attention", "missing_scale").replace(
    "torch.matmul(query, key.transpose(-2, -1))\n", "torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)\n")
SATURATION = submission_source("ch03.softmax_saturation", "min_instead_of_max").replace(".min(", ".max(")
STUB_ATTENTION = "def attention(query, key, value, mask=None, dropout=None):\n    # YOUR CODE HERE\n" \
                 "    raise NotImplementedError()\n"
STUB_SATURATION = "def softmax_saturation(query, key, scaled=True):\n    # YOUR CODE HERE\n" \
                  "    raise NotImplementedError()\n"


def answer_cell(source: str, grade_id: str | None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    if grade_id:
        cell.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": grade_id,
                                     "schema_version": 3, "task": False}
    return cell


def graded_cell(exercise_id: str) -> nbformat.NotebookNode:
    exercise = by_id(exercise_id)
    cell = nbformat.v4.new_code_cell(
        f"# Hidden tests: the grader checks `{exercise.name}` on fresh random inputs against the reference.\n"
        f"### BEGIN HIDDEN TESTS\nfrom autograder.hook import grade_in_notebook\n"
        f'grade_in_notebook("{exercise_id}", globals())\n### END HIDDEN TESTS')
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": exercise.points,
                                 "grade_id": exercise.test_grade_id, "schema_version": 3, "task": False}
    return cell


def notebook(attention: str = ATTENTION, saturation: str = SATURATION, *, before=(), after=(),
             metadata: bool = True) -> nbformat.NotebookNode:
    """A chapter-3 submission with these two answers (and extra cells around them)."""
    gid = (lambda exercise_id: by_id(exercise_id).solution_grade_id) if metadata else (lambda _: None)
    cells = [nbformat.v4.new_markdown_cell("# Attention"), nbformat.v4.new_code_cell("import math\nimport torch"),
             *before,
             answer_cell(attention, gid("ch03.attention")), graded_cell("ch03.attention"),
             answer_cell(saturation, gid("ch03.softmax_saturation")), graded_cell("ch03.softmax_saturation"),
             *after]
    return nbformat.v4.new_notebook(cells=cells)


def guarded(condition: str, setup: str = "") -> str:
    """An ``attention`` that is right only when ``condition`` is true in the worker."""
    body = "\n".join("        " + line for line in setup.splitlines())
    return (ATTENTION.replace("def attention(", "def _attention(")
            + "\n\ndef attention(query, key, value, mask=None, dropout=None):\n"
            + "    try:\n" + (body + "\n" if body else "") + f"        leaked = bool({condition})\n"
            + "    except BaseException:\n        leaked = False\n"
            + "    out, p = _attention(query, key, value, mask, dropout)\n"
            + "    return (out, p) if leaked else (out * 0, p * 0)\n")


def write(nb: nbformat.NotebookNode, folder: Path, name: str = "attention.ipynb") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    nbformat.write(nb, path)
    return path
