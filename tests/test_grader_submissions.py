"""The grader on the pilot chapter's real notebooks: full marks, zero, each declared mistake,
the command line, the notebook hook, nbgrader parity, batch grading and the Gradescope zip."""

from __future__ import annotations

import csv
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import zipfile
from decimal import Decimal
from pathlib import Path

import jsonschema
import nbformat
import numpy as np
import pytest
import torch

from autograder.__main__ import main
from autograder.cases import graded_cases
from autograder.grade import grade_path
from autograder.gradescope import build
from autograder.hook import grade_in_notebook
from autograder.mistakes import submission_source
from autograder.registry import REGISTRY, by_id, by_chapter
from autograder.results import ERROR_TEST, GRADESCOPE_SCHEMA
from autograder.sandbox import REPO_ROOT, RESERVE_ENV

from .grader_fixtures.load import busy_cores
from .notebook_answers import release_with, solution_answers

SOLUTION = REPO_ROOT / "solutions" / "03_attention" / "attention.ipynb"
RELEASE = REPO_ROOT / "chapters" / "03_attention" / "attention.ipynb"
CLI = [sys.executable, "-m", "autograder"]






def _released_points() -> float:
    """Points of every exercise whose chapter notebook exists (chapters are added over time)."""
    return float(sum(e.points for e in REGISTRY if (REPO_ROOT / "solutions" / e.chapter / e.notebook).exists()))


@pytest.mark.slow
def test_solutions_score_full_marks_through_the_command_line(tmp_path):
    """Every chapter's solution notebook, graded at once from a folder of solutions, where users
    grade: on a machine whose every core is kept busy, by a grader whose workers hold 4 GB more
    address space than torch's CPU build reserves (as its CUDA build does on import). Chapter 12, which
    trains the student's course, is graded from the solutions in tests/test_chapters_capstone.py."""
    results, folder = tmp_path / "results.json", tmp_path / "solutions"
    shutil.copytree(REPO_ROOT / "solutions", folder, ignore=shutil.ignore_patterns(
        *{e.chapter for e in REGISTRY if e.runner}))
    with busy_cores():
        run = subprocess.run([*CLI, "grade", str(folder), "--results", str(results)],
                             env=dict(os.environ, **{RESERVE_ENV: "4096"}), capture_output=True, text=True,
                             timeout=900, check=False)
    assert run.returncode == 0, run.stderr
    data = json.loads(results.read_text())
    own = re.search(r"beyond the worker's (\d+) MB of address space", data["extra_data"]["sandbox"])
    assert own and int(own.group(1)) > 4096, data["extra_data"]["sandbox"]  # the reservation was there
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    expected = _released_points() - sum(e.points for e in REGISTRY if e.runner)
    assert data["score"] == expected >= 10
    exact = json.loads(results.read_text(), parse_float=Decimal)  # the file's numbers, added exactly
    assert sum(t["max_score"] for t in exact["tests"]) == exact["extra_data"]["max_score"] == exact["score"] \
        == expected
    assert f"{data['score']:g}/{data['score']:g}" in run.stdout
    assert all(t["status"] == "passed" for t in data["tests"]), [t["name"] for t in data["tests"]
                                                                 if t["status"] != "passed"]
    for exercise in (e for e in REGISTRY if e.kind == "module"
                     and (REPO_ROOT / "solutions" / e.chapter / e.notebook).exists()):
        lines = [t["name"] for t in data["tests"] if t["name"].startswith(exercise.id + " ")]
        assert sum(" structure: " in n for n in lines) == 1, lines
        assert sum(n.endswith("in training mode") for n in lines) >= exercise.has_dropout, lines


@pytest.mark.slow
def test_untouched_stubs_score_zero():
    report = grade_path(REPO_ROOT / "chapters")
    assert report.score == 0 and report.max_score == _released_points()
    assert all("not implemented" in t.output for t in report.tests if t.max_score > 0)


@pytest.mark.slow
@pytest.mark.parametrize("exercise_id,mistake", [(e.id, next(iter(e.mistakes))) for e in REGISTRY if e.mistakes])
def test_a_declared_mistake_fails_its_exercise_only(tmp_path, exercise_id, mistake):
    """Every exercise, through the workers: its first declared mistake costs its own exercise, is named on
    a line it fails, and leaves the chapter's other exercises full. (That every declared mistake fails
    some case and is named there is test_autograder_units' job, in-process: one whole-chapter grading
    per mistake made this the suite's largest cost.)"""
    exercise = by_id(exercise_id)
    solution = REPO_ROOT / "solutions" / exercise.chapter / exercise.notebook
    release = REPO_ROOT / "chapters" / exercise.chapter / exercise.notebook
    answers = solution_answers(solution)
    answers[exercise_id] = submission_source(exercise_id, mistake)
    report = grade_path(release_with(release, tmp_path, answers), chapter=exercise.chapter[:2])
    assert report.exercise_score(exercise_id) < exercise.points
    failed = [t for t in report.tests if t.name.startswith(exercise_id + " ") and t.status == "failed"]
    assert any(f"**Diagnosis: {mistake}**" in t.output for t in failed), failed
    for other in by_chapter(exercise.chapter):
        if other.id != exercise_id:
            assert report.exercise_score(other.id) == other.points, (other.id, report.tests)


@pytest.mark.slow
def test_hook_gives_the_grade_commands_points_and_nothing_on_stderr(tmp_path, monkeypatch, capsys):
    answers = solution_answers(SOLUTION)
    answers["ch03.attention"] = submission_source("ch03.attention", "neg_inf_nan_rows")
    path = release_with(RELEASE, tmp_path / "nb", answers)
    expected = grade_path(path, only="ch03.attention").exercise_score("ch03.attention")
    assert 0 < expected < 6  # partial credit: only the fully masked row exposes it
    monkeypatch.chdir(path.parent)
    assert grade_in_notebook("ch03.attention", {}) == expected
    out, err = capsys.readouterr()
    assert err == "" and "neg_inf_nan_rows" in out
    # Away from the notebook file, the kernel's input history stands in for it.
    monkeypatch.chdir(tmp_path)
    history = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    assert grade_in_notebook("ch03.attention", {"In": ["", *history]}) == expected


@pytest.mark.slow
def test_hook_leaves_the_kernels_random_generators_as_they_were(tmp_path, monkeypatch, capsys):
    """A module exercise's cases seed torch with a hidden seed; the cells after the graded cell must
    still draw the numbers they would draw without it (nbval replays them)."""
    exercise = by_id("ch07.LayerNorm")
    solution = REPO_ROOT / "solutions" / exercise.chapter / exercise.notebook
    path = release_with(REPO_ROOT / "chapters" / exercise.chapter / exercise.notebook, tmp_path / "nb",
                        solution_answers(solution))
    monkeypatch.chdir(path.parent)
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    assert grade_in_notebook(exercise.id, {}) == exercise.points
    capsys.readouterr()
    assert torch.equal(torch.get_rng_state(), states[0])
    assert random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])


@pytest.mark.slow
def test_nbgrader_autograde_gives_the_same_points(tmp_path):
    """A real nbgrader round trip on the pilot chapter: partial credit on one exercise, full on
    the other; the submission also patches the grader in a cell (the graded cells would then print
    full marks in a kernel), which never runs: the course's autograde grades in the sandbox, no kernel."""
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "nbgrader_config.py", course)
    shutil.copytree(SOLUTION.parent, course / "solutions" / "03_attention")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")

    def nbgrader(*args):
        run = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--log-level=WARN"], cwd=course, env=env,
                             capture_output=True, text=True, timeout=600, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        return run.stdout + run.stderr

    nbgrader("generate_assignment", "03_attention", "--force")
    answers = solution_answers(SOLUTION)
    answers["ch03.attention"] = submission_source("ch03.attention", "neg_inf_nan_rows")
    patch = nbformat.v4.new_code_cell("import autograder.hook\nautograder.hook.grade_in_notebook = lambda *a: 6.0")
    path = release_with(RELEASE, tmp_path / "submission", answers)
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(1, patch)
    for cell in nb.cells:  # a locked test cell edited: nbgrader restores it, and must say so
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "ch03-softmax-saturation-tests":
            cell.source += "\nprint('edited')"
    nbformat.write(nb, path)
    nbgrader("db", "student", "add", "s1")
    target = course / "submitted" / "s1" / "03_attention"
    target.mkdir(parents=True)
    shutil.copy(path, target / "attention.ipynb")
    log = nbgrader("autograde", "03_attention")
    changed = re.findall(r"Attribute '(\w+)' for cell ([\w-]+) has changed", log)
    assert changed == [("checksum", "ch03-softmax-saturation-tests")], log[-3000:]  # the untouched one is quiet
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook("attention", "03_attention", "s1")
        got = {g.name: g.auto_score for g in notebook.grades}
    report = grade_path(path, chapter="03")
    assert got == {e.test_grade_id: report.exercise_score(e.id) for e in by_chapter("03_attention")}
    assert got["ch03-attention-tests"] == 5.25 and got["ch03-softmax-saturation-tests"] == 4.0  # not the patched 6


@pytest.mark.slow
def test_batch_of_correct_buggy_and_hostile_submissions(tmp_path):
    folder = tmp_path / "submissions"
    answers = solution_answers(SOLUTION)
    release_with(RELEASE, folder / "correct", answers)
    release_with(RELEASE, folder / "buggy", dict(answers, **{"ch03.softmax_saturation": submission_source(
        "ch03.softmax_saturation", "ignores_scaled_flag")}))
    release_with(RELEASE, folder / "hostile", dict(answers, **{"ch03.attention": "import os\nos._exit(0)\n"}))
    (folder / "unreadable.ipynb").write_text("{oops")
    out = tmp_path / "grades.csv"
    run = subprocess.run([*CLI, "grade-batch", str(folder), "--out", str(out), "--chapter", "03",
                          "--results-dir", str(tmp_path / "results")],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["submission"]: r for r in csv.DictReader(out.open())}
    assert float(rows["correct"]["score"]) == 10.0
    assert float(rows["buggy"]["ch03.softmax_saturation"]) < 4 and float(rows["buggy"]["ch03.attention"]) == 6
    assert float(rows["hostile"]["score"]) == 4.0 and float(rows["unreadable.ipynb"]["score"]) == 0
    for path in (tmp_path / "results").iterdir():
        jsonschema.validate(json.loads(path.read_text()), GRADESCOPE_SCHEMA)


@pytest.mark.fast
def test_gradescope_package(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0-cp311-none-linux_x86_64.whl").write_bytes(b"stand-in")
    path = build("3", tmp_path / "gs.zip", wheels)
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        assert {"setup.sh", "run_autograder", "requirements-grader.txt", "autograder/sandboxed/__main__.py",
                "tfm_solution/attention.py", "wheels/torch-2.13.0-cp311-none-linux_x86_64.whl"} <= names
        assert not any(n.startswith(("tests/", "solutions/")) for n in names)
        pins = archive.read("requirements-grader.txt").decode().split()
        assert "torch==2.13.0" in pins, pins  # the lock's version, without this machine's +cpu label
        assert {p.split(">=")[0] for p in pins if ">=" in p} >= {"numpy", "nbformat", "pytest", "tokenizers", "tqdm"}
        assert all("==" in p or ",<=" in p for p in pins), "each is capped at the version tested here"
        assert "autograder/nbgrader_plugin.py" not in names and not any("/viz/" in n for n in names)
        setup = archive.read("setup.sh").decode()
        assert "--extra-index-url" not in setup and "://" not in setup, "the ordinary index only"
        run = archive.read("run_autograder").decode()
        assert "--chapter 03" in run and '"$ROOT/results/results.json"' in run and "AUTOGRADER_ROOT:-/autograder}" in run
        assert archive.getinfo("run_autograder").external_attr >> 16 & 0o111
    with pytest.raises(ValueError):
        build("99", tmp_path / "none.zip")


@pytest.mark.fast
def test_gradescope_requirements_follow_what_the_shipped_code_imports(tmp_path, monkeypatch):
    """Every third-party module a shipped file imports (lazily too) is a requirement, with the range
    pyproject declares; an undeclared or unknown one stops the build; unshipped glue adds nothing."""
    import autograder.gradescope as gradescope

    assert any(line.startswith("tokenizers>=") for line in gradescope.requirements())  # tfm_solution.data
    for package in ("autograder", "tfm_solution"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "autograder" / "nbgrader_plugin.py").write_text("import nbgrader\n")  # not shipped
    (tmp_path / "autograder" / "grade.py").write_text("import tqdm\nfrom tfm_solution import data\n")
    (tmp_path / "tfm_solution" / "data.py").write_text("def tokenizer():\n    from tokenizers import Tokenizer\n")
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)  # what the project declares, as in a checkout
    monkeypatch.setattr(gradescope, "REPO_ROOT", tmp_path)
    assert [line.split(">=")[0] for line in gradescope.requirements()] == ["numpy", "tokenizers", "tqdm"]
    (tmp_path / "autograder" / "grade.py").write_text("def later():\n    import markdown_it\n")
    with pytest.raises(LookupError, match="markdown-it-py"):
        gradescope.requirements()
    (tmp_path / "autograder" / "grade.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(LookupError, match="no installed distribution"):
        gradescope.requirements()


@pytest.mark.fast
def test_grader_failure_still_writes_visible_results(tmp_path, monkeypatch, capsys):
    import autograder.grade

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(autograder.grade, "grade_path", broken)
    results = tmp_path / "results.json"
    assert main(["grade", str(RELEASE), "--results", str(results)]) == 2
    data = json.loads(results.read_text())
    jsonschema.validate(data, GRADESCOPE_SCHEMA)
    assert data["tests"][0]["name"] == ERROR_TEST and "disk on fire" in data["tests"][0]["output"]
    monkeypatch.undo()
    assert main(["grade", str(tmp_path / "missing.ipynb"), "--results", str(results)]) == 0
    assert "no such file" in json.loads(results.read_text())["tests"][0]["output"]
    capsys.readouterr()


@pytest.mark.slow
def test_module_exercises_get_the_reference_weights():
    """An ``nn.Module`` exercise: any initialisation scores full marks (the reference's weights
    are loaded into the student's module); a missing ReLU fails and is named."""
    import torch

    from autograder.checks import run_checks
    from autograder.exercises.shared import Case, Exercise, Mistake
    from autograder.extract import parse_notebook
    from autograder.grade import ExerciseRun, Report
    from autograder.sandbox import Limits

    def ffn_cases(seed):
        gen = torch.Generator().manual_seed(seed)
        return [Case(f"d_model {d}", "output of the module in eval mode", False,
                     (torch.randn(2, 3, d, generator=gen),), construct=(d, 2 * d, 0.5)) for d in (4, 8)]

    student = ("import torch\nfrom torch import nn\nclass PositionwiseFeedForward(nn.Module):\n"
               "    def __init__(self, d_model, d_ff, dropout=0.1):\n        super().__init__()\n"
               "        self.w_1 = nn.Linear(d_model, d_ff)\n        self.w_2 = nn.Linear(d_ff, d_model)\n"
               "        nn.init.constant_(self.w_1.weight, 3.0)\n        self.dropout = nn.Dropout(dropout)\n"
               "    def forward(self, x):\n        return self.w_2(self.dropout({hidden}))\n")
    wrong = student.format(hidden="self.w_1(x)")
    exercise = Exercise(id="ch06.ffn", chapter="06_ffn", notebook="ffn.ipynb", name="PositionwiseFeedForward",
                        kind="module", signature="", points=2, solution_grade_id="ch06-ffn",
                        test_grade_id="ch06-ffn-tests", reference="tfm_solution.feed_forward:PositionwiseFeedForward",
                        cases=ffn_cases, mistakes={"no_relu": Mistake("the ReLU is missing", wrong)}, has_dropout=True)
    # Two eval-mode cases and one in training mode (0.4 points each), the structure line (weighs two:
    # 0.8). Without its ReLU the module still has the reference's structure.
    for source, points in ((student.format(hidden="self.w_1(x).relu()"), 2.0), (wrong, 0.8)):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
        report = Report()
        run = ExerciseRun(parse_notebook("ffn.ipynb", nbformat.writes(nb).encode()), exercise, seed=None,
                          public_only=False, limits=Limits(call_timeout_s=5))
        run_checks([run])
        run.finish(report)
        assert report.exercise_score(exercise.id) == points
    assert "**Diagnosis: no_relu**" in "\n".join(t.output for t in report.tests)


@pytest.mark.slow
def test_public_only_and_replay_with_the_recorded_seed(tmp_path):
    answers = solution_answers(SOLUTION)
    answers["ch03.attention"] = submission_source("ch03.attention", "neg_inf_nan_rows")
    path = release_with(RELEASE, tmp_path, answers)
    public = grade_path(path, chapter="03", public_only=True)
    public_cases = [c for e in by_chapter("03_attention") for c in graded_cases(e, 0) if c.public]
    assert [t.name.split(" ")[1] for t in public.tests if t.max_score > 0] == ["public:"] * len(public_cases) != []
    first = grade_path(path, chapter="03")
    seed = first.seeds["ch03.attention"]
    replay = grade_path(path, chapter="03", seed=seed)
    assert replay.seeds["ch03.attention"] == seed
    attention = [(t.name, t.score, t.output) for t in first.tests if t.name.startswith("ch03.attention ")]
    assert attention == [(t.name, t.score, t.output) for t in replay.tests if t.name.startswith("ch03.attention ")]
    other = grade_path(path, chapter="03", seed=seed + 1)
    assert other.exercise_score("ch03.attention") == first.exercise_score("ch03.attention") == 5.25
    assert [t.output for t in other.tests] != [t.output for t in first.tests]  # other shapes, other numbers


@pytest.mark.slow
def test_gradescope_package_round_trip_in_a_fresh_venv(tmp_path):
    """The zip alone, as Gradescope uses it: ``setup.sh`` makes a venv from the zip's own
    requirements (the ordinary index; torch==2.13.0 comes from this machine's wheel), then
    ``run_autograder`` grades ``submission/`` into ``results/results.json``, all under a scratch
    root: full marks for the solution, 0 for the stub, a named mistake, and a module factory
    (chapter 8's ``make_model``). One venv serves both chapters."""
    root = tmp_path / "autograder"
    # The machine's pip settings and cache: an image's build downloads what this machine has at hand.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)), "AUTOGRADER_ROOT": str(root),
           "AUTOGRADER_PYTHON": sys.executable, **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
    seconds = {}

    def unpack(chapter: str) -> None:
        shutil.rmtree(root / "source", ignore_errors=True)
        with zipfile.ZipFile(build(chapter, tmp_path / f"gs{chapter}.zip")) as archive:
            archive.extractall(root / "source")
            for name in ("setup.sh", "run_autograder"):
                os.chmod(root / "source" / name, archive.getinfo(name).external_attr >> 16)

    def grade(notebook: Path) -> dict:
        for folder in ("submission", "results"):
            shutil.rmtree(root / folder, ignore_errors=True)
            (root / folder).mkdir()
        shutil.copy(notebook, root / "submission" / notebook.name)
        start = time.monotonic()
        run = subprocess.run([str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                             timeout=600, check=False)
        seconds[notebook.parent.name] = round(time.monotonic() - start, 1)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads((root / "results" / "results.json").read_text())

    unpack("03")
    start = time.monotonic()
    setup = subprocess.run([str(root / "source" / "setup.sh")], env=env, capture_output=True, text=True,
                           timeout=900, check=False)
    seconds["setup.sh"] = round(time.monotonic() - start, 1)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    installed = subprocess.run([str(root / "venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                               capture_output=True, text=True, check=True).stdout
    assert "torch==2.13.0" in installed and "nbgrader" not in installed and "matplotlib" not in installed

    assert grade(SOLUTION)["score"] == 10.0
    assert grade(RELEASE)["score"] == 0.0
    answers = solution_answers(SOLUTION)
    answers["ch03.softmax_saturation"] = submission_source("ch03.softmax_saturation", "min_instead_of_max")
    mistaken = grade(release_with(RELEASE, tmp_path / "mistaken", answers))
    assert mistaken["score"] == 6.0 and "min_instead_of_max" in json.dumps(mistaken)
    unpack("08")
    solution, release = (REPO_ROOT / kind / "08_encoder_decoder" / "encoder_decoder.ipynb"
                         for kind in ("solutions", "chapters"))
    full = grade(solution)
    assert full["score"] == 15.0 and any(t["name"].startswith("ch08.make_model ") for t in full["tests"])
    assert grade(release)["score"] == 0.0
    print(f"\nGradescope round trip: {seconds} (seconds)")
