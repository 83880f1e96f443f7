"""The graded test cell's entry point: ``grade_in_notebook(exercise_id, globals())``.

It runs when a student runs their own notebook (``nbgrader autograde`` with the course's
configuration runs no cell: ``nbgrader_plugin`` grades the graded cells without a kernel). It
grades with the same harness as ``python -m autograder grade``: the answer's source is
taken from the notebook file on disk (a notebook's kernel starts in the notebook's folder),
else from the kernel's input history, and runs in a sandboxed worker. Objects in the kernel's namespace are never called, so a notebook that patched
them earlier cannot change the verdict. The points are returned (the cell's last
expression, which nbgrader records as partial credit); the feedback goes to stdout and
nothing to stderr. The kernel's random number generators are left as they were
(``grade_path`` restores torch's), so the cells after a graded cell draw the same numbers
whether or not it ran.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import nbformat

from autograder.registry import by_id


def _source_notebook(exercise_id: str, namespace: dict, scratch: Path) -> Path:
    """A notebook file holding the answer: the one on disk, else one built from ``In``."""
    exercise = by_id(exercise_id)
    on_disk = Path.cwd() / exercise.notebook
    if on_disk.is_file():
        # Chapter 12 is graded on the student's whole course: the chapter folders beside this one.
        return Path.cwd().parent if exercise.runner else on_disk
    history = namespace.get("In") or namespace.get("_ih") or []
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(str(src)) for src in history if src])
    path = scratch / exercise.notebook
    nbformat.write(nb, path)
    return path


def grade_in_notebook(exercise_id: str, namespace: dict) -> float:
    """Grade one exercise of the running notebook; print the feedback; return the points."""
    from autograder.grade import grade_path
    from autograder.results import table

    buffer = io.StringIO()
    points = 0.0
    # Anything the harness would say on stderr (warnings included) goes to stdout instead:
    # nbgrader scores a test cell 0 when it writes to stderr.
    with contextlib.redirect_stderr(buffer), warnings.catch_warnings(), \
            tempfile.TemporaryDirectory(prefix="grade-hook-") as scratch:
        warnings.simplefilter("ignore")
        try:
            report = grade_path(_source_notebook(exercise_id, namespace, Path(scratch)), only=exercise_id)
            points = report.exercise_score(exercise_id)
            print(table(report), file=buffer)
        except Exception:  # noqa: BLE001 - the cell must still print something useful
            print("autograder error (not your fault):\n" + traceback.format_exc(limit=3), file=buffer)
    sys.stdout.write(buffer.getvalue())
    return float(points)
