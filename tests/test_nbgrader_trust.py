"""nbgrader with the course's configuration never runs a submitted cell: a hostile submission, graded as an instructor does.

The student's cell below, if it ran in a kernel as the instructor, would rewrite the course's grader on disk so
that every later grade is full marks, write outside its own folder, replace a classmate's submitted notebook
with the untouched release, and print the course's salt, the reference's source and the student list into its
own autograded notebook. ``nbgrader autograde``, ``generate_feedback`` and ``export`` run with the course's
``nbgrader_config.py``, on a copy of the course whose ``autograder/`` package is the one nbgrader imports.
"""

from __future__ import annotations

import csv
import hashlib
import html
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.nbgrader_plugin import FEEDBACK_NOTE
from autograder.registry import by_chapter
from tests.notebook_answers import release_with, solution_answers, solved_release
from tests.test_pipeline import REPO, _course_copy, _nbgrader

CHAPTER, NOTEBOOK = "03_attention", "attention.ipynb"
ATTACKER, CLASSMATE = "mallory", "classmate_8k2q"  # the attacker's source never names the classmate
SALT = "salt-never-shown-5d41402abc4b2a76"
MARKER = "written-by-a-submitted-cell.txt"
REFERENCE = Path(__import__("tfm_solution").__file__).parent / "attention.py"

_ATTACK = '''
import os, pathlib, sqlite3
import tfm_solution

here = pathlib.Path.cwd()
course = next((p for p in (here, *here.parents) if (p / "nbgrader_config.py").is_file()), None)
if course is not None:
    # (a) the grader nbgrader is about to import: full marks for everyone from now on
    (course / "autograder" / "{marker}").write_text("a submitted cell ran here")
    with open(course / "autograder" / "grade.py", "a") as grader:
        grader.write(
            "\\n_real_grade_path = grade_path\\n"
            "def grade_path(*args, **kwargs):\\n"
            "    report = _real_grade_path(*args, **kwargs)\\n"
            "    from autograder.registry import by_id\\n"
            "    type(report).exercise_score = lambda self, exercise_id: float(by_id(exercise_id).points)\\n"
            "    return report\\n")
    # (a) outside the course, and a classmate's submission replaced by the untouched release
    (course.parent / "{marker}").write_text("a submitted cell ran here")
    release = course / "chapters" / "{chapter}" / "{notebook}"
    for other in (course / "submitted").iterdir():
        if other.name != here.parent.name and (other / "{chapter}" / "{notebook}").is_file():
            (other / "{chapter}" / "{notebook}").write_bytes(release.read_bytes())
    # the student list, from the gradebook
    print("students:", sqlite3.connect(course / "gradebook.db").execute("select id from student").fetchall())
# (b) the course's secret salt, and (c) the reference's source
print("salt:", os.environ.get("AUTOGRADER_SALT"))
print((pathlib.Path(tfm_solution.__file__).parent / "attention.py").read_text())
'''


@pytest.mark.fast
def test_the_course_config_runs_no_kernel_in_autograde_and_notes_it_in_the_feedback():
    """What nbgrader loads from ``nbgrader_config.py``: no ``Execute`` in autograde, the sandbox's grading in
    its place, and the note at the top of each feedback notebook (once, however often feedback is made)."""
    from nbgrader.converters import Autograde, GenerateFeedback
    from nbgrader.preprocessors import Execute
    from traitlets.config import Config

    from autograder.nbgrader_plugin import FeedbackNote, GradeOutsideKernel

    config = Config()
    exec(compile((REPO / "nbgrader_config.py").read_text(), "nbgrader_config.py", "exec"), {"get_config": lambda: config})
    autograde = Autograde(config=config)
    assert Execute not in autograde.autograde_preprocessors and GradeOutsideKernel in autograde.autograde_preprocessors
    assert Execute not in autograde.sanitize_preprocessors
    feedback = GenerateFeedback(config=config)
    assert feedback.preprocessors[-1] is FeedbackNote and Execute not in feedback.preprocessors

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Attention")])
    for _ in range(2):
        nb, _resources = FeedbackNote().preprocess(nb, {})
    assert [c.source for c in nb.cells] == [FEEDBACK_NOTE, "# Attention"]

    # a submitted output (kept if `--no-execute` turned nbgrader's ClearOutput off) is not shown as if it ran
    forged = nbformat.v4.new_code_cell("1 + 1", execution_count=3,
                                       outputs=[nbformat.v4.new_output("stream", name="stdout", text="10/10\n")])
    nb, _resources = GradeOutsideKernel().preprocess(nbformat.v4.new_notebook(cells=[forged]), {})
    assert nb.cells[0].outputs == [] and nb.cells[0].execution_count is None


def _files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (bytecode caches aside) and the hash of its contents."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _attacker_submission(root: Path) -> Path:
    """The release with the softmax exercise answered, the attention exercise left a stub, and the hostile cell."""
    release = REPO / "chapters" / CHAPTER / NOTEBOOK
    answers = solution_answers(REPO / "solutions" / CHAPTER / NOTEBOOK)
    path = release_with(release, root / "submitted" / ATTACKER / CHAPTER, {"ch03.softmax_saturation": answers["ch03.softmax_saturation"]})
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell(_ATTACK.format(marker=MARKER, chapter=CHAPTER, notebook=NOTEBOOK)))
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_a_hostile_submission_runs_no_cell_during_autograde_feedback_and_export(tmp_path, monkeypatch):
    root = _course_copy(tmp_path)
    shutil.copytree(REPO / "autograder", root / "autograder", ignore=shutil.ignore_patterns("__pycache__"))
    # nbgrader, and any kernel it would start, import the course's grader from this copy
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setenv("AUTOGRADER_SALT", SALT)
    _nbgrader(root, "generate_assignment", CHAPTER, "--force", "--CourseDirectory.release_directory=scratch-release")
    for student in (ATTACKER, CLASSMATE):
        _nbgrader(root, "db", "student", "add", student)
    solved_release(REPO / "chapters" / CHAPTER / NOTEBOOK, root / "submitted" / CLASSMATE / CHAPTER,
                   REPO / "solutions" / CHAPTER / NOTEBOOK)
    attack = _attacker_submission(root)
    classmate_bytes = (root / "submitted" / CLASSMATE / CHAPTER / NOTEBOOK).read_bytes()
    before = _files(tmp_path)

    log = _nbgrader(root, "autograde", CHAPTER, "--force", "--student", ATTACKER)
    log += _nbgrader(root, "autograde", CHAPTER, "--force", "--student", CLASSMATE)
    log += _nbgrader(root, "generate_feedback", CHAPTER, "--force")
    _nbgrader(root, "export", "--to", str(root / "grades.csv"))

    # nbgrader's own products are the only files written; the grader, the submissions and the course's
    # parent folder are as they were
    written = ("course/autograded/", "course/feedback/", "course/gradebook.db", "course/grades.csv", "course/.nbgrader.log")
    after = _files(tmp_path)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p) and not p.startswith(written))
    assert changed == [], changed
    assert (root / "submitted" / CLASSMATE / CHAPTER / NOTEBOOK).read_bytes() == classmate_bytes
    assert not (root / "autograder" / MARKER).exists() and not (tmp_path / MARKER).exists()
    autograded = nbformat.read(root / "autograded" / ATTACKER / CHAPTER / NOTEBOOK, as_version=4)
    by_test_id = {e.test_grade_id: e for e in by_chapter(CHAPTER)}
    ran = [c.source[:60] for c in autograded.cells
           if c.cell_type == "code" and c.outputs and c.metadata.get("nbgrader", {}).get("grade_id") not in by_test_id]
    assert ran == [], f"cells with outputs, so run in a kernel: {ran[:3]}\n{log[-3000:]}"

    # the scores are what the answers earn: the classmate's full marks, the attacker's softmax exercise only
    total = sum(e.points for e in by_chapter(CHAPTER))
    with open(root / "grades.csv") as f:
        scores = {r["student_id"]: float(r["raw_score"]) for r in csv.DictReader(f) if r["assignment"] == CHAPTER}
    earned = sum(e.points for e in by_chapter(CHAPTER) if e.id == "ch03.softmax_saturation")
    assert scores == {CLASSMATE: total, ATTACKER: earned}, scores

    # each graded cell shows the sandbox's report and its points; the feedback opens with the note
    for cell in autograded.cells:
        exercise = by_test_id.get(cell.get("metadata", {}).get("nbgrader", {}).get("grade_id"))
        if exercise is not None:
            shown = {o.output_type: o.get("text") or o.get("data", {}).get("text/plain") for o in cell.outputs}
            assert f"{exercise.id} public" in shown["stream"] and "total" in shown["stream"], shown
            assert float(shown["execute_result"]) == (earned if exercise.id == "ch03.softmax_saturation" else 0)
    feedback = (root / "feedback" / ATTACKER / CHAPTER / "attention.html").read_text()
    title = FEEDBACK_NOTE.split("**")[1]  # the note's bold opening, as the page renders it
    assert f"<strong>{title}</strong>" in feedback and f"Score: {float(earned)} / {float(earned)}" in feedback

    # nothing the cell could only have learned by running reaches the attacker's notebook or feedback
    reference_lines = [line.strip() for line in REFERENCE.read_text().splitlines() if len(line.strip()) > 30]
    source = attack.read_text()
    secret_lines = [line for line in reference_lines if line not in source]
    assert secret_lines, "the reference must have lines the submission does not hold"
    for shown in (root / "autograded" / ATTACKER / CHAPTER / NOTEBOOK, root / "feedback" / ATTACKER / CHAPTER / "attention.html"):
        text = shown.read_text()
        assert SALT not in text and CLASSMATE not in text, shown
        leaked = [line for line in secret_lines
                  if any(form in text for form in (line, html.escape(line), html.escape(line, quote=False)))]
        assert leaked == [], (shown, leaked[:3])
