"""A student's own Transformer, gathered from their chapter notebooks (chapter 12, the capstone), for the grader.

The capstone is graded on the student's whole course: the answer cells of their chapter notebooks,
gathered by the rules of ``tfm_solution.my_chapters`` (which the notebook's own ``load_my_chapters``
follows too), then the code of the capstone notebook itself, which adds the glue and may paste any
piece over a chapter's answer (the last definition wins, as in a kernel). Here the grader's side:
the notebooks read within the grader's caps, the code chunks a sandboxed worker runs (``gather``), or
a message naming every chapter answer that is missing, still a stub, or does not parse.
"""

from __future__ import annotations

from pathlib import Path

from autograder.extract import (MAX_NOTEBOOK_BYTES, Extraction, Notebook, Unreadable, _read_capped, extract,
                                find_notebook, normalised, parse_notebook, read_submission)
from autograder.registry import Exercise
from tfm_solution.my_chapters import CAPSTONE, PIECES, Gathered, Piece, defined, gather_pieces as _gather_pieces


def gather_pieces(notebooks: list[Notebook | Unreadable], capstone: Notebook | None) -> Gathered:
    """The student's answers of chapters 1-11 in chapter order (``tfm_solution.my_chapters``: the rules the
    notebook's own ``load_my_chapters`` follows), each statement as the worker runs it and the seed hashes it
    (``extract.normalised``); a piece the capstone notebook defines itself stands in for a missing answer."""
    others = [n for n in notebooks if n is not capstone]
    found = _gather_pieces(lambda piece: find_notebook(others, _stand_in(piece)),
                           defined(capstone.cells) if capstone is not None else set())
    for chunk in found.chunks:
        if "written" in chunk:
            chunk["source"], chunk["lines"] = normalised(chunk["written"])
    return found


def chapters_beside(capstone: Path) -> list[Notebook | Unreadable]:
    """The earlier chapters' notebooks of the course folder a lone capstone notebook sits in: for each
    chapter, ``<course>/<chapter>/<notebook>`` next to ``<course>/12_capstone/``, as the notebook's own
    ``load_my_chapters`` and the graded cell find them. Only those exact paths are read (no search, no
    links), each within the grader's size cap."""
    return chapter_notebooks(capstone.parent.parent)


def chapter_notebooks(course: Path) -> list[Notebook | Unreadable]:
    """The earlier chapters' notebooks at their exact places in ``course`` (``<course>/<chapter>/<notebook>``):
    no search, no links, each within the grader's size cap; a crowded folder costs nothing."""
    found: list[Notebook | Unreadable] = []
    for chapter, notebook in dict.fromkeys((p.chapter, p.notebook) for p in PIECES):
        path = course / chapter / notebook
        if path.is_symlink() or not path.is_file():
            continue
        name = f"{chapter}/{notebook}"
        size = path.stat().st_size
        found.append(Unreadable(name, f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MB") if size > MAX_NOTEBOOK_BYTES
                     else parse_notebook(name, _read_capped(path)))
    return found


def _stand_in(piece: Piece) -> Exercise:
    """Enough of an ``Exercise`` for ``find_notebook`` (by answer id, then file name, then definition)."""
    return Exercise(id=f"ch{piece.chapter[:2]}.{piece.name}", chapter=piece.chapter, notebook=piece.notebook,
                    name=piece.name, kind="function", signature="", points=0, solution_grade_id=piece.grade_id,
                    test_grade_id="", reference="", cases=lambda seed: [])


def gather(notebooks: list[Notebook | Unreadable], capstone: Notebook, exercise: Exercise) -> Extraction:
    """What the capstone's exercise is graded on: the student's chapters, then the capstone notebook's code
    (``extract``: its answer cell whole, definitions and imports of every other cell). When a required
    answer is missing or still a stub, ``error`` lists every one of them, chapter by chapter."""
    pieces = gather_pieces(notebooks, capstone)
    own = extract(capstone, exercise)
    result = Extraction(chunks=pieces.chunks + own.chunks, notes=pieces.notes + own.notes,
                        answer_source=own.answer_source, answer_label=own.answer_label, error=own.error)
    if pieces.problems and result.error is None:
        result.error = ("Your Transformer cannot be built yet: it uses your answers of the earlier chapters, and "
                        + ("this one is" if len(pieces.problems) == 1 else f"these {len(pieces.problems)} are")
                        + " not ready:\n\n" + "\n".join(f"- {p}" for p in pieces.problems)
                        + "\n\n(not implemented: nothing was trained or translated)")
    return result


def run_course(folder: str | Path) -> dict:
    """Every piece of a course folder's notebooks (chapters 1-11 and the capstone), run in a fresh
    namespace, as the grader's worker runs them but outside a sandbox: for the course's own scripts,
    on ``solutions/``. Raises ``ValueError`` naming what is missing."""
    from autograder.registry import by_id

    notebooks = read_submission(folder)
    capstone = next((nb for nb in notebooks if isinstance(nb, Notebook) and nb.name.startswith(CAPSTONE)), None)
    if capstone is None:
        raise ValueError(f"no {CAPSTONE} notebook under {folder}")
    extraction = gather(notebooks, capstone, by_id("ch12.reversal"))
    if extraction.error:
        raise ValueError(extraction.error)
    namespace: dict = {"__name__": "course"}
    for chunk in extraction.chunks:
        exec(compile(chunk["source"], chunk["label"], "exec"), namespace)  # noqa: S102 - the course's own code
    return namespace
