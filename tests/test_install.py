"""A student's install: `pip install .` alone runs every chapter, `pip install ".[grade]"` lets the
student grade their own notebook, and on Colab each chapter's first cell installs the package from
the one repository address in `_config.yml`."""

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tfm_solution import colab

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted(REPO.glob("solutions/[0-9][0-9]_*/*.ipynb"))
CHAPTERS = sorted(REPO.glob("chapters/[0-9][0-9]_*/*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _first_code_cell(path: Path) -> dict:
    return next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


def _expected_cell() -> str:
    return colab.install_cell(*colab.repository(REPO / "_config.yml"))


@pytest.mark.fast
@pytest.mark.parametrize("path", SOLUTIONS + CHAPTERS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_chapter_notebook_starts_with_the_colab_install_cell(path):
    cell = _first_code_cell(path)
    assert "".join(cell["source"]) == _expected_cell(), (
        f"{path.relative_to(REPO)}: the first code cell must be the one `python -m tfm_solution.colab` prints "
        "(run `python -m tfm_solution.colab --write`, then `make chapters`)"
    )
    assert "remove-cell" in cell["metadata"].get("tags", []), "the website does not show it"
    assert not cell.get("outputs"), "off Colab it prints nothing"


@pytest.mark.fast
def test_the_cell_installs_from_the_configured_address_on_colab_and_does_nothing_elsewhere(monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: calls.append(args[0]))
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(_expected_cell(), {})
    assert calls == [], "outside Colab nothing runs"
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    exec(_expected_cell(), {})
    url, branch = colab.repository(REPO / "_config.yml")
    assert calls == [[sys.executable, "-m", "pip", "install", "--quiet", f"git+{url}@{branch}"]]


@pytest.mark.fast
def test_the_address_lives_in_config_only_and_the_cell_is_rewritten_from_it(tmp_path):
    url, branch = colab.repository(REPO / "_config.yml")
    assert url.startswith("https://")
    with pytest.raises(ValueError, match="plain https"):
        colab.install_cell('https://example.org/x"; import os')
    with pytest.raises(ValueError, match="plain https"):
        colab.install_cell("git@github.com:a/b.git")
    root = tmp_path / "course"
    (root / "solutions" / "01_x").mkdir(parents=True)
    (root / "_config.yml").write_text("repository:\n  url: https://example.org/new/course\n  branch: pages\n")
    shutil.copy(SOLUTIONS[0], root / "solutions" / "01_x" / "x.ipynb")
    assert colab.write_first_cells(root) == [root / "solutions" / "01_x" / "x.ipynb"]
    assert colab.write_first_cells(root) == [], "a second run changes nothing"
    nb = json.loads((root / "solutions" / "01_x" / "x.ipynb").read_text())
    assert "".join(nb["cells"][0]["source"]).count("git+https://example.org/new/course@pages") == 1
    assert [c["id"] for c in nb["cells"]].count(colab.CELL_ID) == 1
    assert len(nb["cells"]) == len(json.loads(SOLUTIONS[0].read_text())["cells"])
    readme = (REPO / "README.md").read_text()
    assert "python -m tfm_solution.colab --write" in readme and "repository:" in readme


# ----------------------------------------------------------------------------- a fresh install runs every chapter

#: Run inside the scratch environment: every code cell of each notebook given, as IPython runs it,
#: except the graded cells (they call the grader, an instructor's tool); every widget must serialise
#: into the state a static page needs. Prints a line starting with argv[1] per notebook, after its own output.
_RUNNER = r'''
import json, os, sys, time
from pathlib import Path
import ipywidgets
from ipywidgets.embed import embed_data
from IPython.core.interactiveshell import InteractiveShell

REPORT = sys.argv[1]
shell = InteractiveShell.instance()
shown = []  # the widgets a cell passes to display() (chapter 12's live training monitor)
publish = shell.display_pub.publish
def counting(data, *args, **kwargs):
    if "application/vnd.jupyter.widget-view+json" in data:
        shown.append(data["application/vnd.jupyter.widget-view+json"]["model_id"])
    return publish(data, *args, **kwargs)
shell.display_pub.publish = counting
for path in [Path(p).resolve() for p in sys.argv[2:]]:
    start, widgets = time.time(), 0
    os.chdir(path.parent)  # as Jupyter runs a notebook: chapter 12 finds the earlier chapters beside its folder
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code" or cell["metadata"].get("nbgrader", {}).get("grade"):
            continue
        shown.clear()
        result = shell.run_cell("".join(cell["source"]))
        if not result.success:
            result.raise_error()
        views = [w for w in ipywidgets.Widget.widgets.values() if w.model_id in shown]
        if isinstance(result.result, ipywidgets.Widget):
            views.append(result.result)
        for view in views:
            state = embed_data(views=[view])["manager_state"]["state"]
            assert view.model_id in state, f"{path.name}: a widget without state"
        widgets += bool(views)
    import tfm_solution
    print(REPORT + json.dumps({"notebook": path.name, "widgets": widgets, "seconds": round(time.time() - start, 1),
                      "package": tfm_solution.__file__}), flush=True)
'''

_REPORT = "notebook report: "

#: What a student does not install: the course's and the developers' extras.
_NOT_INSTALLED = ("nbformat", "nbclient", "nbgrader", "jupyter_book", "pytest", "nbval", "transformers", "ipykernel")


def _run(cmd: list[str], **kwargs) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout


def _children_cpu() -> float:
    """CPU seconds used by finished child processes (what a quiet machine's clock would show)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _package_copy(dest: Path) -> Path:
    """The files `pip install .` reads, copied so that building leaves nothing in the repository."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("tfm_solution", "autograder"):
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    return dest


def _widget_cells(path: Path) -> int:
    cells = json.loads(path.read_text())["cells"]
    return sum(any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", [])) for c in cells)


@pytest.mark.slow
def test_pip_install_alone_runs_every_chapter_with_its_widgets(tmp_path):
    timings = {}
    start, cpu = time.time(), _children_cpu()
    venv = tmp_path / "venv"
    # A fresh environment with nothing but this package and its dependencies, at the locked versions;
    # pip runs from the test's environment (--python), so the new one needs no pip of its own.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    source = _package_copy(tmp_path / "source")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
          str(tmp_path / "wheel"), str(source)], cwd=source)
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile",
          "-c", str(REPO / "requirements.lock"), str(wheel)])
    timings["install"] = round(time.time() - start, 1)
    timings["install cpu"] = round(_children_cpu() - cpu, 1)

    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    for name in _NOT_INSTALLED:
        assert not list(Path(site).glob(f"{name}")) and not list(Path(site).glob(f"{name}-*.dist-info")), name
    assets = REPO / "tfm_solution" / "assets"
    shipped = {p.relative_to(assets.parent) for p in assets.rglob("*") if p.suffix in {".json", ".safetensors", ".jsonl", ".md"}}
    installed = {p.relative_to(Path(site) / "tfm_solution") for p in (Path(site) / "tfm_solution").rglob("*")}
    assert shipped <= installed, f"package data missing from the install: {sorted(map(str, shipped - installed))}"

    # Each chapter in a folder of its own, away from the repository: only the installed package can serve it.
    runs = tmp_path / "runs"
    notebooks = []
    for path in SOLUTIONS:
        (runs / path.parent.name).mkdir(parents=True)
        notebooks.append(Path(shutil.copy(path, runs / path.parent.name / path.name)))
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
           "MULTI30K_DIR": os.environ.get("MULTI30K_DIR", "")}
    halves = [notebooks[0::2], notebooks[1::2]]  # two processes for two cores
    (tmp_path / "runner.py").write_text(_RUNNER)
    with ThreadPoolExecutor(2) as pool:
        outputs = pool.map(lambda group: _run([str(python), str(tmp_path / "runner.py"), _REPORT, *map(str, group)],
                                              cwd=tmp_path, env=env) if group else "", halves)
        reports = [json.loads(line.removeprefix(_REPORT)) for out in outputs for line in out.splitlines()
                   if line.startswith(_REPORT)]
    timings["notebooks"] = round(time.time() - start - timings["install"], 1)
    timings["notebooks cpu"] = round(_children_cpu() - cpu - timings["install cpu"], 1)
    each = ", ".join(f"{r['notebook']} {r['seconds']} s" for r in reports)
    print(f"\nfresh install: {timings['install']} s wall, {timings['install cpu']} s CPU; {len(reports)} notebooks "
          f"in two processes: {timings['notebooks']} s wall, {timings['notebooks cpu']} s CPU ({each})")

    assert sorted(r["notebook"] for r in reports) == sorted(p.name for p in SOLUTIONS)
    for report in reports:
        assert report["package"].startswith(site), report
        (chapter,) = [p for p in CHAPTERS if p.name == report["notebook"]] or [None]
        if chapter is not None:
            assert report["widgets"] == _widget_cells(chapter), report

    # A student's own check, as the README says: the `grade` extra on top, then the grader's command.
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile",
          "-c", str(REPO / "requirements.lock"), f"{wheel}[grade]"])
    # Chapter 9: its training exercise loads parts of torch lazily, which an installed grader must not hide.
    solution = next(p for p in notebooks if p.parent.name == "09_training")
    results = tmp_path / "results.json"
    start = time.time()
    _run([str(python), "-m", "autograder", "grade", str(solution), "--chapter", "09", "--results", str(results)],
         cwd=tmp_path, env=env)
    graded = json.loads(results.read_text())
    print(f"grading chapter 9's solution with the installed grader: {time.time() - start:.1f} s")
    assert graded["score"] == graded["extra_data"]["max_score"] == 12, [t["output"] for t in graded["tests"]]
