"""Chapter 12's diagnosis, on a planted bug in every component: what the grader names, and at what cost.

    python scripts/capstone_diagnosis.py                  # every bug of ch12_capstone.PLANTED and ALSO_PLANTED
    python scripts/capstone_diagnosis.py attention loss   # some of them (printed, not recorded)
    python scripts/capstone_diagnosis.py --merge loss     # some of them, replacing their rows in the record

For each planted bug: does it pass its own chapter's visible tests (run here against the buggy answer,
with the rest of that chapter's solution), and what does Part A's grader make of the solution's
notebooks with that one answer replaced: the score, the exact match, the component the diagnosis
names, how many extra training runs it took. Writes ``tfm_solution/assets/capstone_diagnosis.json``
(the table of the bugs it ran, and the command that ran them).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder.course_code import run_course  # noqa: E402
from tfm_solution.my_chapters import PREAMBLE  # noqa: E402
from autograder.exercises.ch12_capstone import ACCURACY_BANDS, ALSO_PLANTED, COMPONENTS, PLANTED, TASK  # noqa: E402
from autograder.grade import grade_path  # noqa: E402

OUT = REPO / "tfm_solution" / "assets" / "capstone_diagnosis.json"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def _grade_id(cell) -> str:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")


def _solved(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if not line.strip().startswith(MARKERS))


def notebook_of(grade_id: str, root: Path = REPO / "solutions") -> Path:
    """The solution notebook holding the answer cell ``grade_id``."""
    for path in sorted(root.glob("*/*.ipynb")):
        if any(_grade_id(c) == grade_id for c in nbformat.read(path, as_version=4).cells):
            return path
    raise KeyError(grade_id)


def solution_answer(grade_id: str) -> str:
    """The solution's answer cell ``grade_id``, without its nbgrader markers."""
    return next(_solved(c.source) for c in nbformat.read(notebook_of(grade_id), as_version=4).cells
                if _grade_id(c) == grade_id)


def visible_tests(grade_id: str, source: str) -> str | None:
    """Run the visible tests of the answer ``grade_id`` against ``source`` in place of the solution's answer,
    with the rest of that chapter's answers and imports; ``None`` when they pass, else the error."""
    path = notebook_of(grade_id)
    nb = nbformat.read(path, as_version=4)
    if path.parent.name.startswith("12_"):
        namespace = run_course(REPO / "solutions")
    else:
        namespace = {"__name__": "visible"}
        exec(PREAMBLE, namespace)  # noqa: S102 - the course's own code
        for cell in nb.cells:
            if cell.cell_type == "code" and not cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
                try:
                    body = ast.parse(cell.source).body
                except SyntaxError:
                    continue
                for node in body:
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        exec(ast.unparse(node), namespace)  # noqa: S102
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") and _grade_id(cell) != grade_id:
                exec(_solved(cell.source), namespace)  # noqa: S102
    exec(source, namespace)  # noqa: S102 - the planted bug
    for cell in nb.cells:
        if _grade_id(cell).startswith(f"{grade_id}-visible"):
            try:
                exec(cell.source, namespace)  # noqa: S102 - the chapter's visible test
            except Exception as exc:  # noqa: BLE001 - a failing test is the answer
                return f"{_grade_id(cell)}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return None


def submission_with(folder: Path, grade_id: str, source: str, fresh: bool = True) -> Path:
    """A copy of the solution notebooks in ``folder`` whose answer ``grade_id`` is ``source`` (``fresh=False``:
    rewrite the copy already there)."""
    if fresh:
        shutil.copytree(REPO / "solutions", folder, ignore=shutil.ignore_patterns("my_model"))
    path = folder / notebook_of(grade_id).relative_to(REPO / "solutions")
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if _grade_id(cell) == grade_id:
            cell.source = source.strip("\n")
    nbformat.write(nb, path)
    return folder


def diagnose(component: str) -> dict:
    """Grade the solution with the bug ``component`` (a key of ``PLANTED`` or ``ALSO_PLANTED``) in place of its
    answer: the score, what the diagnosis names and, for ``ALSO_PLANTED``, whether the grade says what it must."""
    also = component in ALSO_PLANTED
    grade_id, what, *shows, source = ALSO_PLANTED[component] if also else PLANTED[component]
    with tempfile.TemporaryDirectory(prefix="capstone-bug-") as scratch:
        report = grade_path(submission_with(Path(scratch) / "course", grade_id, source), chapter="12",
                            only="ch12.reversal")
    lines = {t.name: t.output for t in report.tests}
    top = next(out for name, out in lines.items() if f"exact match at least {ACCURACY_BANDS[-1]:.0%}" in name)
    notes = next((out for name, out in lines.items() if name.endswith("notes")), "")
    named = re.search(r"\*\*Diagnosis: ([^*]+)\*\*", notes)
    runs = re.search(r"\((\d+) more training runs, (\d+) CPU seconds", notes)
    accuracy = re.search(r"exact match: ([\d.]+)%", top)
    row = {"component": component, "answer_cell": grade_id, "bug": what, "visible_tests": visible_tests(grade_id, source) or "pass",
           "score": report.exercise_score("ch12.reversal"),
           "accuracy": float(accuracy.group(1)) / 100 if accuracy else None,
           "raised": None if accuracy else top.split("\n\n")[-1][:200],
           "named": named.group(1) if named else None, "right": bool(named) and named.group(1) == component,
           "runs": int(runs.group(1)) if runs else 0, "probe_cpu_s": int(runs.group(2)) if runs else 0}
    if also:
        row.update(right=shows[0] in "\n".join(lines.values()), says=shows[0])
    return row


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    merge = "--merge" in args
    chosen = [a for a in args if a != "--merge"] or [*(c[0] for c in COMPONENTS), *ALSO_PLANTED]
    rows = []
    for component in chosen:
        rows.append(diagnose(component))
        print(json.dumps(rows[-1]), flush=True)
    if merge:  # these rows replace theirs in the record, made by the same task and grader
        recorded = json.loads(OUT.read_text())
        assert recorded["task"] == json.loads(json.dumps(TASK)), "the record is of another task: rerun them all"
        fresh = {r["component"]: r for r in rows}
        rows = [fresh.get(r["component"], r) for r in recorded["bugs"] + recorded["more"]]
    elif len(chosen) < len(COMPONENTS) + len(ALSO_PLANTED):
        return 0  # some of them: printed, not recorded
    OUT.write_text(json.dumps({"command": "python scripts/capstone_diagnosis.py", "task": TASK,
                               "bugs": [r for r in rows if r["component"] in PLANTED],
                               "more": [r for r in rows if r["component"] in ALSO_PLANTED]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
