"""The graded release: the course as a class with weekly deadlines receives it.

``python -m autograder release --through 05 --out dist`` (or ``make release THROUGH=05``) writes
``dist/release-05/``:

``chapters/``
    every student notebook, as ``chapters/`` has them; their Colab cell installs the release's
    package (``course_release.package_url`` in ``_config.yml``), never the whole repository.
``package/``
    the student package, an installable project of its own (distribution
    ``transformer-course-student``, imported as ``tfm_solution`` so that the notebooks' imports
    resolve unchanged): the widgets, the data tools, the tokenizer, the course model's weights and
    the reference of chapters 1..THROUGH. Every answer of a later chapter is a stub that calls the answer of
    that name the running notebook defines (``NotReleased.stand_in``), or raises ``NotReleased`` (a
    ``NotImplementedError``, which the widgets and checks treat as a stub) while there is none, it is still
    the exercise's stub, or the call needs more of the reference than the exercise asks for.
    Where a notebook's figure, widget or check needs an unreleased answer, it runs the student's own; while
    that is a stub, the cell shows the figure its committed notebook stored (``assets/stored_figures.json``)
    and one line, "Stored figure: write `DecoderLayer` to make this figure live." (``viz.stored``).
``manifest.json``
    what was withheld, and why; what was left in on purpose (``handed_out``).

What counts as an answer: every solution region (``### BEGIN SOLUTION`` .. ``### END SOLUTION``) of
``solutions/``. Each solution cell defines one object, its owner; the release withholds

* the owner of every solution region of a chapter after THROUGH, and the reference of every graded
  exercise of those chapters (``autograder.registry``);
* private helpers that only withheld objects used;
* anything else the answer search (:func:`find_answers`) still finds: the build stubs that object.

One kind of region is handed out on purpose (``handed_out``): a region whose owner a student notebook
of an *earlier* chapter imports from the package as provided code (``clones`` in chapter 5,
``Encoder`` in chapter 8, ``greedy_decode`` in chapter 9, ...), and which is no graded exercise's
reference. That earlier chapter cannot run without it; chapter 12, which asks for these again, and
chapter 10's ungraded ``greedy_decode`` restate code the course has already given out.

The answer search compares normal forms, never raw text: a region's statements as ``ast`` dumps
(docstrings and comments gone), the same with every local name renamed in order of appearance (so a
renamed copy is found too), its text without comments or any whitespace, and its bytecode (the code
objects of the solution cell). It reads every file of a release: Python sources, bytecode (``.pyc``),
notebooks (code cells, Markdown, outputs, saved widget state), JSON and any other text, wheels and zips
member by member. What it does not read: weights and images (``BINARY``), which hold no code.
"""

from __future__ import annotations

import argparse
import ast
import copy
import html
import io
import json
import marshal
import re
import shutil
import sys
import textwrap
import time
import tokenize
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tfm_solution"
DISTRIBUTION = "transformer-course-student"
# The researcher's tools, which are no part of any chapter: the fused re-implementation of the whole
# forward pass (chapters 6-8 written again), the command line, the experiments and the benchmarks.
LEFT_OUT = ("fast", "cli.py", "experiment.py", "bench.py", "__main__.py")
BINARY = (".safetensors", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".woff", ".woff2", ".ttf", ".pt", ".bin")
LAST_CHAPTER = 12

_REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION[^\n]*\n?", re.S | re.M)
_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION.*\n?", re.M)


# --- what the answers are ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Region:
    """One solution region: its chapter, the object its cell defines, its text and its whole cell."""

    chapter: int
    grade_id: str
    owner: str
    source: str
    cell: str

    @property
    def label(self) -> str:
        return f"chapter {self.chapter:02d} `{self.owner}` ({self.grade_id})"


def _code(source: str) -> str:
    """A notebook cell's code with IPython's magics and shell lines blanked (line numbers kept)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def solution_regions(root: Path = ROOT) -> tuple[Region, ...]:
    """Every solution region of ``solutions/``, in chapter order."""
    found = []
    for path in sorted((root / "solutions").glob("[0-9][0-9]_*/*.ipynb")):
        chapter = int(path.parent.name[:2])
        for cell in json.loads(path.read_text())["cells"]:
            text = "".join(cell.get("source", []))
            if cell.get("cell_type") != "code" or "### BEGIN SOLUTION" not in text:
                continue
            whole = _MARKER.sub("", text)
            owners = [n.name for n in ast.parse(_code(whole)).body
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            grade_id = (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id", "")
            for match in _REGION.finditer(text):
                found.append(Region(chapter, grade_id, owners[0] if owners else "", textwrap.dedent(match.group(1)),
                                    whole))
    return tuple(found)


def provided_by(root: Path = ROOT) -> dict[str, int]:
    """Each name a student notebook imports from the package, with the first chapter that imports it."""
    first: dict[str, int] = {}
    for path in sorted((root / "chapters").glob("[0-9][0-9]_*/*.ipynb")):
        chapter = int(path.parent.name[:2])
        for cell in json.loads(path.read_text())["cells"]:
            if cell.get("cell_type") != "code":
                continue
            try:
                tree = ast.parse(_code("".join(cell.get("source", []))))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
                    for alias in node.names:
                        first.setdefault(alias.name, chapter)
    return first


def graded_references() -> dict[str, int]:
    """``{name: chapter}`` of the reference of every graded exercise of chapters 1-11."""
    from autograder.registry import REGISTRY

    found: dict[str, int] = {}
    for exercise in REGISTRY:
        chapter = int(exercise.chapter[:2])
        if chapter < LAST_CHAPTER:  # chapter 12's entries name make_model, chapter 8's answer, to build a model
            found[exercise.reference.partition(":")[2]] = chapter
    return found


def handed_out(regions: tuple[Region, ...] | None = None, root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """Owners of regions the course hands out before the chapter that asks for them: ``{owner: (chapter
    that asks, chapter whose notebook imports it)}``. Never a graded exercise's reference."""
    regions = solution_regions(root) if regions is None else regions
    imported, graded = provided_by(root), graded_references()
    return {r.owner: (r.chapter, imported[r.owner]) for r in regions
            if r.owner in imported and imported[r.owner] < r.chapter and r.owner not in graded}


def secrets(through: int, root: Path = ROOT) -> tuple[Region, ...]:
    """The regions a release through chapter ``through`` must not contain."""
    regions = solution_regions(root)
    given = handed_out(regions, root)
    return tuple(r for r in regions if r.chapter > through and r.owner not in given)


def withheld(through: int, root: Path = ROOT) -> dict[str, int]:
    """``{name: chapter}`` of the package's objects a release through ``through`` replaces by stubs."""
    names = {r.owner: r.chapter for r in secrets(through, root) if r.owner}
    for name, chapter in graded_references().items():
        if chapter > through:
            names.setdefault(name, chapter)
    return names


def released_through() -> int:
    """The cut-off the grader holds: ``AUTOGRADER_RELEASED_THROUGH`` (a chapter number), else every chapter
    (the self-learner's course, whose package holds every answer anyway)."""
    import os

    value = os.environ.get("AUTOGRADER_RELEASED_THROUGH", "").strip()
    if not value:
        return LAST_CHAPTER
    through = int(value)
    if not 0 <= through <= LAST_CHAPTER:
        raise ValueError(f"AUTOGRADER_RELEASED_THROUGH must be a chapter number 0..{LAST_CHAPTER}, got {value!r}")
    return through


# --- normal forms -----------------------------------------------------------------------------------

def text_form(source: str) -> str:
    """Code without comments and without any whitespace (inside strings too)."""
    try:
        kept = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                  tokenize.ENDMARKER)]
        joined = "".join(kept)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        joined = re.sub(r"#[^\n]*", "", source)
    return re.sub(r"\s+", "", joined)


def _flat(text: str) -> str:
    return re.sub(r"\s+", "", html.unescape(text))


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


class _Alpha(ast.NodeTransformer):
    """Local names renamed ``v0, v1, ...`` in order of first appearance (attributes and calls' attribute
    names stay: ``self.w_1`` is still ``self.w_1``)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _new(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self._new(node.arg)
        node.annotation = None
        return node


def _dump(stmts: list[ast.stmt], alpha: bool) -> str:
    module = ast.Module(body=[copy.deepcopy(s) for s in stmts], type_ignores=[])
    _without_docstrings(module)
    if alpha:
        module = _Alpha().visit(module)
    return ast.dump(module, annotate_fields=False)


def _code_keys(code) -> list[tuple]:
    """Every function's code object under ``code`` (itself included), as a key: bytecode, names, constants."""
    keys = []
    stack = [code]
    while stack:
        current = stack.pop()
        consts = tuple(c for c in current.co_consts if not hasattr(c, "co_code"))
        if current.co_name != "<module>":
            doc = consts[:1] if consts and isinstance(consts[0], str) else ()
            keys.append((current.co_code, current.co_names, consts[len(doc):], current.co_name))
        stack.extend(c for c in current.co_consts if hasattr(c, "co_code"))
    return keys


@dataclass
class Forms:
    """The normal forms of a set of regions, ready to search for."""

    regions: tuple[Region, ...]
    exact: dict[tuple[str, ...], int] = field(default_factory=dict)
    alpha: dict[tuple[int, str], int] = field(default_factory=dict)
    shapes: set[tuple[str, ...]] = field(default_factory=set)
    text: list[tuple[str, int]] = field(default_factory=list)
    code: dict[tuple, int] = field(default_factory=dict)

    @classmethod
    def of(cls, regions: tuple[Region, ...]) -> "Forms":
        forms = cls(tuple(regions))
        for i, region in enumerate(regions):
            forms.text.append((text_form(region.source), i))
            try:
                stmts = ast.parse(_code(region.source)).body
            except SyntaxError:
                stmts = []
            if stmts:
                forms.exact[tuple(_dump([s], False) for s in stmts)] = i
                forms.alpha[(len(stmts), _dump(stmts, True))] = i
                forms.shapes.add(tuple(type(s).__name__ for s in stmts))
            try:
                for key in _code_keys(compile(_code(region.cell), f"<{region.grade_id}>", "exec")):
                    if key[3] == region.owner or region.owner == "":
                        forms.code[key[:3]] = i
                    elif key[3] not in ("<lambda>", "<genexpr>", "<listcomp>"):
                        forms.code[key[:3]] = i  # a method of the owning class
            except SyntaxError:
                pass
        return forms

    @property
    def lengths(self) -> set[int]:
        return {k for k, _ in self.alpha}


@dataclass(frozen=True)
class Hit:
    """A region found in a file: where, which, and by which normal form."""

    file: str
    region: Region
    how: str
    line: int = 0

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.region.label} ({self.how})"


def _statement_lists(tree: ast.AST):
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield stmts
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body


def python_hits(source: str, forms: Forms, file: str) -> list[Hit]:
    """The regions found in one Python source (or notebook code cell)."""
    hits: dict[tuple[int, str], Hit] = {}
    flat = text_form(source)
    for text, i in forms.text:
        if text and text in flat:
            hits[(i, "text")] = Hit(file, forms.regions[i], "text without comments or whitespace")
    try:
        tree = ast.parse(_code(source))
    except SyntaxError:
        return list(hits.values())
    lengths = sorted(forms.lengths)
    for stmts in _statement_lists(tree):
        dumps = [_dump([s], False) for s in stmts]
        for k in lengths:
            for start in range(0, len(stmts) - k + 1):
                window = tuple(dumps[start:start + k])
                line = stmts[start].lineno
                if window in forms.exact:
                    i = forms.exact[window]
                    hits.setdefault((i, "ast"), Hit(file, forms.regions[i], "ast dump", line))
                if tuple(type(s).__name__ for s in stmts[start:start + k]) not in forms.shapes:
                    continue
                key = (k, _dump(stmts[start:start + k], True))
                if key in forms.alpha:
                    i = forms.alpha[key]
                    hits.setdefault((i, "alpha"), Hit(file, forms.regions[i], "ast dump, names renamed", line))
    return list(hits.values())


def bytecode_hits(data: bytes, forms: Forms, file: str) -> list[Hit]:
    """The regions whose code objects a ``.pyc`` holds."""
    try:
        code = marshal.loads(data[16:])
    except (ValueError, EOFError, TypeError):
        return [Hit(file, Region(0, "", "", "", ""), "unreadable bytecode")]
    found = {}
    for key in _code_keys(code):
        if key[:3] in forms.code:
            i = forms.code[key[:3]]
            found[i] = Hit(file, forms.regions[i], f"bytecode of `{key[3]}`")
    return list(found.values())


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def text_hits(text: str, forms: Forms, file: str) -> list[Hit]:
    flat = _flat(text)
    return [Hit(file, forms.regions[i], "text without whitespace") for t, i in forms.text if t and t in flat]


def json_hits(value, forms: Forms, file: str) -> list[Hit]:
    """Every string of a JSON document (a widget's state holds nested JSON and HTML) searched."""
    hits = {}
    for string in _strings(value):
        if len(string) < 16:
            continue
        try:
            inner = json.loads(string)
        except (ValueError, TypeError):
            inner = None
        for hit in text_hits(string, forms, file) + (json_hits(inner, forms, file) if isinstance(inner, (dict, list))
                                                     else []):
            hits[(hit.region, hit.how)] = hit
    return list(hits.values())


def notebook_hits(nb: dict, forms: Forms, file: str) -> list[Hit]:
    hits = []
    for number, cell in enumerate(nb.get("cells", [])):
        source = "".join(cell.get("source", []))
        where = f"{file} cell {number}"
        if cell.get("cell_type") == "code":
            hits += python_hits(source, forms, where)
        else:
            hits += text_hits(source, forms, where)
        hits += json_hits(cell.get("outputs", []), forms, where + " outputs")
        hits += json_hits(cell.get("attachments", {}), forms, where + " attachments")
    hits += json_hits(nb.get("metadata", {}), forms, file + " metadata (saved widget state)")
    return hits


def file_hits(name: str, data: bytes, forms: Forms, skipped: list[str]) -> list[Hit]:
    """The regions found in one file, whatever its kind (a zip or wheel: member by member)."""
    lower = name.lower()
    if lower.endswith(".pyc"):
        return bytecode_hits(data, forms, name)
    if lower.endswith((".zip", ".whl")):
        hits = []
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for member in archive.namelist():
                if not member.endswith("/"):
                    hits += file_hits(f"{name}!{member}", archive.read(member), forms, skipped)
        return hits
    if lower.endswith(BINARY):
        skipped.append(name)
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        skipped.append(name)
        return []
    if lower.endswith(".py"):
        return python_hits(text, forms, name)
    if lower.endswith((".ipynb", ".json")):
        try:
            value = json.loads(text)
        except ValueError:
            return text_hits(text, forms, name)
        if lower.endswith(".ipynb"):
            return notebook_hits(value, forms, name)
        return json_hits(value, forms, name) + text_hits(text, forms, name)
    return text_hits(text, forms, name)


def find_answers(folder: Path, through: int, root: Path = ROOT, skipped: list[str] | None = None) -> list[Hit]:
    """Every answer of a chapter after ``through`` found in any file under ``folder``."""
    forms = Forms.of(secrets(through, root))
    skipped = [] if skipped is None else skipped
    hits = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        hits += file_hits(str(path.relative_to(folder)), path.read_bytes(), forms, skipped)
    return hits


# --- building a release -----------------------------------------------------------------------------

def _put_cut_off(release_file: Path, through: int) -> None:
    """Make the copied self-learner's ``_release.py`` (every chapter released) the release's, cut at ``through``."""
    every = f"RELEASED_THROUGH = {LAST_CHAPTER}\n"
    text = release_file.read_text()
    if text.count(every) != 1:
        raise ValueError(f"{release_file} must set `{every.strip()}` exactly once")
    release_file.write_text(text.replace(every, f"RELEASED_THROUGH = {through}\n"))


_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "0.1.0+through{through:02d}"
description = "The Transformer, built and graded: the student package of a graded release (chapters 1-{through:02d} released)."
requires-python = ">=3.10"
license = "MIT"
dependencies = {dependencies}

[tool.setuptools.packages.find]
include = ["tfm_solution*"]

[tool.setuptools.package-data]
tfm_solution = ["assets/**/*.json", "assets/**/*.safetensors", "assets/**/*.jsonl", "assets/**/*.md"]
'''


def _stub(node: ast.AST, chapter: int, depth: int) -> str:
    """The source of a stub standing for ``node`` (a top-level function or class)."""
    doc = ast.get_docstring(node, clean=False)
    body: list[ast.stmt] = [ast.Expr(ast.Constant(doc))] if doc else []
    init = next((n for n in getattr(node, "body", ()) if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                node)
    args = getattr(init, "args", None) or ast.arguments([], [], None, [], [], None, [])
    stand_in = f"NotReleased.stand_in({node.name!r}, {chapter}, {_constant_defaults(args)!r})"
    if isinstance(node, ast.ClassDef):  # the instance is the reader's own class's, when it is written
        new = ast.parse(f"def __new__(cls, *args, **kwargs):\n    return {stand_in}(*args, **kwargs)").body[0]
        stub = ast.ClassDef(node.name, node.bases, node.keywords, body + [new], [], type_params=[])
    else:
        stub = ast.FunctionDef(node.name, node.args, body + [ast.Return(_call(stand_in, node.args))], [],
                               node.returns, type_params=[])
    return ast.unparse(ast.fix_missing_locations(stub))


def _constant_defaults(args: ast.arguments) -> dict:
    """``{parameter: default}`` of the parameters whose default is a literal."""
    with_defaults = list(zip((args.posonlyargs + args.args)[::-1], args.defaults[::-1]))
    with_defaults += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    return {a.arg: d.value for a, d in with_defaults if isinstance(d, ast.Constant)}


def _call(function: str, args: ast.arguments) -> ast.Call:
    """``function(...)`` passing on every parameter of ``args``: those without a default by position, the others
    by name (so that ``NotReleased.stand_in`` can leave out those at their defaults)."""
    call = ast.parse(f"{function}()", mode="eval").body
    positional = args.posonlyargs + args.args
    required = positional[:len(positional) - len(args.defaults)]
    call.args = [ast.Name(a.arg) for a in required]
    call.args += [ast.Starred(ast.Name(args.vararg.arg))] if args.vararg else []
    call.keywords = [ast.keyword(a.arg, ast.Name(a.arg)) for a in positional[len(required):] + args.kwonlyargs]
    call.keywords += [ast.keyword(None, ast.Name(args.kwarg.arg))] if args.kwarg else []
    return call


def _top_level(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _replace(path: Path, names: dict[str, int], package: Path) -> list[str]:
    """Stub the top-level objects ``names`` defines in ``path``; return those it defined."""
    text = path.read_text()
    tree = ast.parse(text)
    found = {n: node for n, node in _top_level(tree).items() if n in names and not _is_stub(node)}
    if not found:
        return []
    lines = text.splitlines(keepends=True)
    depth = len(path.relative_to(package).parts) - 1
    for name, node in sorted(found.items(), key=lambda item: -item[1].lineno):
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        lines[start:node.end_lineno] = [_stub(node, names[name], depth) + "\n"]
    body_start = next((n for n in tree.body if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
                       and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))), None)
    insert = (body_start.lineno - 1) if body_start is not None else len(lines)
    # the line's index may have moved if a stub came before it: objects are below the imports, so it did not
    lines.insert(insert, f"from {'.' * (depth + 1)}_release import NotReleased\n")
    path.write_text("".join(lines))
    return sorted(found)


def _is_stub(node: ast.AST) -> bool:
    return "NotReleased" in ast.unparse(node)


def _uses(package: Path) -> dict[tuple[str, str], set[str]]:
    """The names each top-level statement of the package reads: ``{(file, defined name or line): names}``."""
    uses: dict[tuple[str, str], set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            key = (str(path.relative_to(package)), getattr(node, "name", f"line {node.lineno}"))
            names = uses.setdefault(key, set())
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
                elif isinstance(sub, ast.Attribute):
                    names.add(sub.attr)
                elif isinstance(sub, ast.alias):
                    names.add(sub.name.split(".")[-1])
                    names.add(sub.asname or "")
                elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.isidentifier():
                    names.add(sub.value)
    return uses


def _used_helpers(package: Path) -> set[tuple[str, str]]:
    """Private top-level helpers (``_name``) something other than themselves reads."""
    uses = _uses(package)
    alive = set()
    for (file, name) in uses:
        if name.startswith("_") and not name.startswith("__"):
            if any(name in names for key, names in uses.items() if key != (file, name)):
                alive.add((file, name))
    return alive


def _dead_private(package: Path, alive_before: set[tuple[str, str]]) -> dict[Path, list[str]]:
    """Helpers the full package used that nothing reads any more, once answers are stubs."""
    now = _used_helpers(package)
    dead: dict[Path, list[str]] = {}
    for file, name in sorted(alive_before - now):
        path = package / file
        node = _top_level(ast.parse(path.read_text())).get(name)
        if node is not None and not _is_stub(node):
            dead.setdefault(path, []).append(name)
    return dead


@dataclass
class Release:
    through: int
    folder: Path
    withheld: dict[str, str] = field(default_factory=dict)
    handed_out: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.folder.rglob("*") if p.is_file())


def _release_cell(root: Path, through: int) -> str | None:
    """The Colab cell of the release's notebooks, when ``_config.yml`` names where its package is served."""
    import yaml

    config = yaml.safe_load((root / "_config.yml").read_text()) or {}
    url = ((config.get("course_release") or {}).get("package_url") or "").strip()
    if not url:
        return None
    from tfm_solution.colab import release_cell

    return release_cell(url.format(through=f"{through:02d}"))


def stored_figures(through: int, root: Path = ROOT) -> dict[str, str]:
    """The figures the committed notebooks of chapters after ``through`` stored, by cell (``tfm_solution._stored``): what
    such a cell shows while an answer it needs is not released and the student's own is still a stub."""
    from tfm_solution._stored import figures_of

    found: dict[str, str] = {}
    for notebook in sorted((root / "chapters").glob("[0-9][0-9]_*/*.ipynb")):
        if int(notebook.parent.name[:2]) > through:
            found.update(figures_of(json.loads(notebook.read_text())))
    return found


def build_release(through: int, out: Path, root: Path = ROOT) -> Release:
    """Write the release through chapter ``through`` into ``out/release-NN`` (replaced if it exists)."""
    start = time.monotonic()
    if not 0 <= through <= LAST_CHAPTER:
        raise ValueError(f"THROUGH must be a chapter number 0..{LAST_CHAPTER}, got {through}")
    folder = Path(out) / f"release-{through:02d}"
    if folder.exists():
        shutil.rmtree(folder)
    release = Release(through, folder)
    package_root = folder / "package"
    package = package_root / PACKAGE
    left_out = shutil.ignore_patterns("__pycache__", "*.pyc", *LEFT_OUT)
    shutil.copytree(root / PACKAGE, package, ignore=left_out)
    _put_cut_off(package / "_release.py", through)
    (package / "assets" / "stored_figures.json").write_text(json.dumps(stored_figures(through, root), sort_keys=True))

    names = withheld(through, root)
    alive_before = _used_helpers(package)
    for path in sorted(package.rglob("*.py")):
        for name in _replace(path, names, package):
            release.withheld[f"{path.relative_to(package_root).with_suffix('').as_posix().replace('/', '.')}:{name}"] = \
                f"chapter {names[name]:02d}'s answer"
    # Helpers only the withheld answers used go too (a helper holding an answer's loop, say).
    while dead := _dead_private(package, alive_before):
        for path, helpers in dead.items():
            _replace(path, {h: through + 1 for h in helpers}, package)
            for helper in helpers:
                release.withheld[f"{path.relative_to(package_root).with_suffix('').as_posix().replace('/', '.')}:"
                                 f"{helper}"] = "a helper only withheld answers used"
    # Whatever the answer search still finds in the package is stubbed as well; anywhere else it is an error.
    for _ in range(5):
        hits = [h for h in find_answers(package_root, through, root) if h.file.endswith(".py")]
        if not hits:
            break
        for hit in hits:
            path = package_root / hit.file
            tree = ast.parse(path.read_text())
            owner = next((n.name for n in _top_level(tree).values()
                          if hit.line and n.lineno <= hit.line <= n.end_lineno), None)
            if owner is None:
                raise RuntimeError(f"an answer outside any function or class of the package: {hit}")
            _replace(path, {owner: hit.region.chapter}, package)
            release.withheld[f"{hit.file[:-3].replace('/', '.')}:{owner}"] = f"holds {hit.region.label}"
    dependencies = _dependencies(root)
    (package_root / "pyproject.toml").write_text(_PYPROJECT.format(distribution=DISTRIBUTION, through=through,
                                                                   dependencies=json.dumps(dependencies)))
    (package_root / "README.md").write_text(
        f"# {DISTRIBUTION}\n\nThe student package of a graded release of *The Transformer, built and graded*: "
        f"the reference of chapters 01-{through:02d}, the widgets, the data tools and the course model's weights. "
        "Later chapters' answers are released after their deadlines.\n")

    _wheel(package_root, folder / "wheel")
    cell = _release_cell(root, through)
    for notebook in sorted((root / "chapters").glob("[0-9][0-9]_*/*.ipynb")):
        target = folder / "chapters" / notebook.parent.name / notebook.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nb = json.loads(notebook.read_text())
        if cell is not None:
            for c in nb["cells"]:
                if c.get("id") == "colab-install":
                    c["source"] = cell.splitlines(keepends=True)
        target.write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
        for extra in notebook.parent.iterdir():  # a chapter's assets travel with it
            if extra.is_file() and extra.suffix != ".ipynb":
                shutil.copy2(extra, target.parent / extra.name)
    release.handed_out = {name: f"chapter {asks:02d} asks for it; chapter {given:02d}'s notebook imports it"
                          for name, (asks, given) in handed_out(None, root).items() if asks > through}
    release.seconds = time.monotonic() - start
    (folder / "manifest.json").write_text(json.dumps({
        "released_through": through, "distribution": DISTRIBUTION, "withheld": release.withheld,
        "handed_out": release.handed_out, "left_out": list(LEFT_OUT)}, indent=1, sort_keys=True) + "\n")
    return release


def _wheel(project: Path, out: Path) -> Path:
    """The student package as a wheel (what an instructor serves, and Colab's cell installs)."""
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(out), str(project)], check=True, capture_output=True, text=True)
    for leftover in ("build", f"{DISTRIBUTION.replace('-', '_')}.egg-info"):
        shutil.rmtree(project / leftover, ignore_errors=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def _dependencies(root: Path) -> list[str]:
    import tomllib

    return list(tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder release", description=__doc__.splitlines()[0])
    parser.add_argument("--through", type=int, required=True, help="the last chapter whose answers are released")
    parser.add_argument("--out", type=Path, default=Path("dist"))
    args = parser.parse_args(argv)
    release = build_release(args.through, args.out)
    hits = find_answers(release.folder, args.through)
    for hit in hits:
        print(f"answer found: {hit}", file=sys.stderr)
    print(f"{release.folder}: chapters 01-{args.through:02d} released, {len(release.withheld)} objects withheld, "
          f"{release.size() / 1e6:.1f} MB, {release.seconds:.1f} s")
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main())
