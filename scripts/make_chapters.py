"""Regenerate everything derived from ``solutions/``: run by ``make chapters``.

For every chapter notebook ``solutions/NN_slug/<name>.ipynb`` (the nbgrader source):

1. the graded test cells are written from the exercise registry (their points and source), and each
   exercise's statement ends with its contract (``autograder.contract``);
2. the notebook is executed with nbclient, and its outputs and widget state are stored in it
   (graded cells are not run here: they call the grader, and their outputs never ship);
3. ``nbgrader generate_assignment`` releases it into a scratch directory (solutions become
   stubs, hidden tests vanish, cells are locked and checksummed);
4. the outputs and widget state of every cell that is not an exercise or a test are carried
   over, so the student notebook shows the reference's figures as an expected-output preview
   and the website needs no execution; the result is written to ``chapters/NN_slug/``.

It also draws the architecture figure of the introduction page, writes the README's exercise
table from the registry, and writes the chapter map into the README and the Chinese introduction.
Everything is deterministic:
widget ids are derived from the notebook's path, PNGs carry no version text, so running it
twice changes nothing.

``--check`` runs steps 1, 3 and 4 on the committed solutions (no execution) and exits 1 if
``chapters/``, the figures or the README table differ from what they would produce: the sync
test of CI.
"""

from __future__ import annotations

import argparse
import copy
import filecmp
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder.contract import place as place_contract  # noqa: E402
from autograder.registry import REGISTRY, Exercise, by_chapter  # noqa: E402
from scripts import translations  # noqa: E402

SOLUTIONS, CHAPTERS, FIGURES = "solutions", "chapters", "figures"
SOLUTION_ONLY = "my_model"  # a solution's trained weights (chapter 12, Part B): graded, never released
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def hidden_test_source(exercise: Exercise) -> str:
    """The one graded test cell of an exercise, as the grader contract fixes it."""
    what = exercise.signature if exercise.runner else f"`{exercise.name}` on fresh random inputs against the reference"
    return (
        f"# Hidden tests: the grader checks {what}.\n"
        "### BEGIN HIDDEN TESTS\n"
        "from autograder.hook import grade_in_notebook\n"
        f'grade_in_notebook("{exercise.id}", globals())\n'
        "### END HIDDEN TESTS"
    )


def nbgrader_meta(cell: nbformat.NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_plain(cell: nbformat.NotebookNode) -> bool:
    """A cell that is neither an exercise, nor a test, nor read-only: its outputs ship."""
    meta = nbgrader_meta(cell)
    return not (meta.get("solution") or meta.get("grade") or meta.get("locked"))


def apply_registry(nb: nbformat.NotebookNode, chapter: str, notebook: str) -> list[str]:
    """Write each exercise's graded cell from the registry; return the problems found."""
    problems = []
    by_grade_id = {nbgrader_meta(c).get("grade_id"): c for c in nb.cells if nbgrader_meta(c)}
    exercises = [e for e in by_chapter(chapter) if e.notebook == notebook]
    for ex in exercises:
        answer = by_grade_id.get(ex.solution_grade_id)
        if answer is None or not nbgrader_meta(answer).get("solution"):
            problems.append(f"{ex.id}: no solution cell with grade_id {ex.solution_grade_id!r}")
        elif not re.search(rf"^(def|class) {ex.name}\b", answer.source, re.M) or "### BEGIN SOLUTION" not in answer.source:
            problems.append(f"{ex.id}: cell {ex.solution_grade_id!r} must define {ex.name} with a solution region")
        graded = by_grade_id.get(ex.test_grade_id)
        if graded is None:
            problems.append(f"{ex.id}: no graded test cell with grade_id {ex.test_grade_id!r}")
            continue
        graded.source = hidden_test_source(ex)
        graded.metadata["nbgrader"].update(grade=True, solution=False, locked=True, points=ex.points)
        if ex.contract is not None:  # the statement ends with what the grader checks besides the values
            problems += place_contract(nb.cells, ex)
    known = {e.test_grade_id for e in exercises}
    for grade_id, cell in by_grade_id.items():
        if nbgrader_meta(cell).get("grade") and grade_id not in known:
            problems.append(f"{chapter}/{notebook}: graded cell {grade_id!r} is not in the registry")
    return problems


def execute(nb: nbformat.NotebookNode, workdir: Path) -> nbformat.NotebookNode:
    """Run every cell except the graded ones; return the notebook with outputs and widget state."""
    runnable = copy.deepcopy(nb)
    for cell in runnable.cells:
        if cell.cell_type == "code" and nbgrader_meta(cell).get("grade"):
            cell.source = ""
    NotebookClient(
        runnable, timeout=600, kernel_name="python3", record_timing=False, resources={"metadata": {"path": str(workdir)}}
    ).execute()
    for cell, ran in zip(nb.cells, runnable.cells, strict=True):
        if cell.cell_type == "code":
            graded = nbgrader_meta(cell).get("grade")
            cell.outputs = [] if graded else ran.outputs
            cell.execution_count = None if graded else ran.execution_count
    nb.metadata["widgets"] = runnable.metadata.get("widgets", {})
    return nb


def merge_streams(outputs: list) -> list:
    """Join consecutive prints to the same stream: how a kernel splits them varies between runs."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if output.output_type == "stream" and previous is not None and previous.output_type == "stream" and previous.name == output.name:
            previous.text += output.text
        else:
            merged.append(output)
    return merged


def normalize(nb: nbformat.NotebookNode, salt: str) -> nbformat.NotebookNode:
    """Make an executed notebook reproducible: fixed widget ids, short widget reprs, no timings."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                # The default repr spells out every child, PNG bytes included: megabytes of noise.
                data["text/plain"] = "An interactive widget: run the notebook, or view it on the course website."
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    text = nbformat.writes(nb)
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for n, model_id in enumerate(state):
        text = text.replace(model_id, hashlib.sha1(f"{salt}:{n}".encode()).hexdigest()[:32])
    return nbformat.reads(text, as_version=4)


def missing_widget_state(nb: nbformat.NotebookNode) -> list[str]:
    """Model ids of widget views whose state is not saved in the notebook.

    Without saved state a static page drops such a widget silently (no warning, even under -W).
    """
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return [
        output["data"][WIDGET_VIEW]["model_id"]
        for cell in nb.cells
        for output in cell.get("outputs", [])
        if WIDGET_VIEW in output.get("data", {}) and output["data"][WIDGET_VIEW]["model_id"] not in state
    ]


def carry(source: nbformat.NotebookNode, release: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Copy the outputs of plain cells and the widget state from the executed source."""
    if [c.get("id") for c in source.cells] != [c.get("id") for c in release.cells]:
        raise RuntimeError("nbgrader changed the cell list; cannot carry outputs over")
    for src, rel in zip(source.cells, release.cells, strict=True):
        if rel.cell_type == "code" and is_plain(src):
            rel.outputs = copy.deepcopy(src.outputs)
            rel.execution_count = src.execution_count
    if source.metadata.get("widgets"):
        release.metadata["widgets"] = copy.deepcopy(source.metadata["widgets"])
    missing = missing_widget_state(release)
    if missing:
        raise RuntimeError(f"widget views without saved state: {missing}")
    return release


def source_notebooks(root: Path) -> list[tuple[str, Path]]:
    """``(chapter folder, notebook path)`` of every source notebook, in chapter order."""
    return [(p.parent.name, p) for p in sorted((root / SOLUTIONS).glob("*/*.ipynb"))]


def run_nbgrader(root: Path, chapter: str, release_dir: Path) -> None:
    env = dict(os.environ)
    # nbgrader shells out to alembic (in the environment's bin/) when it touches a gradebook.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [
        sys.executable, "-m", "nbgrader", "generate_assignment", chapter, "--no-db", "--force", "--log-level=WARN",
        f"--CourseDirectory.root={root}", f"--CourseDirectory.release_directory={release_dir}",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment {chapter} failed:\n{done.stdout}\n{done.stderr}")


def draw_figures(out: Path) -> list[Path]:
    """The figures of the book's own pages (not of notebooks): the architecture overview."""
    from tfm_solution.viz import architecture_diagram, figure_png

    out.mkdir(parents=True, exist_ok=True)
    path = out / "architecture.png"
    path.write_bytes(figure_png(architecture_diagram(), dpi=110))
    return [path]


def generate(root: Path, out: Path, *, run: bool, only: str | None = None) -> list[str]:
    """Build ``chapters/`` (and figures) into ``out``; with ``run``, execute and rewrite the solutions.

    ``only`` names one chapter folder: just that chapter is executed and released, and the
    other folders of ``out/chapters`` are left as they are.
    """
    problems: list[str] = []
    notebooks = [(c, p) for c, p in source_notebooks(root) if only in (None, c)]
    if only is not None and not notebooks:
        return [f"no notebook under {SOLUTIONS}/{only}/"]
    for chapter, path in notebooks:
        nb = nbformat.read(path, as_version=4)
        found = apply_registry(nb, chapter, path.name)
        problems += found
        if found:
            continue
        if run:
            nb = normalize(execute(nb, path.parent), salt=f"{chapter}/{path.name}")
        text = nbformat.writes(nb) + "\n"
        if path.read_text() != text:
            if not run:
                problems.append(f"{path.relative_to(root)}: its graded cells differ from the registry")
                continue
            path.write_text(text)
    missing = {e.chapter for e in REGISTRY if only in (None, e.chapter)} - {c for c, _ in notebooks}
    problems += [f"registry chapter {c!r} has no notebook under {SOLUTIONS}/" for c in sorted(missing)]
    if problems:
        return problems
    with tempfile.TemporaryDirectory() as scratch:
        release_root = Path(scratch)
        for chapter in sorted({c for c, _ in notebooks}):
            run_nbgrader(root, chapter, release_root)
        for chapter, path in notebooks:
            released = release_root / chapter / path.name
            nb = carry(nbformat.read(path, as_version=4), nbformat.read(released, as_version=4))
            released.write_text(nbformat.writes(nb) + "\n")
        if only is None:
            shutil.rmtree(out / CHAPTERS, ignore_errors=True)
        (out / CHAPTERS).mkdir(parents=True, exist_ok=True)
        for folder in sorted(release_root.iterdir()):
            shutil.rmtree(out / CHAPTERS / folder.name, ignore_errors=True)
            # Trained weights of a solution (chapter 12's) are graded, never released.
            shutil.copytree(folder, out / CHAPTERS / folder.name, ignore=shutil.ignore_patterns(SOLUTION_ONLY))
    draw_figures(out / FIGURES)
    (out / "README.md").write_text(with_chapter_table(with_exercise_table((root / "README.md").read_text()), root))
    # The Chinese course (zh/) from the student notebooks just released and translations/zh/: a
    # stale or missing translation is a problem, so `--check` fails on it too.
    return generate_zh(root, out, only)


def generate_zh(root: Path, out: Path, only: str | None = None) -> list[str]:
    """Write ``out/zh`` from the student notebooks under ``out/chapters`` and ``translations/zh/``, with the
    Chinese introduction's chapter map; return the problems found. ``--zh`` runs only this step."""
    problems = translations.generate(root, out, release_root=out, only=only)
    site = out / translations.SITE
    intro = site / "intro.md"
    if CHAPTERS_START in intro.read_text():
        intro.write_text(with_chapter_table(intro.read_text(), root, site / CHAPTERS, translations.LANGUAGE))
    else:
        problems.append(f"{translations.TRANSLATIONS}/intro.md: the chapters section lacks the chapter-table markers")
    return problems


TABLE_START, TABLE_END = "<!-- exercise-table: generated by make chapters -->", "<!-- end of exercise-table -->"


def _builds_on(ex: Exercise) -> str:
    """The earlier chapters whose code an exercise's prerequisites come from, and the exercises of its own
    chapter among them: what a reader needs done first (the registry keeps the full list)."""
    home: dict[str, int] = {}
    for e in REGISTRY:  # a module's chapter is the first that grades code of it (chapter 12 grades them all again)
        module = e.reference.split(":")[0]
        home[module] = min(home.get(module, 99), int(e.chapter[:2]))
    by_reference = {e.reference: e for e in REGISTRY}
    own = int(ex.chapter[:2])
    chapters = sorted({home[p.split(":")[0]] for p in ex.prerequisites if p.split(":")[0] in home} - {own})
    if ex.runner:  # graded on the student's own answers of every earlier chapter (chapter 12)
        chapters = sorted({int(e.chapter[:2]) for e in REGISTRY} - {own})
    spans: list[list[int]] = []
    for c in chapters:
        if spans and c == spans[-1][1] + 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    parts = [f"{a}" if a == b else f"{a}–{b}" for a, b in spans]
    here = [f"`{by_reference[p].name}`" for p in ex.prerequisites if p in by_reference and by_reference[p].chapter == ex.chapter]
    text = ", ".join(parts)
    return "; ".join(x for x in (text, ", ".join(here)) if x) or "none"


def exercise_table() -> str:
    """The README's exercise table, one row per registry entry."""
    rows = [
        "| chapter | exercise | signature | points | budget | builds on (chapters; exercises of its chapter) "
        "| mistakes the grader names |",
        "|---|---|---|---|---|---|---|",
    ]
    for ex in REGISTRY:
        link = f"[{ex.chapter}](chapters/{ex.chapter}/{ex.notebook})"
        prerequisites = _builds_on(ex)
        mistakes = ", ".join(f"`{m}`" for m in ex.mistakes) or "none"
        budget = f"{ex.time_budget_s:g} s, {ex.memory_budget_mb} MB"
        rows.append(f"| {link} | `{ex.id}` | `{ex.signature}` | {ex.points} | {budget} | {prerequisites} | {mistakes} |")
    return "\n".join(rows)


CHAPTERS_START, CHAPTERS_END = "<!-- chapter-table: generated by make chapters -->", "<!-- end of chapter-table -->"


@dataclass(frozen=True)
class MapWords:
    """How one language writes the chapter map: its header row, the separators of a list of names
    (before the last one: ``last``), and an empty list."""

    header: str
    comma: str
    last: str
    nothing: str

    def names(self, names: list[str]) -> str:
        if len(names) < 2:
            return names[0] if names else self.nothing
        return self.comma.join(names[:-1]) + self.last + names[-1]


MAP_WORDS = {
    "en": MapWords("| chapter | block | you write |", ", ", ", ", "nothing graded"),
    translations.LANGUAGE: MapWords("| 章 | 模块 | 你要写的 |", "、", " 和 ", "不计分"),
}


def with_chapter_table(text: str, root: Path, notebooks: Path | None = None, language: str = "en") -> str:
    """``text`` with the chapter map between its markers: each chapter's title (the first heading of its
    notebook under ``notebooks``, ``solutions/`` by default) linked to its notebook, and the exercises the
    registry lists for it. The README holds the English map, which the book's introduction includes;
    the Chinese introduction gets the same map titled from the Chinese notebooks, so neither is written
    by hand."""
    words = MAP_WORDS[language]
    rows = [words.header, "|---|---|---|"]
    for chapter, path in source_notebooks(root):
        titled = path if notebooks is None else notebooks / chapter / path.name
        first = next(c for c in nbformat.read(titled, as_version=4).cells if c.cell_type == "markdown")
        number, title = first.source.splitlines()[0].lstrip("# ").split(". ", 1)
        names = words.names([f"`{e.name}`" for e in by_chapter(chapter)])
        rows.append(f"| {number} | [{title}]({CHAPTERS}/{chapter}/{path.name}) | {names} |")
    if CHAPTERS_START not in text or CHAPTERS_END not in text:
        raise RuntimeError("the page lacks the chapter-table markers")
    head, rest = text.split(CHAPTERS_START, 1)
    return f"{head}{CHAPTERS_START}\n" + "\n".join(rows) + f"\n{CHAPTERS_END}{rest.split(CHAPTERS_END, 1)[1]}"


def with_exercise_table(readme: str) -> str:
    """``readme`` with the text between the table markers replaced by the current table."""
    if TABLE_START not in readme or TABLE_END not in readme:
        raise RuntimeError("README.md lacks the exercise-table markers")
    head, rest = readme.split(TABLE_START, 1)
    return f"{head}{TABLE_START}\n{exercise_table()}\n{TABLE_END}{rest.split(TABLE_END, 1)[1]}"


def differences(a: Path, b: Path) -> list[str]:
    """Files that differ between two trees, or exist in only one."""
    comparison = filecmp.dircmp(a, b)
    found = [f"only committed: {n}" for n in comparison.left_only] + [f"only in regenerated: {n}" for n in comparison.right_only]
    found += [f"differs: {n}" for n in comparison.diff_files]
    for sub, nested in comparison.subdirs.items():
        found += [f"{sub}/{d}" for d in differences(a / sub, b / sub)] if nested else []
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify chapters/ and figures/ are in sync; change nothing")
    parser.add_argument("--root", type=Path, default=REPO, help="the course root (default: this repository)")
    parser.add_argument("--chapter", metavar="NN_slug", help="regenerate only this chapter folder (not with --check)")
    parser.add_argument("--zh", action="store_true",
                        help="regenerate only zh/, from the committed chapters/ and translations/zh/ (seconds: no execution)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.zh:
        problems = generate_zh(root, root, args.chapter)
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print(json.dumps({"zh": translations.SITE, "problems": len(problems)}))
        return 1 if problems else 0
    if args.check:
        with tempfile.TemporaryDirectory() as scratch:
            problems = generate(root, Path(scratch), run=False)
            for name in (CHAPTERS, FIGURES, translations.SITE):
                if not problems:
                    problems += [f"{name}/{d}" for d in differences(root / name, Path(scratch) / name)]
            if not problems and (root / "README.md").read_text() != (Path(scratch) / "README.md").read_text():
                problems.append("README.md: the exercise table differs from the registry")
        for p in problems:
            print(f"out of sync: {p}", file=sys.stderr)
        if problems:
            print("Run `make chapters` and commit the result.", file=sys.stderr)
        return 1 if problems else 0
    problems = generate(root, root, run=True, only=args.chapter)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    done = [str(p.relative_to(root)) for c, p in source_notebooks(root) if args.chapter in (None, c)]
    print(json.dumps({"notebooks": done, "problems": len(problems)}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
