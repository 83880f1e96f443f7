"""nbgrader glue: recompute the graded cells' outputs outside the student's kernel.

During ``nbgrader autograde`` the graded cells run in the student's kernel, after the
student's own code, which could have replaced ``grade_in_notebook`` or the printing of its
result. This preprocessor runs after ``Execute``: for every graded cell the registry knows,
it grades the notebook's sources with the harness (in this process and its workers, never
in the kernel) and overwrites the cell's outputs with the feedback and the points, which
``SaveAutoGrades`` then records. The points are those ``python -m autograder grade`` gives.

Enable it in ``nbgrader_config.py``::

    from autograder.nbgrader_plugin import autograde_preprocessors
    c.Autograde.autograde_preprocessors = autograde_preprocessors()
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
from nbgrader.converters.autograde import Autograde
from nbgrader.preprocessors import Execute, NbGraderPreprocessor

from autograder.registry import REGISTRY


class GradeOutsideKernel(NbGraderPreprocessor):
    """Overwrite each graded cell's outputs with the harness's feedback and points."""

    def preprocess(self, nb, resources):
        from autograder.grade import grade_path
        from autograder.results import table

        by_test_id = {e.test_grade_id: e for e in REGISTRY}
        graded = [c for c in nb.cells if c.cell_type == "code"
                  and by_test_id.get(c.get("metadata", {}).get("nbgrader", {}).get("grade_id"))]
        if not graded:
            return nb, resources
        with tempfile.TemporaryDirectory(prefix="nbgrader-grade-") as folder:
            sources = nbformat.v4.new_notebook(cells=[nbformat.from_dict(dict(c, outputs=[])) if c.cell_type == "code"
                                                      else c for c in nb.cells])
            for cell in graded:
                exercise = by_test_id[cell.metadata["nbgrader"]["grade_id"]]
                path = Path(folder) / exercise.notebook
                if not path.exists():
                    nbformat.write(sources, path)
                report = grade_path(path, only=exercise.id)
                points = report.exercise_score(exercise.id)
                cell.outputs = [
                    nbformat.v4.new_output("stream", name="stdout", text=table(report) + "\n"),
                    nbformat.v4.new_output("execute_result", {"text/plain": repr(float(points))},
                                           execution_count=cell.get("execution_count")),
                ]
        return nb, resources


def autograde_preprocessors(execute: bool = True) -> list:
    """nbgrader's autograde pipeline with :class:`GradeOutsideKernel` right after ``Execute``.

    ``execute=False`` drops ``Execute`` too: then no student code ever runs in a kernel
    (the feedback notebooks show no outputs except the graded cells').
    """
    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    at = steps.index(Execute)
    return steps[:at] + ([Execute] if execute else []) + [GradeOutsideKernel] + steps[at + 1:]
