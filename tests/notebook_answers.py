"""Build submissions from the course's own notebooks: the solution's answers, put into the release."""

from __future__ import annotations

from pathlib import Path

import nbformat

from autograder.registry import by_chapter, by_id

_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def _grade_id(cell: nbformat.NotebookNode) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def solution_answers(solution: Path) -> dict[str, str]:
    """Exercise id -> the answer cell of the solution notebook, without the nbgrader markers."""
    ids = {e.solution_grade_id: e.id for e in by_chapter(solution.parent.name)}
    return {
        ids[_grade_id(cell)]: "\n".join(
            line for line in cell.source.splitlines() if not line.strip().startswith(_MARKERS)
        )
        for cell in nbformat.read(solution, as_version=4).cells
        if _grade_id(cell) in ids
    }


def release_with(release: Path, folder: Path, answers: dict[str, str]) -> Path:
    """A copy of the student notebook in ``folder`` whose answer cells hold ``answers`` (by exercise id)."""
    nb = nbformat.read(release, as_version=4)
    by_grade_id = {by_id(exercise_id).solution_grade_id: source for exercise_id, source in answers.items()}
    for cell in nb.cells:
        if _grade_id(cell) in by_grade_id:
            cell.source = by_grade_id[_grade_id(cell)]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / release.name)
    return folder / release.name


def solved_release(release: Path, folder: Path, solution: Path) -> Path:
    """A copy of the student notebook in ``folder`` with every answer region of ``solution`` filled in, the
    practice answers too (chapter 12 builds on all of them), as a student who did everything hands it in."""
    answers = {
        _grade_id(cell): "\n".join(line for line in cell.source.splitlines() if not line.strip().startswith(_MARKERS))
        for cell in nbformat.read(solution, as_version=4).cells
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution")
    }
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        if _grade_id(cell) in answers:
            cell.source = answers[_grade_id(cell)]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / release.name)
    return folder / release.name
