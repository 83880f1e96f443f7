"""nbgrader glue: grade a submitted notebook in the sandbox and never run it in a kernel.

nbgrader's own ``autograde`` runs every cell of a submission in a Jupyter kernel (its ``Execute``
step), as the instructor, with the instructor's files and environment: a cell there can rewrite the
course's grader on disk, replace another student's submission or print secrets into its own
feedback. The course's pipeline has no ``Execute``. In its place :class:`GradeOutsideKernel` grades
each graded cell the registry knows with the harness (in this process and its sandboxed workers)
and writes the feedback and the points as the cell's outputs, which ``SaveAutoGrades`` then
records. The points are those ``python -m autograder grade`` gives. The other code cells are left
with no outputs (nbgrader's ``ClearOutput`` removes the submitted ones, and this step does too, in
case ``--no-execute`` turned that off); :class:`FeedbackNote` says so at the top of the feedback.

``OverwriteReleasedCells`` replaces nbgrader's ``OverwriteCells``: nbgrader records a graded
cell in the gradebook with its hidden tests but releases it without them, so it reported
every submitted test cell as tampered with (nbgrader issue 1961). ``nbgrader_config.py``
enables all three::

    from autograder.nbgrader_plugin import autograde_preprocessors, feedback_preprocessors, sanitize_preprocessors
    c.Autograde.autograde_preprocessors = autograde_preprocessors()
    c.Autograde.sanitize_preprocessors = sanitize_preprocessors()
    c.GenerateFeedback.preprocessors = feedback_preprocessors()
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import nbformat
from nbgrader import utils
from nbgrader.api import MissingEntry
from nbgrader.converters.autograde import Autograde
from nbgrader.converters.generate_feedback import GenerateFeedback
from nbgrader.preprocessors import ClearHiddenTests, Execute, NbGraderPreprocessor, OverwriteCells
from traitlets import Bool

from autograder.registry import REGISTRY


class NotGraded(RuntimeError):
    """This submission cannot be graded here (no sandbox, or cases the grader could not run): nbgrader records
    no points for it and says why, rather than counting the grader's trouble as the student's."""


class GradeOutsideKernel(NbGraderPreprocessor):
    """Write each graded cell's outputs: the harness's feedback and points, from the sandbox, no kernel."""

    allow_unisolated = Bool(False, help="Grade even where workers cannot get the sandbox's allowlist view "
                                        "(only for a class whose code you trust).").tag(config=True)

    def preprocess(self, nb, resources):
        from autograder.grade import grade_path
        from autograder.results import table
        from autograder.sandbox import REQUIRE_ENV, UNISOLATED, unisolated_reason

        if not self.allow_unisolated:
            why = unisolated_reason()
            if why is not None:
                raise NotGraded(UNISOLATED.format(why=why) + " (c.GradeOutsideKernel.allow_unisolated = True)")
            os.environ[REQUIRE_ENV] = "1"

        by_test_id = {e.test_grade_id: e for e in REGISTRY}
        graded = [c for c in nb.cells if c.cell_type == "code"
                  and by_test_id.get(c.get("metadata", {}).get("nbgrader", {}).get("grade_id"))]
        for cell in nb.cells:  # no cell ran, so none shows an output (a submitted one would be the student's word)
            if cell.cell_type == "code" and not any(cell is g for g in graded):
                cell.outputs, cell.execution_count = [], None
        if not graded:
            return nb, resources
        with tempfile.TemporaryDirectory(prefix="nbgrader-grade-") as folder:
            sources = nbformat.v4.new_notebook(cells=[nbformat.from_dict(dict(c, outputs=[])) if c.cell_type == "code"
                                                      else c for c in nb.cells])
            for cell in graded:
                exercise = by_test_id[cell.metadata["nbgrader"]["grade_id"]]
                if exercise.runner:  # chapter 12 is graded with the student's chapters and weights beside it
                    path = _with_course(Path(folder) / "course", resources, exercise, sources,
                                        _submitted_folder(self.config, resources))
                else:
                    path = Path(folder) / exercise.notebook
                    if not path.exists():
                        nbformat.write(sources, path)
                report = grade_path(path, only=exercise.id)
                if report.not_graded:
                    raise NotGraded(f"{exercise.id}: the grader could not run {len(report.not_graded)} case(s) even "
                                    f"after trying again; grade this submission again:\n{table(report)}")
                points = report.exercise_score(exercise.id)
                cell.outputs = [
                    nbformat.v4.new_output("stream", name="stdout", text=table(report) + "\n"),
                    nbformat.v4.new_output("execute_result", {"text/plain": repr(float(points))},
                                           execution_count=cell.get("execution_count")),
                ]
        return nb, resources


def _submitted_folder(config, resources: dict) -> Path | None:
    """The folder of this student's submitted assignments (``submitted/<student>/``), where every chapter
    they handed in is, whichever of them nbgrader has autograded so far; None outside ``autograde``."""
    from nbgrader.coursedir import CourseDirectory

    student = resources.get("nbgrader", {}).get("student")
    if not student:
        return None
    coursedir = CourseDirectory(config=config)
    return Path(coursedir.format_path(coursedir.submitted_directory, student, "x")).parent


def _with_course(course: Path, resources: dict, exercise, sources, submitted: Path | None = None) -> Path:
    """A folder like the student's submission of every chapter: the notebooks of the student's other
    assignments (from ``submitted``: nbgrader autogrades a copy of one assignment in a folder of its own,
    beside only the assignments autograded before it; else the folders beside this one's), this notebook
    as it is now, and its ``my_model`` weights."""
    import shutil

    if not course.exists():
        here = Path(resources.get("metadata", {}).get("path") or ".").resolve()
        beside = submitted if submitted is not None and submitted.is_dir() else here.parent
        for chapter in sorted(p for p in beside.iterdir() if p.is_dir() and p.name != here.name):
            for notebook in chapter.glob("*.ipynb"):
                (course / chapter.name).mkdir(parents=True, exist_ok=True)
                shutil.copy(notebook, course / chapter.name / notebook.name)
        (course / here.name).mkdir(parents=True, exist_ok=True)
        nbformat.write(sources, course / here.name / exercise.notebook)
        weights = here / "my_model" / "model.safetensors"
        if weights.is_file() and not weights.is_symlink():
            (course / here.name / "my_model").mkdir()
            shutil.copy(weights, course / here.name / "my_model" / weights.name)
    return course


#: The first cell of every feedback notebook (Markdown).
FEEDBACK_NOTE = (
    "**How this notebook was graded.** None of its cells was run: each answer was graded in the course's "
    "sandbox, the way `python -m autograder grade` grades it, and each graded cell below shows that grader's "
    "report (every case it checked, with its points) and the points the cell earned. The other code cells "
    "show no output, whatever the notebook held when it was handed in; run the notebook to see them."
)


class FeedbackNote(NbGraderPreprocessor):
    """Put :data:`FEEDBACK_NOTE` at the top of a feedback notebook, unless it is there already."""

    def preprocess(self, nb, resources):
        if not (nb.cells and nb.cells[0].cell_type == "markdown" and nb.cells[0].source == FEEDBACK_NOTE):
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(FEEDBACK_NOTE))
        return nb, resources


class OverwriteReleasedCells(OverwriteCells):
    """nbgrader's ``OverwriteCells``, comparing a locked cell with the cell as it was released.

    A submitted cell equal to the gradebook's cell with its hidden tests removed (what the
    student received) gets the recorded source back silently; any other change is still
    reported, and overwritten, by nbgrader.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is not None and utils.is_locked(cell):
            try:
                recorded = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
            except MissingEntry:
                recorded = None  # nbgrader reports it
            if recorded is not None and recorded.locked:
                released = copy.deepcopy(cell)
                released.source = recorded.source
                ClearHiddenTests(parent=self)._remove_hidden_test_region(released)
                if released.source == cell.source:
                    cell.source = recorded.source
        return super().preprocess_cell(cell, resources, cell_index)


def autograde_preprocessors() -> list:
    """nbgrader's autograde pipeline with :class:`GradeOutsideKernel` in the place of ``Execute``.

    No cell of the submission runs: the graded cells' outputs are the sandbox's feedback and points,
    and the other cells have none.
    """
    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    at = steps.index(Execute)
    return steps[:at] + [GradeOutsideKernel] + steps[at + 1:]


def feedback_preprocessors() -> list:
    """nbgrader's feedback steps, then :class:`FeedbackNote`."""
    return list(GenerateFeedback.class_traits()["preprocessors"].default()) + [FeedbackNote]


def sanitize_preprocessors() -> list:
    """nbgrader's sanitizing steps with :class:`OverwriteReleasedCells` for ``OverwriteCells``."""
    steps = list(Autograde.class_traits()["sanitize_preprocessors"].default())
    return [OverwriteReleasedCells if step is OverwriteCells else step for step in steps]
