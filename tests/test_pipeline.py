"""The course pipeline: solutions/ -> chapters/ with nbgrader, the registry, nbval and a real grading round trip."""

from __future__ import annotations

import copy
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.registry import REGISTRY, by_chapter
from scripts import make_chapters as mc

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

NOTEBOOKS = sorted({(e.chapter, e.notebook) for e in REGISTRY})
SOLUTION_META = {"solution": True, "grade": False, "locked": False, "schema_version": 3, "task": False}
GRADED_META = {"grade": True, "solution": False, "locked": True, "schema_version": 3, "task": False}


def _read(kind: str, chapter: str, notebook: str) -> nbformat.NotebookNode:
    return nbformat.read(REPO / kind / chapter / notebook, as_version=4)


def _cells_by_grade_id(nb):
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells if "nbgrader" in c.metadata}


def _env() -> dict[str, str]:
    """The environment for a child process: the venv first on PATH, no coverage hooks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE", "PYTEST_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def _course_copy(tmp_path: Path) -> Path:
    """A course root holding copies of what generation reads and writes."""
    root = tmp_path / "course"
    root.mkdir()
    for name in ("solutions", "chapters", "figures", "appendix", "translations", "zh"):
        shutil.copytree(REPO / name, root / name)
    for name in ("nbgrader_config.py", "README.md", "_toc.yml", "_config.yml", "intro.md", "how_to_use.md", "maintainers.md", "glossary.md"):
        shutil.copy(REPO / name, root)
    return root


@pytest.mark.fast
def test_chapters_are_in_sync_with_solutions(capsys):
    assert mc.main(["--check"]) == 0, capsys.readouterr().err


def _definition(ex) -> str:
    """How the answer cell starts to define the exercise's name: a function or a class."""
    return f"def {ex.name}(" if ex.kind in ("function", "factory") else f"class {ex.name}"


@pytest.mark.fast
@pytest.mark.parametrize("chapter,notebook", NOTEBOOKS)
def test_notebooks_follow_the_registry_and_the_grader_contract(chapter, notebook):
    source, release = _read("solutions", chapter, notebook), _read("chapters", chapter, notebook)
    src_cells, rel_cells = _cells_by_grade_id(source), _cells_by_grade_id(release)
    for ex in by_chapter(chapter):
        answer, graded = src_cells[ex.solution_grade_id], src_cells[ex.test_grade_id]
        assert answer.metadata["nbgrader"] == {**SOLUTION_META, "grade_id": ex.solution_grade_id}
        assert _definition(ex) in answer.source
        assert answer.source.count("### BEGIN SOLUTION") >= 1
        assert answer.source.count("### BEGIN SOLUTION") == answer.source.count("### END SOLUTION")
        assert graded.metadata["nbgrader"] == {**GRADED_META, "grade_id": ex.test_grade_id, "points": ex.points}
        assert graded.source == mc.hidden_test_source(ex)
        graded_cells = [c for c in source.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert sum(1 for c in graded_cells if f'"{ex.id}"' in c.source) == 1, "exactly one graded cell per exercise"
        stub, hidden = rel_cells[ex.solution_grade_id], rel_cells[ex.test_grade_id]
        assert "raise NotImplementedError()" in stub.source and "BEGIN SOLUTION" not in stub.source
        assert _definition(ex) in stub.source
        assert hidden.source == graded.source.splitlines()[0], "the release keeps only the comment line"
        assert hidden.metadata["nbgrader"]["points"] == ex.points
    for src, rel in zip(source.cells, release.cells, strict=True):
        if rel.cell_type != "code":
            continue
        if mc.is_plain(src):
            assert rel.outputs == src.outputs, "plain cells ship the reference's outputs"
            assert rel.execution_count == src.execution_count is not None
        else:
            assert rel.outputs == [], "exercise and test cells ship without output"
    for kind in ("solutions", "chapters"):
        assert (REPO / kind / chapter / notebook).stat().st_size < 3_000_000


@pytest.mark.fast
@pytest.mark.parametrize("kind", ["solutions", "chapters"])
def test_every_widget_view_has_saved_state(kind):
    for chapter, notebook in NOTEBOOKS:
        nb = _read(kind, chapter, notebook)
        views = [o for c in nb.cells for o in c.get("outputs", []) if mc.WIDGET_VIEW in o.get("data", {})]
        assert len(views) >= 2, f"{chapter} shows at least two widgets"
        assert mc.missing_widget_state(nb) == []


@pytest.mark.fast
def test_a_widget_view_without_state_is_caught():
    nb = _read("chapters", *NOTEBOOKS[0])
    stripped = copy.deepcopy(nb)
    del stripped.metadata["widgets"]
    assert len(mc.missing_widget_state(stripped)) >= 3
    with pytest.raises(RuntimeError, match="without saved state"):
        mc.carry(stripped, copy.deepcopy(stripped))


@pytest.mark.fast
def test_merge_streams_joins_consecutive_prints_only():
    out = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in ("a\n", "b\n")]
    out.append(nbformat.v4.new_output("stream", name="stderr", text="w\n"))
    merged = mc.merge_streams(out)
    assert [(o.name, o.text) for o in merged] == [("stdout", "a\nb\n"), ("stderr", "w\n")]


@pytest.mark.fast
def test_differences_name_every_changed_added_and_missing_file(tmp_path):
    """What `--check` compares a regenerated tree with; test_chapters_are_in_sync_with_solutions runs a
    full `--check` on the course."""
    committed, regenerated = tmp_path / "committed", tmp_path / "regenerated"
    for tree in (committed, regenerated):
        (tree / "01_x").mkdir(parents=True)
        (tree / "01_x" / "same.ipynb").write_text("{}")
    (committed / "01_x" / "x.ipynb").write_text("edited by hand")
    (regenerated / "01_x" / "x.ipynb").write_text("generated")
    (committed / "01_x" / "stale.png").write_text("")
    (regenerated / "new.md").write_text("")
    assert sorted(mc.differences(committed, regenerated)) == [
        "01_x/differs: x.ipynb", "01_x/only committed: stale.png", "only in regenerated: new.md"]
    assert mc.differences(committed / "01_x", committed / "01_x") == []


@pytest.mark.fast
def test_check_reports_graded_cells_that_differ_from_the_registry(tmp_path, capsys):
    root = _course_copy(tmp_path)
    chapter, notebook = NOTEBOOKS[0]
    source = root / "solutions" / chapter / notebook
    nb = nbformat.read(source, as_version=4)
    graded = _cells_by_grade_id(nb)[by_chapter(chapter)[0].test_grade_id]
    graded.source = graded.source.replace("grade_in_notebook(", "print(")
    nbformat.write(nb, source)
    assert mc.main(["--check", "--root", str(root)]) == 1
    assert "graded cells differ from the registry" in capsys.readouterr().err


@pytest.mark.slow
def test_regenerating_changes_nothing(tmp_path):
    """`make chapters` on the committed state reproduces it byte for byte (so running it twice changes nothing)."""
    root = _course_copy(tmp_path)
    assert mc.generate(root, root, run=True) == []
    for name in ("solutions", "chapters", "figures", "zh"):
        assert mc.differences(REPO / name, root / name) == [], name
    assert (root / "README.md").read_text() == (REPO / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("chapter, notebook", NOTEBOOKS, ids=[c for c, _ in NOTEBOOKS])
def test_nbval_on_the_solutions(chapter, notebook):
    """Each solution notebook reproduces its committed outputs; one notebook per test, so that a slow
    machine's time limit is per notebook and the notebooks spread over the workers."""
    cmd = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval", "--nbval-current-env",
        "--nbval-sanitize-with", str(REPO / "tests" / "nbval_sanitize.cfg"), "-o", "addopts=",
        str(REPO / "solutions" / chapter / notebook),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def _nbgrader(root: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args], cwd=root, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"nbgrader {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_nbgrader_round_trip_full_marks_for_solutions_zero_for_stubs(tmp_path, monkeypatch):
    """generate_assignment -> gradebook -> autograde -> export, with the real nbgrader and a real gradebook.

    The submissions are what students hand in: the released notebooks, untouched or with the
    solutions' answers in their answer cells. Chapter 3 is autograded while every core is kept busy
    (a grade must not depend on the machine's load), and no chapter reports tampering: a test cell that is
    as released is not "changed" because the gradebook holds it with its hidden tests. Chapter 12, graded
    last, trains the student's own course from their other submitted chapters and translates with the
    weights beside their notebook (60 test sentences; it needs the Multi30k mirror, as CI has it).
    """
    from nbgrader.api import Gradebook

    from autograder.exercises import ch12_capstone
    from tests.grader_fixtures.load import busy_cores
    from tests.notebook_answers import solved_release

    root = _course_copy(tmp_path)
    monkeypatch.setenv(ch12_capstone.SENTENCES_ENV, "60")
    with_data = bool(os.environ.get("MULTI30K_DIR"))
    notebooks = [(c, n) for c, n in NOTEBOOKS if with_data or not any(e.runner for e in by_chapter(c))]
    chapters = sorted({c for c, _ in notebooks})
    release_before = {p: p.read_bytes() for p in (root / "chapters").rglob("*.ipynb")}
    # What `make gradebook` runs: the gradebook gets the tests, chapters/ stays untouched.
    for chapter in chapters:
        _nbgrader(root, "generate_assignment", chapter, "--force", "--CourseDirectory.release_directory=scratch-release")
    assert {p: p.read_bytes() for p in (root / "chapters").rglob("*.ipynb")} == release_before
    for student in ("reference", "untouched"):
        _nbgrader(root, "db", "student", "add", student)
    for chapter, notebook in notebooks:
        release = REPO / "chapters" / chapter / notebook
        solved_release(release, root / "submitted" / "reference" / chapter, REPO / "solutions" / chapter / notebook)
        if (REPO / "solutions" / chapter / "my_model").is_dir():
            shutil.copytree(REPO / "solutions" / chapter / "my_model", root / "submitted" / "reference" / chapter / "my_model")
        (root / "submitted" / "untouched" / chapter).mkdir(parents=True)
        shutil.copy(release, root / "submitted" / "untouched" / chapter / notebook)
    # One chapter is autograded while every core is kept busy; the command-line test grades every
    # chapter that way (tests/test_grader_submissions.py), and spinning through all of them here would
    # halve the speed of the rest of the suite for the length of this test.
    loaded = "03_attention"
    with busy_cores():
        logs = {loaded: _nbgrader(root, "autograde", loaded, "--force")}
    logs |= {chapter: _nbgrader(root, "autograde", chapter, "--force") for chapter in chapters if chapter != loaded}
    for chapter, log in logs.items():
        assert "has changed" not in log and "SAWarning" not in log, f"{chapter}:\n{log[-3000:]}"
    _nbgrader(root, "export", "--to", str(root / "grades.csv"))

    total = {c: sum(e.points for e in by_chapter(c)) for c in chapters}
    with open(root / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    scores = {(r["student_id"], r["assignment"]): float(r["raw_score"]) for r in rows}
    for chapter in chapters:
        assert scores[("reference", chapter)] == total[chapter]
        assert scores[("untouched", chapter)] == 0
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for ex in (e for e in REGISTRY if e.chapter in chapters):
            for student, expected in (("reference", ex.points), ("untouched", 0)):
                grade = gb.find_grade(ex.test_grade_id, ex.notebook.removesuffix(".ipynb"), ex.chapter, student)
                assert grade.max_score == ex.points
                assert grade.score == expected, f"{ex.id} for {student}: {grade.score} (expected {expected})"
