"""A student's own Transformer, gathered from their chapter notebooks (chapter 12, the capstone).

Chapters 1-11 each graded one piece against the reference. The capstone puts the student's pieces
together: the answer cells of their chapter notebooks (found by nbgrader ``grade_id`` as the
grader finds them, ``autograder.extract``), then the code of the capstone notebook itself, which
adds the glue and may paste any piece over a chapter's answer (the last definition wins, as in a
kernel). Two readers use it:

* the grader (``gather``): the code chunks a sandboxed worker runs, or a message naming every
  chapter answer that is missing, still a stub, or does not parse;
* the notebook (``load_my_chapters``): the same code executed into the notebook's own namespace,
  with a table of where each piece came from.

Only what the capstone uses is required. Imports of the course's packages in an answer cell
(chapter 5 imports the provided ``clones``) are dropped: the capstone is built from the
student's code only, and writes ``clones`` itself.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from autograder.extract import (MAX_NOTEBOOK_BYTES, TOO_DEEP, Cell, Extraction, Notebook, Unreadable, _read_capped,
                                _strip_magics, extract, find_notebook, normalised, parse_notebook, read_submission)
from autograder.registry import REGISTRY, Exercise

CAPSTONE = "12_capstone"
PREAMBLE = "import copy\nimport math\n\nimport torch\nfrom torch import nn\nfrom torch.nn import functional as F\n"
"""What every chapter notebook imports before its answers (the answers may use these names)."""

_COURSE_PACKAGES = ("tfm_solution", "autograder")


@dataclass(frozen=True)
class Piece:
    """One answer of an earlier chapter the capstone may use: its cell id, its name, its chapter."""

    chapter: str
    notebook: str
    grade_id: str
    name: str
    required: bool

    @property
    def where(self) -> str:
        return f"chapter {int(self.chapter[:2])} ({self.chapter}/{self.notebook})"


_PRACTICE = (("10_decoding", "decoding.ipynb", "ch10-greedy-decode", "greedy_decode"),
             ("11_kv_cache", "kv_cache.ipynb", "ch11-greedy-decode-cached", "greedy_decode_cached"))
"""Practice exercises (checked by visible tests, not graded) whose answers the capstone runs."""

REQUIRED = ("Embeddings", "positional_encoding", "PositionalEncoding", "attention", "subsequent_mask", "Batch",
            "split_heads", "merge_heads", "MultiHeadedAttention", "PositionwiseFeedForward", "LayerNorm",
            "SublayerConnection", "EncoderLayer", "DecoderLayer", "Decoder", "make_model", "LabelSmoothing", "rate",
            "train_with_accumulation", "greedy_decode", "beam_step", "CachedSelfAttention", "greedy_decode_cached")
"""The earlier chapters' answers the capstone's model, training and decoding call."""


def _pieces() -> tuple[Piece, ...]:
    graded = [Piece(e.chapter, e.notebook, e.solution_grade_id, e.name, e.name in REQUIRED)
              for e in REGISTRY if e.chapter < CAPSTONE]
    practice = [Piece(c, n, g, name, name in REQUIRED) for c, n, g, name in _PRACTICE]
    return tuple(sorted(graded + practice, key=lambda p: p.chapter))


PIECES = _pieces()


@dataclass
class Gathered:
    """Where each required piece came from, and the problems found (for the student)."""

    chunks: list[dict] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # name -> "chapter N (...)" or "this notebook"
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def is_stub(tree: ast.AST, name: str) -> bool:
    """Whether the definition of ``name`` in ``tree`` is still nbgrader's stub: a function, or a method
    of the class, whose body (after its docstring and a ``super().__init__(...)``) starts by raising
    ``NotImplementedError``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            functions = [node] if isinstance(node, ast.FunctionDef) else [
                n for n in node.body if isinstance(n, ast.FunctionDef)]
            return any(_raises_first(f) for f in functions)
    return False


def _raises_first(function: ast.FunctionDef) -> bool:
    body = list(function.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if body and isinstance(body[0], ast.Expr) and "super()" in ast.unparse(body[0]):
        body = body[1:]
    if not body or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def _imports_course(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] in _COURSE_PACKAGES
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] in _COURSE_PACKAGES for a in node.names)
    return False


def _statements(source: str, label: str) -> tuple[list[dict], list[str]]:
    """One chunk per top-level statement (so one failing statement does not take the others with
    it), course imports dropped; and the names of what was dropped. A chunk's ``source`` is normalised
    (``extract.normalised``) as every answer the worker runs and the seed hashes, so comments and
    docstrings reach neither; ``written`` keeps the statement at its lines of the cell, and ``lines``
    maps the first to the second."""
    lines = source.splitlines()
    chunks, dropped = [], []
    for node in ast.parse(source).body:
        if _imports_course(node):
            dropped.append(ast.unparse(node))
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        written = "\n" * (first - 1) + "\n".join(lines[first - 1: node.end_lineno])
        text, mapped = normalised(written)
        chunks.append({"label": label, "source": text, "lines": mapped, "written": written})
    return chunks, dropped


def _defined(nb: Notebook) -> set[str]:
    """Top-level functions and classes some code cell of ``nb`` defines (a pasted answer, say)."""
    names: set[str] = set()
    for cell in nb.cells:
        if cell.is_test:
            continue
        try:
            body = ast.parse(_strip_magics(cell.source)).body
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            continue
        names |= {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                  and not _definition_is_stub(n)}
    return names


def _definition_is_stub(node: ast.stmt) -> bool:
    return is_stub(ast.Module(body=[node], type_ignores=[]), node.name)


def _chapter_imports(nb: Notebook, label: str) -> list[dict]:
    """The plain imports of a chapter notebook (``numpy``, ``torch.nn.functional as F``), not the course's."""
    chunks = []
    for cell in nb.cells:
        if cell.is_test:
            continue
        try:
            body = ast.parse(_strip_magics(cell.source)).body
        except (SyntaxError, RecursionError, MemoryError, ValueError):
            continue
        chunks += [{"label": label, "source": ast.unparse(n)} for n in body
                   if isinstance(n, (ast.Import, ast.ImportFrom)) and not _imports_course(n)]
    return chunks


def _answer_cell(nb: Notebook, piece: Piece) -> Cell | None:
    by_id = [c for c in nb.cells if c.grade_id == piece.grade_id and not c.is_test]
    if by_id:
        return by_id[-1]
    defining = [c for c in nb.cells if not c.is_test
                and re.search(rf"^(def|class)\s+{re.escape(piece.name)}\b", c.source, re.M)]
    return defining[-1] if defining else None


def gather_pieces(notebooks: list[Notebook | Unreadable], capstone: Notebook | None) -> Gathered:
    """The student's answers of chapters 1-11 in chapter order, then the capstone notebook's code."""
    found = Gathered(chunks=[{"label": "the chapters' imports", "source": PREAMBLE}])
    pasted = _defined(capstone) if capstone is not None else set()
    done_imports: set[str] = set()
    for piece in PIECES:
        exercise = _stand_in(piece)
        nb = find_notebook([n for n in notebooks if n is not capstone], exercise)
        where = piece.where
        if isinstance(nb, Unreadable):
            problem = f"{where}: the notebook {nb.name} could not be read ({nb.reason})"
            cell = None
        else:
            cell = _answer_cell(nb, piece) if nb is not None else None
            problem = (f"{where}: no answer for `{piece.name}` was found (submit that notebook next to this one, "
                       "or paste your answer into this notebook)")
        if cell is not None:
            label = f"{where}, `{piece.name}`"
            source = _strip_magics(cell.source)
            try:
                tree = ast.parse(source)
                chunks, dropped = _statements(source, label)
            except SyntaxError as exc:
                problem = f"{where}: your answer for `{piece.name}` has a syntax error (line {exc.lineno}: {exc.msg})"
            except (RecursionError, MemoryError, ValueError):
                problem = f"{where}: your answer for `{piece.name}` {TOO_DEEP}"
            else:
                if is_stub(tree, piece.name):
                    problem = f"{where}: `{piece.name}` is not implemented yet (still the stub)"
                else:
                    problem = None
                    if nb.name not in done_imports:
                        done_imports.add(nb.name)
                        found.chunks += _chapter_imports(nb, f"{piece.chapter}'s imports")
                    found.chunks += chunks
                    found.sources[piece.name] = where
                    if dropped:
                        found.notes.append(f"{where}: your answer for `{piece.name}` imports from the course's "
                                           f"package ({'; '.join(f'`{line}`' for line in dropped)}); the capstone uses your own code "
                                           "instead, so that line is left out")
        if piece.name in pasted:
            found.sources[piece.name] = "this notebook"
        elif problem is not None and piece.required:
            found.problems.append(problem)
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


# ----------------------------------------------------------------------------- in the notebook

def load_my_chapters(namespace: dict, folder: str | Path | None = None, quiet: bool = False) -> Gathered:
    """Run your answers of chapters 1-11 in ``namespace`` (pass ``globals()``), as if you had pasted them there.

    The notebooks are read from ``folder``'s chapter folders (``01_embeddings/embeddings.ipynb``, ...), at
    those exact places; by default from the folder above this notebook's (the course's layout), else from the
    folder the notebook runs in (Colab's ``/content``, where the chapter folders are uploaded). Prints where
    each piece came from and what is missing; a piece whose cell fails to run is reported with its error.
    """
    candidates = [Path(folder)] if folder is not None else [Path.cwd().parent, Path.cwd()]
    root = next((c for c in candidates if chapter_notebooks(c)), candidates[0])
    notebooks = chapter_notebooks(root)
    found = gather_pieces(notebooks, None)
    if not notebooks:
        found.problems.append(f"no chapter folder was found in {' or '.join(str(c) for c in candidates)}: put your "
                              "chapter folders (01_embeddings/, 02_positional_encoding/, ...) beside 12_capstone/ "
                              "(on Colab: upload them to the folder this notebook runs in), or pass folder=")
    errors = []
    for chunk in found.chunks:  # as written: the student's own kernel, with their docstrings and line numbers
        try:
            exec(compile(chunk.get("written", chunk["source"]), chunk["label"], "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - report every failing piece, keep going
            errors.append(f"{chunk['label']}: {type(exc).__name__}: {exc}")
    found.problems += errors
    if not quiet:
        print(f"Your code, from the chapter folders in {root.name}/:")
        for piece in PIECES:
            if piece.required:
                print(f"  {piece.name:24s} {found.sources.get(piece.name, 'MISSING')}")
        for line in found.notes:
            print("note:", line)
        for line in found.problems:
            print("PROBLEM:", line)
        if not found.problems:
            print("Every piece is there.")
    return found


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
