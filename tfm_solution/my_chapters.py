"""Your own Transformer, gathered from your chapter notebooks (chapter 12, the capstone).

Chapters 1-11 each had you write one piece. The capstone puts your pieces together: the answer cells
of your chapter notebooks, found by their nbgrader ``grade_id`` (else by the definition they hold),
run in chapter order. The grader gathers exactly the same pieces with the same rules
(``autograder.course_code`` builds on this module), so what ``load_my_chapters`` shows in the notebook
is what will be graded.

Imports of the course's packages inside an answer cell (chapter 5 imports the provided ``clones``)
are left out: the capstone is built from your code only. This module holds no answer of any chapter;
it ships in every release of the course.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

CAPSTONE = "12_capstone"
PREAMBLE = "import copy\nimport math\n\nimport torch\nfrom torch import nn\nfrom torch.nn import functional as F\n"
"""What every chapter notebook imports before its answers (the answers may use these names)."""

COURSE_PACKAGES = ("tfm_solution", "autograder")


@dataclass(frozen=True)
class Piece:
    """One answer of an earlier chapter the capstone may use: where it is, its cell id, its name."""

    chapter: str
    notebook: str
    grade_id: str
    name: str
    required: bool

    @property
    def where(self) -> str:
        return f"chapter {int(self.chapter[:2])} ({self.chapter}/{self.notebook})"


def _pieces(*chapters: tuple[str, str, tuple[tuple[str, str, bool], ...]]) -> tuple[Piece, ...]:
    return tuple(Piece(chapter, notebook, grade_id, name, required)
                 for chapter, notebook, answers in chapters for grade_id, name, required in answers)


PIECES = _pieces(
    ("01_embeddings", "embeddings.ipynb", (("ch01-embeddings", "Embeddings", True),
                                           ("ch01-cosine-similarity-matrix", "cosine_similarity_matrix", False))),
    ("02_positional_encoding", "positional_encoding.ipynb", (
        ("ch02-positional-encoding", "positional_encoding", True),
        ("ch02-positional-encoding-module", "PositionalEncoding", True),
        ("ch02-rotation-matrix", "rotation_matrix", False))),
    ("03_attention", "attention.ipynb", (("ch03-attention", "attention", True),
                                         ("ch03-softmax-saturation", "softmax_saturation", False))),
    ("04_masks", "masks.ipynb", (("ch04-subsequent-mask", "subsequent_mask", True), ("ch04-batch", "Batch", True),
                                 ("ch04-masked-softmax", "masked_softmax", False))),
    ("05_multihead_attention", "multihead_attention.ipynb", (
        ("ch05-split-heads", "split_heads", True), ("ch05-merge-heads", "merge_heads", True),
        ("ch05-multiheaded-attention", "MultiHeadedAttention", True))),
    ("06_feed_forward", "feed_forward.ipynb", (
        ("ch06-positionwise-feed-forward", "PositionwiseFeedForward", True),
        ("ch06-conv1d-feed-forward", "conv1d_feed_forward", False), ("ch06-gelu", "gelu", False))),
    ("07_add_norm", "add_norm.ipynb", (("ch07-layer-norm", "LayerNorm", True),
                                       ("ch07-sublayer-connection", "SublayerConnection", True))),
    ("08_encoder_decoder", "encoder_decoder.ipynb", (
        ("ch08-encoder-layer", "EncoderLayer", True), ("ch08-decoder-layer", "DecoderLayer", True),
        ("ch08-decoder", "Decoder", True), ("ch08-make-model", "make_model", True))),
    ("09_training", "training.ipynb", (("ch09-label-smoothing", "LabelSmoothing", True), ("ch09-rate", "rate", True),
                                       ("ch09-train-with-accumulation", "train_with_accumulation", True))),
    ("10_decoding", "decoding.ipynb", (("ch10-top-k-top-p-filter", "top_k_top_p_filter", False),
                                       ("ch10-beam-step", "beam_step", True),
                                       ("ch10-greedy-decode", "greedy_decode", True))),
    ("11_kv_cache", "kv_cache.ipynb", (("ch11-cached-self-attention", "CachedSelfAttention", True),
                                       ("ch11-kv-cache-bytes", "kv_cache_bytes", False),
                                       ("ch11-greedy-decode-cached", "greedy_decode_cached", True))),
)
"""Every answer of chapters 1-11 (graded, and the practice ``greedy_decode``/``greedy_decode_cached``), in
chapter order; ``required``: the capstone's model, training or decoding calls it."""

REQUIRED = tuple(p.name for p in PIECES if p.required)

_MAGIC = re.compile(r"^\s*[%!]")
TOO_DEEP = "is nested too deeply to read (a very long expression, or deep nesting)"


class CellLike(Protocol):
    """A code cell as both readers see it."""

    source: str
    grade_id: str | None
    is_test: bool


@dataclass
class Cell:
    """A code cell of a chapter notebook (the notebook's reader, ``read_chapters``)."""

    source: str
    grade_id: str | None
    is_test: bool


@dataclass
class Gathered:
    """The code chunks to run, where each required piece came from, and the problems found."""

    chunks: list[dict] = field(default_factory=list)  # {"label", "source"}, or {"label", "written"}: a statement
    sources: dict[str, str] = field(default_factory=dict)  # name -> "chapter N (...)" or "this notebook"
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def is_test_cell(nbgrader: dict, source: str) -> bool:
    """A cell of tests (visible or hidden), never an answer: nbgrader's graded test cells, and cells that grade."""
    return (nbgrader.get("grade") is True and nbgrader.get("solution") is not True) or (
        "grade_in_notebook" in source or "BEGIN HIDDEN TESTS" in source)


def strip_magics(source: str) -> str:
    """IPython magics and shell escapes are not Python; blank them, keeping line numbers."""
    return "\n".join("" if _MAGIC.match(line) else line for line in source.splitlines())


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


def imports_course(node: ast.stmt) -> bool:
    """An import of the course's own packages (left out: the capstone runs the student's code only)."""
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] in COURSE_PACKAGES
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] in COURSE_PACKAGES for a in node.names)
    return False


def _parsed(source: str) -> list[ast.stmt] | None:
    try:
        return ast.parse(strip_magics(source)).body
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return None


def _statements(source: str, label: str) -> tuple[list[dict], list[str]]:
    """One chunk per top-level statement (so one failing statement does not take the others with it),
    course imports dropped; and the dropped lines. ``written`` keeps each statement at its lines of the cell (the
    grader runs it without its comments and docstrings, ``autograder.course_code``)."""
    lines = source.splitlines()
    chunks, dropped = [], []
    for node in ast.parse(source).body:
        if imports_course(node):
            dropped.append(ast.unparse(node))
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        chunks.append({"label": label, "written": "\n" * (first - 1) + "\n".join(lines[first - 1: node.end_lineno])})
    return chunks, dropped


def defined(cells: Sequence[CellLike]) -> set[str]:
    """Top-level functions and classes the code cells define, stubs aside (a pasted answer, say)."""
    names: set[str] = set()
    for cell in cells:
        body = None if cell.is_test else _parsed(cell.source)
        names |= {n.name for n in body or () if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                  and not is_stub(ast.Module(body=[n], type_ignores=[]), n.name)}
    return names


def _chapter_imports(cells: Sequence[CellLike], label: str) -> list[dict]:
    """The plain imports of a chapter notebook (``numpy``, ``torch.nn.functional as F``), not the course's."""
    return [{"label": label, "source": ast.unparse(n)} for cell in cells if not cell.is_test
            for n in _parsed(cell.source) or ()
            if isinstance(n, (ast.Import, ast.ImportFrom)) and not imports_course(n)]


def answer_cell(cells: Sequence[CellLike], piece: Piece) -> CellLike | None:
    """The cell holding ``piece``'s answer: the last with its grade id, else the last that defines it."""
    by_id = [c for c in cells if c.grade_id == piece.grade_id and not c.is_test]
    if by_id:
        return by_id[-1]
    defining = [c for c in cells if not c.is_test
                and re.search(rf"^(def|class)\s+{re.escape(piece.name)}\b", c.source, re.M)]
    return defining[-1] if defining else None


def gather_pieces(find: Callable[[Piece], Any], pasted: set[str] = frozenset()) -> Gathered:
    """Your answers of chapters 1-11 in chapter order. ``find(piece)`` gives the notebook holding a piece
    (``.name`` and ``.cells``), an unreadable one (``.name`` and ``.reason``) or None; ``pasted``: the names
    the capstone notebook defines itself, which stand in for a missing chapter answer."""
    found = Gathered(chunks=[{"label": "the chapters' imports", "source": PREAMBLE}])
    done_imports: set[str] = set()
    for piece in PIECES:
        nb, where = find(piece), piece.where
        cell = None
        if nb is not None and not hasattr(nb, "cells"):
            problem = f"{where}: the notebook {nb.name} could not be read ({nb.reason})"
        else:
            cell = answer_cell(nb.cells, piece) if nb is not None else None
            problem = (f"{where}: no answer for `{piece.name}` was found (submit that notebook next to this one, "
                       "or paste your answer into this notebook)")
        if cell is not None:
            source = strip_magics(cell.source)
            try:
                tree = ast.parse(source)
                chunks, dropped = _statements(source, f"{where}, `{piece.name}`")
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
                        found.chunks += _chapter_imports(nb.cells, f"{piece.chapter}'s imports")
                    found.chunks += chunks
                    found.sources[piece.name] = where
                    if dropped:
                        found.notes.append(f"{where}: your answer for `{piece.name}` imports from the course's "
                                           f"package ({'; '.join(f'`{line}`' for line in dropped)}); the capstone "
                                           "uses your own code instead, so that line is left out")
        if piece.name in pasted:
            found.sources[piece.name] = "this notebook"
        elif problem is not None and piece.required:
            found.problems.append(problem)
    return found


# ----------------------------------------------------------------------------- in the notebook

@dataclass
class _Notebook:
    name: str
    cells: list[Cell]


@dataclass
class _Unreadable:
    name: str
    reason: str


def read_chapters(course: Path) -> dict[str, _Notebook | _Unreadable]:
    """``chapter -> notebook`` of the chapter notebooks at their exact places in ``course``
    (``<course>/<chapter>/<notebook>``): no search, no links."""
    found: dict[str, _Notebook | _Unreadable] = {}
    for chapter, notebook in dict.fromkeys((p.chapter, p.notebook) for p in PIECES):
        path = course / chapter / notebook
        if path.is_symlink() or not path.is_file():
            continue
        name = f"{chapter}/{notebook}"
        try:
            cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c.get("cell_type") == "code"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            found[chapter] = _Unreadable(name, f"{type(exc).__name__}: {exc}")
            continue
        notebook_cells = []
        for cell in cells:
            source = "".join(cell.get("source", ""))
            nbgrader = cell.get("metadata", {}).get("nbgrader") or {}
            notebook_cells.append(Cell(source, nbgrader.get("grade_id"), is_test_cell(nbgrader, source)))
        found[chapter] = _Notebook(name, notebook_cells)
    return found


def load_my_chapters(namespace: dict, folder: str | Path | None = None, quiet: bool = False) -> Gathered:
    """Run your answers of chapters 1-11 in ``namespace`` (pass ``globals()``), as if you had pasted them there.

    The notebooks are read from ``folder``'s chapter folders (``01_embeddings/embeddings.ipynb``, ...), at
    those exact places; by default from the folder above this notebook's (the course's layout), else from the
    folder the notebook runs in (Colab's ``/content``, where the chapter folders are uploaded). Prints where
    each piece came from and what is missing; a piece whose cell fails to run is reported with its error.
    """
    candidates = [Path(folder)] if folder is not None else [Path.cwd().parent, Path.cwd()]
    root = next((c for c in candidates if read_chapters(c)), candidates[0])
    notebooks = read_chapters(root)
    found = gather_pieces(lambda piece: notebooks.get(piece.chapter))
    if not notebooks:
        found.problems.append(f"no chapter folder was found in {' or '.join(str(c) for c in candidates)}: put your "
                              "chapter folders (01_embeddings/, 02_positional_encoding/, ...) beside 12_capstone/ "
                              "(on Colab: upload them to the folder this notebook runs in), or pass folder=")
    for chunk in found.chunks:  # as written: the student's own kernel, with their docstrings and line numbers
        source = chunk["written"] if "written" in chunk else chunk["source"]
        try:
            exec(compile(source, chunk["label"], "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - report every failing piece, keep going
            found.problems.append(f"{chunk['label']}: {type(exc).__name__}: {exc}")
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
