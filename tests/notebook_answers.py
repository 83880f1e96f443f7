"""Build submissions from the course's own notebooks: the solution's answers, put into the release."""

from __future__ import annotations

from pathlib import Path

import nbformat

from autograder.registry import by_chapter, by_id

_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def _grade_id(cell: nbformat.NotebookNode) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _answer_regions(solution: Path) -> dict[str, str]:
    """Grade id -> every answer region of the solution notebook (graded or practice), without the nbgrader markers."""
    return {
        _grade_id(cell): "\n".join(line for line in cell.source.splitlines() if not line.strip().startswith(_MARKERS))
        for cell in nbformat.read(solution, as_version=4).cells
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution")
    }


def solution_answers(solution: Path) -> dict[str, str]:
    """Exercise id -> the answer cell of the solution notebook, without the nbgrader markers."""
    regions = _answer_regions(solution)
    return {e.id: regions[e.solution_grade_id] for e in by_chapter(solution.parent.name) if e.solution_grade_id in regions}


def _filled(release: Path, folder: Path, by_grade_id: dict[str, str]) -> Path:
    """A copy of the student notebook in ``folder`` whose cells named in ``by_grade_id`` hold that source."""
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        if _grade_id(cell) in by_grade_id:
            cell.source = by_grade_id[_grade_id(cell)]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / release.name)
    return folder / release.name


def release_with(release: Path, folder: Path, answers: dict[str, str]) -> Path:
    """A copy of the student notebook in ``folder`` whose answer cells hold ``answers`` (by exercise id)."""
    return _filled(release, folder, {by_id(exercise_id).solution_grade_id: source for exercise_id, source in answers.items()})


def solved_release(release: Path, folder: Path, solution: Path) -> Path:
    """A copy of the student notebook in ``folder`` with every answer region of ``solution`` filled in, the
    practice answers too (chapter 12 builds on all of them), as a student who did everything hands it in."""
    return _filled(release, folder, _answer_regions(solution))
