"""Reading submissions and extracting the code an exercise is graded on.

A submission is a notebook, a folder of notebooks or a zip of them. Nothing in it is
executed here, and nothing from it but code-cell sources ever reaches a worker: outputs,
metadata, test cells and other files are dropped. Tests never come from the submission.
Sizes and counts are capped before anything is read (files, a folder's entries, all
notebooks together, like a zip's members), and parsing is bounded: a notebook of too many
JSON objects is refused, and an old format is converted without its outputs.

Which code is graded: from every code cell, its imports, function and class definitions
and call-free assignments (so helpers and constants defined elsewhere still work, but
visible tests, plots and training loops do not run); from the exercise's answer cell
(found by nbgrader ``grade_id``, else the last cell defining the exercise's name) every
statement. Cells run in notebook order, so the last definition wins, as in a kernel.

What the worker runs is exactly what the seed of the hidden cases hashes: each chunk's syntax
tree without docstrings, written out again (``normalised``): no comment, no docstring, no
formatting, no line position and no cell number reaches it, so nothing the seed ignores can
carry information (a table of answers in a docstring, a comment or the spacing of lines) into
the worker. Errors name the cell and the line of the notebook all the same (``explain``).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from autograder.diagnoses_zh import LANGUAGES
from autograder.feedback import code
from autograder.registry import Exercise
from tfm_solution.my_chapters import TOO_DEEP, is_test_cell, strip_magics  # the student's loader reads as the grader does

MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024  # one notebook file (the course's are under 2 MB)
MAX_SUBMISSION_BYTES = 50 * 1024 * 1024  # all notebooks of a submission together
MAX_JSON_OBJECTS = 100_000  # objects in one notebook's JSON (the course's have about 500)
MAX_ZIP_MEMBERS = 2000
MAX_ZIP_TOTAL_BYTES = 200 * 1024 * 1024
MAX_FOLDER_ENTRIES = 2000  # files and folders looked at in a submitted folder
MAX_FOLDER_DEPTH = 8
MAX_NOTEBOOKS = 64
_KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class SubmissionError(Exception):
    """The submission (or one file of it) cannot be read; the message is for the student."""


@dataclass
class Cell:
    """One code cell as the grader sees it."""

    index: int
    source: str
    grade_id: str | None
    is_test: bool


@dataclass
class Notebook:
    """A readable submitted notebook: where it came from, its code cells and the language it records."""

    name: str
    cells: list[Cell]
    language: str = "en"  # metadata "course": {"language": ...}: the language of the diagnoses


@dataclass
class Unreadable:
    """A submitted notebook that could not be read, and why."""

    name: str
    reason: str


@dataclass
class Extraction:
    """The code chunks one exercise's worker runs, plus what the student should be told.

    Each chunk: ``{"source": normalised code, "label": "cell N", "lines": {line of source: line
    of the cell}}``; ``cells`` maps each label to the cell's source, for the feedback.
    """

    chunks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    answer_source: str = ""
    answer_label: str = ""
    error: str | None = None
    cells: dict[str, str] = field(default_factory=dict)

    def sources(self) -> list[str]:
        """The chunks' code, in order: all that reaches the worker of the submission."""
        return [c["source"] for c in self.chunks]

    def digest(self) -> str:
        """Hash of exactly the code the worker receives: comments, formatting and docstrings do not
        count (they never reach it), so the same answer gives the same fresh inputs everywhere, and
        editing a comment does not draw new hidden cases."""
        return hashlib.sha256("\0".join(self.sources()).encode()).hexdigest()

    def explain(self, error: str) -> str:
        """A worker's ``"chunk N[, line L]: ..."`` error as ``"cell C[, line K: `that line`]: ..."``,
        with the cell and line of the notebook (any other text is returned as it is)."""
        found = _WORKER_ERROR.fullmatch(error)
        if not found or int(found[1]) >= len(self.chunks):
            return error
        chunk = self.chunks[int(found[1])]
        where = chunk["label"]
        # The statement that starts last at or before the line: its first line in the cell.
        starts = [old for new, old in chunk.get("lines", {}).items() if found[2] and new <= int(found[2])]
        cell = self.cells.get(where, "").splitlines()
        if starts and 0 < starts[-1] <= len(cell):
            where += f", line {starts[-1]}: `{cell[starts[-1] - 1].strip()[:200]}`"
        return f"{where}: {found[3]}"


_WORKER_ERROR = re.compile(r"chunk (\d+)(?:, line (\d+))?: (.*)", re.S)


def normalised(source: str) -> tuple[str, dict[int, int]]:
    """``source`` as the worker runs it and the seed hashes it: its syntax tree without docstrings,
    written out by ``ast.unparse`` (no comment, formatting or line position of the original survives);
    and, for each line of it where a statement or expression starts, the line of ``source`` it came from.
    ``source`` must parse."""
    tree = without_docstrings(ast.parse(source))
    text = ast.unparse(tree)
    lines: dict[int, int] = {}
    for new, old in zip(ast.walk(ast.parse(text)), ast.walk(tree)):
        if type(new) is not type(old):  # (never seen: unparse round-trips) then no line is mapped rather than a wrong one
            return text, {}
        if hasattr(new, "lineno") and hasattr(old, "lineno"):
            lines.setdefault(new.lineno, old.lineno)
    return text, dict(sorted(lines.items()))


def without_docstrings(tree: ast.Module) -> ast.Module:
    """``tree`` with the docstring of the module, of every function and of every class removed (in place)."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _meta(cell: dict) -> dict:
    meta = cell.get("metadata")
    meta = meta.get("nbgrader") if isinstance(meta, dict) else None
    return meta if isinstance(meta, dict) else {}


class _TooManyObjects(ValueError):
    pass


def _counted(limit: int):
    """A JSON object hook that refuses the ``limit``-th object: parsing stays bounded in memory."""
    count = [0]

    def hook(obj: dict) -> dict:
        count[0] += 1
        if count[0] > limit:
            raise _TooManyObjects(f"more than {limit} JSON objects")
        return obj

    return hook


def _without_outputs(nb):
    """An old-format notebook's JSON with every list of outputs emptied (only sources are graded)."""
    if isinstance(nb, dict):
        return {k: [] if k == "outputs" else _without_outputs(v) for k, v in nb.items()}
    if isinstance(nb, list):
        return [_without_outputs(v) for v in nb]
    return nb


def parse_notebook(name: str, data: bytes) -> Notebook | Unreadable:
    """Parse notebook bytes (any nbformat version); never raises for bad content."""
    if len(data) > MAX_NOTEBOOK_BYTES:
        return Unreadable(name, f"the file is larger than {MAX_NOTEBOOK_BYTES // 2**20} MB")
    try:
        nb = json.loads(data.decode("utf-8"), object_hook=_counted(MAX_JSON_OBJECTS))
        if not isinstance(nb, dict):
            raise ValueError("not a notebook (no JSON object)")
        if nb.get("nbformat") != 4:
            import nbformat  # only for older formats: it converts them (its import takes seconds)

            # Converted without outputs, so the conversion's time and memory follow the sources.
            nb = nbformat.reads(json.dumps(_without_outputs(nb)), as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("not a notebook (no list of cells)")
    except Exception as exc:  # noqa: BLE001 - any parser failure means "unreadable"
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return Unreadable(name, f"could not read notebook: {code(first)}")
    cells = []
    for index, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(str(s) for s in source)
        meta = _meta(cell)
        grade_id = meta.get("grade_id") if isinstance(meta.get("grade_id"), str) else None
        cells.append(Cell(index, str(source), grade_id, is_test_cell(meta, str(source))))
    return Notebook(name, cells, _language(nb))


def _language(nb: dict) -> str:
    """The language the notebook records (``make chapters`` writes it in the Chinese course's); "en" otherwise."""
    course = nb.get("metadata", {}).get("course") if isinstance(nb.get("metadata"), dict) else None
    language = course.get("language") if isinstance(course, dict) else None
    return language if language in LANGUAGES else "en"


def read_submission(path: str | Path) -> list[Notebook | Unreadable]:
    """Every notebook of a submission: a ``.ipynb``, a folder (searched recursively) or a zip."""
    path = Path(path)
    if path.is_dir():
        found = _notebooks_in(path)
        if not found:
            raise SubmissionError("no notebook (.ipynb) found in the submission")
        notebooks: list[Notebook | Unreadable] = []
        left = MAX_SUBMISSION_BYTES
        for file, size in found[:MAX_NOTEBOOKS]:
            name = _safe_name(str(file.relative_to(path)))
            if size > min(left, MAX_NOTEBOOK_BYTES):
                notebooks.append(Unreadable(name, _too_big(size, left)))
                continue
            left -= size
            notebooks.append(parse_notebook(name, _read_capped(file)))
        return notebooks
    if zipfile.is_zipfile(path):
        return _read_zip(path)
    if path.is_file():
        return [parse_notebook(_safe_name(path.name), _read_capped(path))]
    raise SubmissionError(f"{path.name}: no such file or folder")


def _notebooks_in(folder: Path) -> list[tuple[Path, int]]:
    """(path, size) of the notebooks in ``folder``, sorted, found without following links; a
    folder of more than MAX_FOLDER_ENTRIES entries is refused before any file is read."""
    found, seen, todo = [], 0, [(folder, 0)]
    while todo:
        current, depth = todo.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        seen += len(entries)
        if seen > MAX_FOLDER_ENTRIES:
            raise SubmissionError(f"the submission holds more than {MAX_FOLDER_ENTRIES} files and folders; "
                                  "submit the notebooks only")
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                if entry.name != ".ipynb_checkpoints" and depth < MAX_FOLDER_DEPTH:
                    todo.append((Path(entry.path), depth + 1))
            elif entry.name.endswith(".ipynb") and entry.is_file(follow_symlinks=False):
                found.append((Path(entry.path), entry.stat(follow_symlinks=False).st_size))
    return sorted(found)


def _too_big(size: int, left: int) -> str:
    if size > MAX_NOTEBOOK_BYTES:
        return f"the file is larger than {MAX_NOTEBOOK_BYTES // 2**20} MB"
    return (f"not read: the submission's notebooks together exceed {MAX_SUBMISSION_BYTES // 2**20} MB "
            f"({left // 2**20} MB were left for this one)")


def _safe_name(name: str) -> str:
    """A submitted file's name as shown in the results: plain characters only (it is student text)."""
    return "".join(c if c.isalnum() or c in "._-/ " else "_" for c in name)[:200]


def _read_capped(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(MAX_NOTEBOOK_BYTES + 1)


def _read_zip(path: Path) -> list[Notebook | Unreadable]:
    """Notebooks straight from the archive, never extracted: no paths, links or bombs reach disk."""
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        if len(members) > MAX_ZIP_MEMBERS:
            raise SubmissionError(f"the zip holds {len(members)} files; at most {MAX_ZIP_MEMBERS} are accepted")
        if sum(m.file_size for m in members) > MAX_ZIP_TOTAL_BYTES:
            raise SubmissionError("the zip expands to more than 200 MB")
        notebooks: list[Notebook | Unreadable] = []
        left = MAX_SUBMISSION_BYTES
        for member in members:
            name = PurePosixPath(member.filename.replace("\\", "/"))
            is_link = (member.external_attr >> 16) & 0o170000 == 0o120000
            if (member.is_dir() or is_link or name.suffix != ".ipynb" or ".ipynb_checkpoints" in name.parts
                    or "__MACOSX" in name.parts):
                continue
            clean = _safe_name("/".join(p for p in name.parts if p not in ("", ".", "..", "/")))
            if member.file_size > min(left, MAX_NOTEBOOK_BYTES):
                notebooks.append(Unreadable(clean, _too_big(member.file_size, left)))
                continue
            left -= member.file_size
            with archive.open(member) as handle:
                notebooks.append(parse_notebook(clean, handle.read(MAX_NOTEBOOK_BYTES + 1)))
            if len(notebooks) >= MAX_NOTEBOOKS:
                break
    if not notebooks:
        raise SubmissionError("no notebook (.ipynb) found in the zip")
    return notebooks


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)
    return False


def _is_kept(node: ast.stmt) -> bool:
    if isinstance(node, _KEPT):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        return not any(isinstance(n, (ast.Call, ast.Await, ast.Yield, ast.Lambda)) for n in ast.walk(node.value))
    return False


def find_notebook(notebooks: list[Notebook | Unreadable], exercise: Exercise) -> Notebook | Unreadable | None:
    """The submitted notebook holding this exercise: by answer grade_id, then by file name."""
    readable = [nb for nb in notebooks if isinstance(nb, Notebook)]
    for nb in readable:
        if any(c.grade_id == exercise.solution_grade_id for c in nb.cells):
            return nb
    for nb in notebooks:
        if PurePosixPath(nb.name).name == exercise.notebook:
            return nb
    for nb in readable:
        for cell in nb.cells:
            if not cell.is_test and re.search(rf"^(def|class)\s+{re.escape(exercise.name)}\b", cell.source, re.M):
                return nb
    return None


def extract(nb: Notebook, exercise: Exercise) -> Extraction:
    """The code this exercise is graded on (see the module docstring)."""
    result = Extraction()
    parsed: list[tuple[Cell, list[ast.stmt] | None, str]] = []
    for cell in nb.cells:
        if cell.is_test:
            continue
        source = strip_magics(cell.source)
        try:
            tree = ast.parse(source)
            parsed.append((cell, tree.body, source))
        except SyntaxError as exc:
            parsed.append((cell, None, f"has a syntax error ({code(f'line {exc.lineno}: {exc.msg}')})"))
        except (RecursionError, MemoryError, ValueError):  # a 5,000-term expression; a NUL byte
            parsed.append((cell, None, TOO_DEEP))
    answers = [p for p in parsed if p[0].grade_id == exercise.solution_grade_id]
    if len(answers) > 1:
        result.notes.append(f"{len(answers)} cells carry the answer id `{exercise.solution_grade_id}`; "
                            "the last one was used")
    answer = answers[-1] if answers else None
    if answer is None:
        defining = [p for p in parsed if p[1] is not None and any(_defines(n, exercise.name) for n in p[1])]
        answer = defining[-1] if defining else None
        if answer is not None:
            result.notes.append(f"no cell has the answer id `{exercise.solution_grade_id}` "
                                f"(metadata edited?); graded the cell defining `{exercise.name}`")
    if answer is None:
        result.error = f"no definition of `{exercise.name}` was found in the notebook"
        return result
    if answer[1] is None:
        result.error = f"your answer cell {answer[2]}; Python cannot run it"
        return result
    for cell, body, source in parsed:
        label = f"cell {cell.index + 1}"
        if body is None:
            result.notes.append(f"{label} {source} and was skipped")
            continue
        result.cells[label] = source
        if cell is answer[0]:
            try:
                result.chunks.append(_chunk(label, source))
            except (RecursionError, MemoryError):  # ast.unparse of 1,000 terms
                return Extraction(notes=result.notes, error=f"your answer cell {TOO_DEEP}; it was not run")
            result.answer_source, result.answer_label = source, label
            continue
        lines = source.splitlines()
        for node in (n for n in body if _is_kept(n)):
            # One chunk per statement, so a failing import does not take the next ones with it;
            # blank lines in front keep the line numbers of the cell.
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            try:
                result.chunks.append(_chunk(label, "\n" * (first - 1) + "\n".join(lines[first - 1: node.end_lineno])))
            except (RecursionError, MemoryError):
                result.notes.append(f"{label}, line {first}: this statement {TOO_DEEP} and was skipped")
                continue
            if cell.index > answer[0].index and _defines(node, exercise.name):
                result.notes.append(f"`{exercise.name}` is defined again in {label}, after the answer cell; "
                                    "as in a kernel, the last definition was graded")
    return result


def _chunk(label: str, source: str) -> dict:
    text, lines = normalised(source)
    return {"label": label, "source": text, "lines": lines}


def parsed(source: str) -> ast.Module:
    """``source``'s syntax tree, or an empty module when it cannot be read (a worker meets the same error)."""
    try:
        return ast.parse(source)
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        return ast.Module(body=[], type_ignores=[])


def reachable(chunks: list[ast.Module], answer: ast.Module) -> list[ast.AST]:
    """The ``answer`` and every top-level definition of ``chunks`` it uses, each once: every name is followed to
    its definitions in any chunk (functions, classes, assignments, imports), and those are followed in turn."""
    definitions: dict[str, list[ast.AST]] = {}
    for tree in chunks:
        for node in tree.body:
            for name in _bound_names(node):
                definitions.setdefault(name, []).append(node)
    todo: list[ast.AST] = [answer]
    seen: set[int] = set()
    found = []
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        found.append(node)
        todo += [d for sub in ast.walk(node) if isinstance(sub, ast.Name) for d in definitions.get(sub.id, [])]
    return found


def shortcut_uses(extraction: Extraction, banned: tuple[str, ...]) -> list[str]:
    """The ``banned`` library names the answer reaches, however they are spelled.

    Starting from the answer cell, every definition it reaches in any extracted cell (``reachable``) is
    searched: ``from torch.nn.functional import scaled_dot_product_attention as fast``, ``fast =
    F.scaled_dot_product_attention`` in another cell, or ``getattr(F, "scaled_dot_product_attention")``
    in a helper all count. (What is built from pieces at run time is not seen.)
    """
    if not banned:
        return []
    used: set[str] = set()
    chunks = [parsed(c["source"]) for c in extraction.chunks]
    for node in reachable(chunks, parsed(extraction.answer_source)):
        for sub in ast.walk(node):
            words = [getattr(sub, "id", None), getattr(sub, "attr", None)]
            if isinstance(sub, ast.alias):
                words += [*sub.name.split("."), sub.asname]
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                words += [b for b in banned if b in sub.value]
            if isinstance(getattr(sub, "op", None), ast.MatMult):  # `a @ b` and `a @= b` call matmul
                words.append("matmul")
            used.update(w for w in words if w in banned)
    return sorted(used)


def _bound_names(node: ast.stmt) -> list[str]:
    """The top-level names a statement defines."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []
