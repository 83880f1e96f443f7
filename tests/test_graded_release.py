"""The graded release (``python -m autograder release``, ``make release THROUGH=NN``): no answer that is not
yet released, in its files or in what a grading worker receives."""

from __future__ import annotations

import ast
import json
import marshal
import os
import py_compile
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import nbformat
import pytest

from autograder import release
from autograder.grade import _provided, grade_path, own_prerequisites
from autograder.registry import REGISTRY, by_chapter
from autograder.sandbox import REPO_ROOT, Limits
from tests.notebook_answers import release_with, solution_answers, solved_release

ROOT = Path(REPO_ROOT)
CUT_OFFS = (3, 8)
HANDED_OUT = {"clones", "Encoder", "Generator", "EncoderDecoder", "SimpleLossCompute", "greedy_decode"}


def _notebook(chapter: str, kind: str = "chapters") -> Path:
    (path,) = (ROOT / kind).glob(f"{chapter}_*/*.ipynb")
    return path


# --- what the answers are, and the search that finds them ----------------------------------------------

@pytest.mark.fast
def test_every_later_region_is_a_secret_but_the_code_handed_out_earlier():
    regions = release.solution_regions()
    assert {r.chapter for r in regions} == set(range(1, 13))
    assert all(r.owner for r in regions)
    # The only regions a release hands out before their chapter: code an earlier notebook imports as provided.
    assert set(release.handed_out(regions)) == HANDED_OUT
    assert not HANDED_OUT & set(release.graded_references())
    for through in (0, 5, 11):
        secret = release.secrets(through)
        # chapter 12 restates code handed out earlier: every one of its regions is
        assert {r.chapter for r in secret} == set(range(through + 1, 12))
        assert len(secret) == len([r for r in regions if r.chapter > through and r.owner not in HANDED_OUT])
    # Every graded exercise of a later chapter is withheld, whatever the search finds.
    names = release.withheld(5)
    for exercise in REGISTRY:
        chapter = int(exercise.chapter[:2])
        if 5 < chapter < 12:
            assert exercise.reference.partition(":")[2] in names
    assert "MultiHeadedAttention" not in names and "subsequent_mask" not in names


@pytest.mark.fast
def test_the_search_finds_an_answer_in_every_kind_of_file(tmp_path):
    """The oracle: the full reference, a pasted answer, its bytecode, a notebook's output and a widget's state."""
    (gelu,) = [r for r in release.solution_regions() if r.owner == "gelu"]
    (layer_norm,) = [r for r in release.solution_regions() if r.owner == "LayerNorm" and "mean" in r.source]
    shutil.copytree(ROOT / "tfm_solution", tmp_path / "full", ignore=shutil.ignore_patterns("__pycache__", "assets"))
    found = {h.region.owner for h in release.find_answers(tmp_path / "full", 5)}
    assert {"PositionwiseFeedForward", "gelu", "LayerNorm", "EncoderLayer", "DecoderLayer"} <= found
    # renamed and commented: still found (names renamed in order; comments and whitespace gone)
    renamed = layer_norm.cell.replace("mean", "centre").replace("std", "spread")
    (tmp_path / "pasted").mkdir()
    (tmp_path / "pasted" / "renamed.py").write_text("# my notes\n" + renamed.replace("\n", "  # why\n"))
    py_compile.compile(str(tmp_path / "pasted" / "renamed.py"), cfile=str(tmp_path / "pasted" / "x.pyc"))
    (tmp_path / "pasted" / "renamed.py").unlink()
    (tmp_path / "pasted" / "gelu.py").write_text(gelu.cell)
    py_compile.compile(str(tmp_path / "pasted" / "gelu.py"), cfile=str(tmp_path / "pasted" / "gelu.pyc"))
    (tmp_path / "pasted" / "gelu.py").unlink()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text=gelu.source)])])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"m": {"state": {
        "value": json.dumps({"html": "<pre>" + layer_norm.source.replace('"', "&quot;") + "</pre>"})}}}}}
    nbformat.write(nb, tmp_path / "pasted" / "out.ipynb")
    hits = release.find_answers(tmp_path / "pasted", 5)
    kinds = {(h.file, h.region.owner) for h in hits}
    assert ("gelu.pyc", "gelu") in kinds  # bytecode, from its code objects
    assert any(f.startswith("out.ipynb cell 0 outputs") and o == "gelu" for f, o in kinds)
    assert any(f.startswith("out.ipynb metadata") and o == "LayerNorm" for f, o in kinds)
    (tmp_path / "pasted2").mkdir()
    (tmp_path / "pasted2" / "renamed.py").write_text(renamed)
    assert any(h.how == "ast dump, names renamed" and h.region.owner == "LayerNorm"
               for h in release.find_answers(tmp_path / "pasted2", 5))
    # an answer released already is no finding
    assert not release.find_answers(tmp_path / "pasted", 7)


# --- the grader's worker holds the same line ---------------------------------------------------------

@pytest.mark.fast
def test_a_worker_receives_no_unreleased_answer():
    for through in (1, 3, 5, 7, 8):
        later = {name for name, chapter in release.graded_references().items() if chapter > through}
        for exercise in REGISTRY:
            if exercise.chapter.startswith("12"):
                continue
            source, names, _ = _provided(exercise, through)
            assert not later & set(names), (exercise.id, through)
            own = own_prerequisites(exercise, through)
            assert set(own) == later & {t.partition(":")[2] for t in exercise.prerequisites}
            for name in own:  # not even by name, in the code that travels
                assert not re.search(rf"\bdef {name}\b|\bclass {name}\b", source)
    positional = [e for e in REGISTRY if e.id == "ch02.PositionalEncoding"][0]
    assert _provided(positional, 1)[1] == []  # nor the helpers only the withheld answer called
    assert set(_provided(positional, 12)[1]) == {"_check_even", "pair_frequencies", "positional_encoding"}
    assert own_prerequisites(positional, 12) == []


_LEAK = '''
import marshal
import torch
from torch import nn


def _leak(names):
    import base64, zlib
    found = {n: globals()[n].__code__ for n in names if n in globals()}
    print("LEAK " + base64.b85encode(zlib.compress(marshal.dumps(found), 9)).decode())


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        _leak(("_check_even", "pair_frequencies", "positional_encoding"))
        raise NotImplementedError()
'''

_REPLAY = '''
import base64
import marshal
import types
import zlib
import torch

{definitions}
'''


_SIGNATURES = {"positional_encoding": "seq_len, d_model, dtype=torch.float32",
               "pair_frequencies": "d_model, dtype=torch.float64", "_check_even": "d_model"}


def _replayed(leaks: dict[str, str]) -> str:
    """A submission whose functions run the printed code (each one a `def`, as the grader reads answers)."""
    lines = []
    for name, signature in _SIGNATURES.items():
        arguments = ", ".join(a.partition("=")[0].strip() for a in signature.split(","))
        body = (f"    return types.FunctionType(marshal.loads(bytes.fromhex({leaks[name]!r})), globals(), {name!r}, "
                f"None)({arguments})"
                if name in leaks else "    raise NotImplementedError()")
        lines.append(f"def {name}({signature}):\n{body}\n")
    return _REPLAY.format(definitions="\n\n".join(lines))


def _leaks(report) -> dict[str, str]:
    """The code objects the first submission printed, by name (as hex of their marshalled form)."""
    import base64
    import zlib

    text = "\n".join(t.output for t in report.tests)
    found = re.search(r"LEAK (\S+)", text)
    if not found:
        return {}
    codes = marshal.loads(zlib.decompress(base64.b85decode(found.group(1))))
    return {name: marshal.dumps(code).hex() for name, code in codes.items()}


@pytest.mark.slow
def test_a_prerequisite_printed_in_one_submission_gains_nothing_in_the_next(tmp_path, monkeypatch):
    """The replay: while `PositionalEncoding` is graded, the answer prints the `positional_encoding` the worker
    holds; the next submission uses it as its own. The grader's reading of the code would refuse both
    (`autograder.reach`): it is switched off here, to attack the layer beneath it, what the worker receives."""
    monkeypatch.setattr("autograder.grade.reaches", lambda *args: [])
    student = _notebook("02")
    first = release_with(student, tmp_path / "first", {"ch02.PositionalEncoding": _LEAK})
    limits = Limits(call_timeout_s=5.0)

    def graded(path, exercise_id, through):
        monkeypatch.setenv("AUTOGRADER_RELEASED_THROUGH", str(through))
        report = grade_path(path, only=exercise_id, limits=limits)
        return report, sum(t.score for t in report.tests if t.name.startswith(exercise_id + " "))

    # The self-learner's course (everything released): the worker holds the reference, and the replay works.
    report, _ = graded(first, "ch02.PositionalEncoding", 12)
    leaks = _leaks(report)
    assert set(leaks) == {"_check_even", "pair_frequencies", "positional_encoding"}
    second = release_with(student, tmp_path / "second", {"ch02.positional_encoding": _replayed(leaks)})
    _, score = graded(second, "ch02.positional_encoding", 12)
    assert score == 4.0
    # A release through chapter 1: the worker holds nothing of chapter 2; what is printed is the student's own.
    report, _ = graded(first, "ch02.PositionalEncoding", 1)
    leaks = _leaks(report)
    assert set(leaks) <= {"positional_encoding"}
    third = release_with(student, tmp_path / "third", {"ch02.positional_encoding": _replayed(leaks)})
    _, score = graded(third, "ch02.positional_encoding", 1)
    assert score == 0.0
    if "positional_encoding" in leaks:  # the student's own stub, printed: it raises as the stub does
        with pytest.raises(NotImplementedError):
            types.FunctionType(marshal.loads(bytes.fromhex(leaks["positional_encoding"])), {})(2, 2)


# --- releases at two cut-offs: the files, a fresh install, the grading ----------------------------------

@pytest.fixture(scope="module", params=CUT_OFFS, ids=lambda c: f"through{c:02d}")
def built(request, tmp_path_factory):
    return release.build_release(request.param, tmp_path_factory.mktemp(f"release{request.param:02d}"))


@pytest.mark.slow
def test_the_release_holds_no_later_answer(built):
    skipped: list[str] = []
    assert release.find_answers(built.folder, built.through, skipped=skipped) == []
    assert {Path(s.split("!")[-1]).suffix for s in skipped} <= {".safetensors", ".png"}
    manifest = json.loads((built.folder / "manifest.json").read_text())
    assert manifest["released_through"] == built.through
    withheld = {k.partition(":")[2] for k in manifest["withheld"]}
    assert {n for n, c in release.graded_references().items() if c > built.through} <= withheld
    assert not (built.folder / "package" / "tfm_solution" / "fast").exists()
    notebooks = sorted(p.parent.name for p in (built.folder / "chapters").glob("*/*.ipynb"))
    assert notebooks == sorted(p.parent.name for p in (ROOT / "chapters").glob("*/*.ipynb"))
    colab = json.loads(next((built.folder / "chapters").glob("06_*/*.ipynb")).read_text())["cells"][0]
    assert colab["id"] == "colab-install"
    assert "through" + f"{built.through:02d}" in "".join(colab["source"]) and "git+" not in "".join(colab["source"])


_IMPORTS = textwrap.dedent('''
    import ast, importlib, json, sys
    from pathlib import Path
    import tfm_solution
    assert tfm_solution.__file__.startswith(sys.prefix), tfm_solution.__file__
    from tfm_solution._release import NotReleased, RELEASED_THROUGH
    missing = []
    for path in sorted(Path(sys.argv[1]).glob("*/*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            code = "\\n".join("" if l.lstrip().startswith(("%", "!")) else l for l in "".join(cell["source"]).splitlines())
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    try:
                        module = importlib.import_module(node.module)
                        for alias in node.names:
                            getattr(module, alias.name)
                    except (ImportError, AttributeError) as exc:
                        missing.append(f"{path.parent.name}: {node.module} ({exc})")
    for name, chapter in json.loads(sys.argv[2]).items():
        if hasattr(tfm_solution, name):
            try:
                stub = getattr(tfm_solution, name)
                import inspect
                required = [p for p in inspect.signature(stub).parameters.values()
                            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                stub(*([None] * len(required)))
            except NotReleased as exc:
                assert exc.chapter == chapter
            else:
                raise AssertionError(name + " ran")
    print(json.dumps(missing))
''')


@pytest.mark.slow
def test_a_fresh_install_of_the_release_resolves_every_import_and_holds_no_answer(built, tmp_path):
    """A venv of its own: the locked third-party packages (a path file to them, without the course's own editable
    install) and the release's wheel, installed from the file."""
    (wheel,) = (built.folder / "wheel").glob("*.whl")
    python = _fresh_venv(wheel, tmp_path)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    names = {n: c for n, c in release.graded_references().items() if c > built.through}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COV_CORE_SOURCE")}
    done = subprocess.run([str(python), "-c", _IMPORTS, str(built.folder / "chapters"), json.dumps(names)],
                          capture_output=True, text=True, env={**env, "MPLBACKEND": "Agg"}, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    missing = json.loads(done.stdout.strip().splitlines()[-1])
    assert missing == []  # chapter 12 too: it reads the student's chapters with the package's own loader
    subprocess.run([str(python), "-m", "compileall", "-q", str(site / "tfm_solution")], check=True,
                   capture_output=True)
    assert list((site / "tfm_solution").rglob("*.pyc"))
    assert release.find_answers(site / "tfm_solution", built.through) == []


def _score(report, chapter: str) -> tuple[float, float]:
    ids = tuple(e.id + " " for e in by_chapter(_notebook(chapter).parent.name))
    lines = [t for t in report.tests if t.name.startswith(ids)]
    return sum(t.score for t in lines), sum(t.max_score for t in lines)


@pytest.mark.slow
def test_the_next_chapter_grades_full_for_the_solution_and_zero_for_the_stubs(built, tmp_path, monkeypatch):
    """With the release's setting, the chapter students work on (THROUGH + 1) is graded without any of its own
    chapter's reference in the worker: the solution's answers (each prerequisite the student's own) earn every
    point, the untouched notebook none."""
    chapter = f"{built.through + 1:02d}"
    monkeypatch.setenv("AUTOGRADER_RELEASED_THROUGH", str(built.through))
    own = [o for e in by_chapter(_notebook(chapter).parent.name) for o in own_prerequisites(e)]
    # through 03, chapter 4's `Batch` runs with the student's own `subsequent_mask`
    assert bool(own) == (built.through == 3), own
    solved = solved_release(_notebook(chapter), tmp_path / "solved", _notebook(chapter, "solutions"))
    got, most = _score(grade_path(solved, chapter=chapter), chapter)
    assert most > 0 and got == most
    stub = tmp_path / "stub" / _notebook(chapter).name
    stub.parent.mkdir()
    shutil.copy(_notebook(chapter), stub)
    got, most = _score(grade_path(stub, chapter=chapter), chapter)
    assert most > 0 and got == 0.0


@pytest.mark.slow
def test_a_failure_that_comes_from_an_earlier_exercise_says_so(tmp_path, monkeypatch):
    """Through chapter 3, chapter 4's `Batch` runs with the student's own `subsequent_mask`: a wrong mask costs
    `subsequent_mask`'s points, and `Batch`'s notes name it as where the failure may come from."""
    monkeypatch.setenv("AUTOGRADER_RELEASED_THROUGH", "3")
    answers = solution_answers(_notebook("04", "solutions"))
    wrong = answers["ch04.subsequent_mask"].replace(".tril()", ".triu()")
    assert wrong != answers["ch04.subsequent_mask"]
    path = release_with(_notebook("04"), tmp_path, {**answers, "ch04.subsequent_mask": wrong})
    report = grade_path(path, chapter="04", limits=Limits(call_timeout_s=5.0))
    lines = {t.name: t for t in report.tests}
    assert any(t.score < t.max_score for n, t in lines.items() if n.startswith("ch04.subsequent_mask "))
    assert any(t.score < t.max_score for n, t in lines.items() if n.startswith("ch04.batch "))
    notes = lines["ch04.batch notes"].output
    assert "your own `subsequent_mask`" in notes and "lost points on its own lines above" in notes
    # the full course: the reference's mask is provided, so `Batch` keeps its points and no such note
    monkeypatch.delenv("AUTOGRADER_RELEASED_THROUGH")
    report = grade_path(path, chapter="04", limits=Limits(call_timeout_s=5.0))
    batch = [t for t in report.tests if t.name.startswith("ch04.batch ")]
    assert all(t.score == t.max_score for t in batch) and "your own" not in "".join(t.output for t in batch)


@pytest.mark.fast
def test_the_release_cell_installs_the_served_package_only():
    from tfm_solution.colab import release_cell

    cell = release_cell("https://example.org/transformer_course_student-0.1.0+through05-py3-none-any.whl")
    assert 'course = "https://example.org/transformer_course_student-0.1.0+through05-py3-none-any.whl"' in cell
    assert "git+" not in cell
    for bad in ('https://example.org/x"; import os', "http://example.org/x.whl", "file:///x.whl"):
        with pytest.raises(ValueError):
            release_cell(bad)


# --- the notebooks of unreleased chapters: the student's own answer, else the stored figure and one line --------

@pytest.mark.fast
def test_the_self_learners_package_holds_every_answer_and_installs_no_handler(tmp_path):
    from tfm_solution import _release
    from tfm_solution.viz import stored

    assert _release.RELEASED_THROUGH == release.LAST_CHAPTER and not stored.install()
    # A release's file is this one with one line changed: the cut-off.
    mine = (ROOT / "tfm_solution" / "_release.py").read_text().splitlines()
    cut = tmp_path / "_release.py"
    shutil.copy(ROOT / "tfm_solution" / "_release.py", cut)
    release._put_cut_off(cut, 5)
    changed = [(a, b) for a, b in zip(mine, cut.read_text().splitlines(), strict=True) if a != b]
    assert changed == [("RELEASED_THROUGH = 12", "RELEASED_THROUGH = 5")]
    with pytest.raises(ValueError, match="exactly once"):
        release._put_cut_off(cut, 5)  # already cut: a second cut must not pass silently


_REFERENCES = textwrap.dedent('''
    from torch import nn


    def rate(step, model_size, factor, warmup, *, guard=True):
        """The reference, with an option the exercise does not ask for."""
        return 0.0


    class LayerNorm(nn.Module):
        def __init__(self, features, eps=None, kind="notes"):
            super().__init__()
''')


@pytest.mark.fast
def test_an_unreleased_reference_calls_the_readers_own_answer_and_nothing_else(monkeypatch):
    """Where the package's own code calls a reference the release does not hold, the stub calls the answer of that
    name the reader's notebook defines (`NotReleased.stand_in`): at the reference's defaults the reader's own
    defaults stand; a feature beyond the exercise, a missing answer, a stub of the exercise or a name that is the
    package's own (imported, not written) is `NotReleased`, the stub's own marked as the reader's to write."""
    from tfm_solution import _release

    tree = ast.parse(_REFERENCES)
    stubs = "from tfm_solution._release import NotReleased\nfrom torch import nn\n" + "\n".join(
        release._stub(node, 9, 0) for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef)))
    package: dict = {}
    exec(compile(stubs, "package", "exec"), package)  # noqa: S102 - the stubs the build writes
    notebook: dict = {}
    monkeypatch.setattr(_release, "_notebook_namespace", lambda: notebook)
    with pytest.raises(_release.NotReleased) as missing:
        package["rate"](1, 512, 1.0, 4000)
    assert (missing.value.name, missing.value.chapter, missing.value.yours) == ("rate", 9, False)
    notebook["rate"] = package["rate"]  # imported from the package, not written: never called back
    with pytest.raises(_release.NotReleased):
        package["rate"](1, 512, 1.0, 4000)
    exec("def rate(step, model_size, factor, warmup):\n    raise NotImplementedError()\n"  # noqa: S102
         "class LayerNorm:\n    def __init__(self, features, eps=1e-6):\n        self.eps = eps\n", notebook)
    for function in (notebook["rate"], notebook["LayerNorm"]):
        function.__module__ = "__main__"
    with pytest.raises(_release.NotReleased) as stub:
        package["rate"](1, 512, 1.0, 4000)
    assert stub.value.yours
    exec("def rate(step, model_size, factor, warmup):\n    return step * factor\n", notebook)  # noqa: S102
    notebook["rate"].__module__ = "__main__"
    assert package["rate"](3, 512, 2.0, 4000) == 6.0 and package["rate"](3, 512, 2.0, 4000, guard=True) == 6.0
    with pytest.raises(_release.NotReleased):
        package["rate"](3, 512, 2.0, 4000, guard=False)  # the reference's option, not the exercise's
    norm = package["LayerNorm"](4, kind="notes")
    assert type(norm) is notebook["LayerNorm"] and norm.eps == 1e-6  # eps=None, the reference's default: theirs
    assert package["LayerNorm"](4, eps=1e-3).eps == 1e-3
    with pytest.raises(_release.NotReleased):
        package["LayerNorm"](4, kind="torch")


@pytest.mark.fast
def test_a_figure_whose_reference_is_not_released_runs_the_students_answer_or_stops_with_one_line(monkeypatch):
    import torch

    from tfm_solution import _stored
    from tfm_solution._release import NotReleased
    from tfm_solution.viz import stored, student
    from tfm_solution.viz.language import set_language

    def reference(x):
        raise NotReleased("double", 7)

    def stub(x):
        raise NotImplementedError()

    def double(x):
        return 2 * x

    probe = lambda fn: fn(torch.ones(2))  # noqa: E731
    # the self-learner's course: the reference stands in for the stub (and here it raises, being a stand-in)
    assert student.resolve(stub, reference, probe, "double").status == "stub"
    monkeypatch.setattr(student, "RELEASED_THROUGH", 5)
    with pytest.raises(NotReleased) as stopped:
        student.resolve(stub, reference, probe, "double")
    assert stopped.value.chapter == 7 and stopped.value.yours
    used = student.resolve(double, reference, probe, "double")
    assert used.fn is double and used.yours
    assert stored.message(stopped.value, True) == "Stored figure: write `double` to make this figure live."
    assert "chapter 08" in stored.message(NotReleased("make_model", 8), True)
    set_language("zh")
    try:
        assert stored.message(stopped.value, True) == "存储的图：写出 `double`，这张图就会实时绘制。"
        assert "第 08 章" in stored.message(NotReleased("make_model", 8), False)
    finally:
        set_language(None)
    # the figures a release stores: a widget's first image, keyed by its cell's source
    nb = json.loads(_notebook("07").read_text())
    (cell,) = [c for c in nb["cells"] if c.get("id") == "a47fa8e7"]
    figures = _stored.figures_of(nb)
    assert _stored.cell_key("".join(cell["source"]) + "\n  ") in figures
    assert set(release.stored_figures(6)) < set(release.stored_figures(5))


def _fresh_venv(wheel: Path, where: Path) -> Path:
    """A venv of its own: the locked third-party packages (a path file to them, without the course's own editable
    install) and the release's wheel, installed from the file. Its python."""
    venv = where / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    locked = Path(subprocess.run([sys.executable, "-c", "import torch, pathlib; print(pathlib.Path(torch.__file__)"
                                  ".parents[1])"], check=True, capture_output=True, text=True).stdout.strip())
    (site / "locked.pth").write_text(f"{locked}\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target",
                    str(site), str(wheel)], check=True)
    return python


_RUN = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import nbformat
    from nbclient import NotebookClient
    stops = []
    def done(cell, cell_index, execute_reply):
        if execute_reply["content"].get("status") == "error":
            stops.append([cell.get("id"), "raises-exception" in cell.metadata.get("tags", []),
                          execute_reply["content"].get("ename"), execute_reply["content"].get("evalue", "")[:300]])
    found = {}
    for name in sys.argv[1:]:
        path = Path(name)
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True, on_cell_executed=done,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        for cell in nb.cells:
            if cell.cell_type == "code":
                found[cell.get("id")] = [o.get("text", "") if o.output_type == "stream" else
                                         sorted(o.get("data", {})) for o in cell.outputs]
    print(json.dumps({"stops": stops, "outputs": found}))
''')


@pytest.fixture(scope="module")
def release_05(tmp_path_factory):
    """The release through chapter 5, and the python of a fresh venv holding only it (and the locked packages)."""
    where = tmp_path_factory.mktemp("release05-venv")
    built = release.build_release(5, where / "dist")
    (wheel,) = (built.folder / "wheel").glob("*.whl")
    return built, _fresh_venv(wheel, where)


def _run_chapters(python: Path, notebooks: list[Path], cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COV_CORE_SOURCE")}
    done = subprocess.run([str(python), "-c", _RUN, *map(str, notebooks)], capture_output=True, text=True, cwd=cwd,
                          env={**env, "MPLBACKEND": "Agg", "TFM_LANGUAGE": "en"}, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_chapters_6_to_12_run_from_a_release_through_05_with_stubs(release_05, tmp_path):
    """A fresh venv holding only the release through chapter 5 runs the untouched notebooks of chapters 6-12 top to
    bottom: a cell stops only where it is marked to (`raises-exception`: a visible test of an unwritten exercise,
    or what needs it), never with a traceback of the package; a figure that needs an unreleased answer shows the
    figure the chapter stored, and one line that says which answer makes it live. Chapter 12 reads the student's
    chapters with the package's loader and names every answer still a stub."""
    built, python = release_05
    got = _run_chapters(python, [next((built.folder / "chapters").glob(f"{c:02d}_*/*.ipynb")) for c in range(6, 13)],
                        tmp_path)
    unmarked = [s for s in got["stops"] if not s[1]]
    assert unmarked == [], unmarked
    assert {ename for _, _, ename, _ in got["stops"]} <= {"NotImplementedError", "NotReleased", "NameError"}
    outputs = got["outputs"]
    # chapter 7's LayerNorm explorer: the stored figure, then the line
    assert outputs["a47fa8e7"] == [["image/png", "text/plain"], "Stored figure: write `LayerNorm` to make this "
                                                                 "figure live.\n"]
    assert "Stored figure: write `SublayerConnection` to make this figure live.\n" in outputs["e98d9a7c"]
    # chapter 8's cross-attention explorer puts the course model's weights in the reader's make_model
    assert outputs["fe0112db"][-1] == "Stored figure: write `make_model` to make this figure live.\n"
    lines = [o for cell in outputs.values() for o in cell if isinstance(o, str)]
    assert not any("Traceback" in line or "site-packages" in line for line in lines)
    loaded = "".join(outputs["cell-04"])
    assert "PROBLEM: chapter 1 (01_embeddings/embeddings.ipynb): `Embeddings` is not implemented yet" in loaded
    assert "PROBLEM: chapter 11 (11_kv_cache/kv_cache.ipynb): `greedy_decode_cached` is not implemented" in loaded


@pytest.mark.slow
def test_each_chapter_runs_live_in_its_week_with_the_answers_written(tmp_path):
    """Week n: the release through chapter n-1, and chapter n with every answer written (the solution's; for
    chapter 12, chapters 1-11 too, beside it). Everything that needs only released answers and the reader's own
    runs live, the package's code calling the reader's answers where their references are not released
    (`NotReleased.stand_in`); chapter 12 builds, trains and translates with the student's own chapters, read by the
    package's loader. What needs a later chapter's answer (the course model is built by chapter 8's `make_model`)
    stops, marked, or shows its stored figure, saying which chapter releases it; and so does what follows from it."""
    beyond = {8: {"49e40643",   # the reference's layers, previewed above the exercise that asks for them
                  "a17c551d"}}  # the paper's setting (Post-LN, one tied matrix): more than the exercise's make_model
    for chapter in range(6, 13):
        built = release.build_release(chapter - 1, tmp_path / f"dist{chapter}")
        (wheel,) = (built.folder / "wheel").glob("*.whl")
        python = _fresh_venv(wheel, tmp_path / f"week{chapter}")
        course = tmp_path / f"course{chapter}"
        for folder in sorted((built.folder / "chapters").iterdir())[:chapter]:
            (student,) = folder.glob("*.ipynb")
            solved_release(student, course / folder.name, _notebook(folder.name[:2], "solutions"))
        got = _run_chapters(python, [next(course.glob(f"{chapter:02d}_*/*.ipynb"))], tmp_path)
        later = [stop for stop in got["stops"] if stop[2] == "NotReleased" and stop[0] not in beyond.get(chapter, ())]
        assert all(int(re.search(r"of chapter (\d+)", stop[3])[1]) > chapter for stop in later), (chapter, later)
        assert all(stop[1] and stop[2] in ("NotReleased", "NameError") for stop in got["stops"]), (chapter, got["stops"])
        lines = [o for cell in got["outputs"].values() for o in cell if isinstance(o, str)]
        stored = [line for line in lines if line.startswith("Stored figure")]
        assert all((m := re.search(r"of chapter (\d+)", line)) and int(m[1]) > chapter for line in stored), stored
    assert got["stops"] == [] and got["outputs"]["cell-04"][-1].endswith("Every piece is there.\n")  # chapter 12


@pytest.mark.fast
def test_the_gradescope_package_of_a_release_grades_with_its_cut_off(tmp_path):
    """`gradescope-zip --released-through NN`: the package's `run_autograder` grades with the release's cut-off
    (`AUTOGRADER_RELEASED_THROUGH`), so its workers receive no reference of a chapter not yet released."""
    import zipfile

    from autograder import gradescope
    from autograder.__main__ import main

    def script(zip_path: Path) -> str:
        with zipfile.ZipFile(zip_path) as archive:
            return archive.read("run_autograder").decode()

    assert main(["gradescope-zip", "--chapter", "6", "--released-through", "5", "--out", str(tmp_path / "a.zip")]) == 0
    text = script(tmp_path / "a.zip")
    assert "export AUTOGRADER_RELEASED_THROUGH=5\n" in text
    assert text.index("AUTOGRADER_RELEASED_THROUGH") < text.index("exec ")
    # run as Gradescope runs it, with the grader replaced by what prints the cut-off it received
    root = tmp_path / "root"
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "source").mkdir()
    (root / "venv" / "bin" / "python").write_text("#!/bin/sh\necho \"cut-off=$AUTOGRADER_RELEASED_THROUGH\"\n")
    (root / "venv" / "bin" / "python").chmod(0o755)
    (root / "run_autograder").write_text(text)
    done = subprocess.run(["bash", str(root / "run_autograder")], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "AUTOGRADER_ROOT": str(root)})
    assert done.stdout.strip() == "cut-off=5", done.stderr
    # the self-learner's package sets none; a cut-off that is no chapter is refused
    gradescope.build("6", tmp_path / "b.zip")
    assert "AUTOGRADER_RELEASED_THROUGH" not in script(tmp_path / "b.zip")
    with pytest.raises(ValueError):
        gradescope.build("6", tmp_path / "c.zip", released_through=13)
