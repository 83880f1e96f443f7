"""The Chinese course (``zh/``), generated from the English sources and their translations.

Every piece of English prose the course shows has its Chinese in one sidecar file per page under
``translations/zh/``, next to a hash of the English it was translated from::

    <!-- cell fbc2e413 en=3f2a9c0d1e4b5a67 -->
    # 1. 词嵌入
    ...

The pieces ("units") are: each markdown cell of a notebook (keyed by its cell id), each section
of a Markdown page (keyed by its heading), each entry of the glossary, each caption of the table
of contents, and the book's title and author. Code cells, outputs, widget state and nbgrader
metadata are never copied into a sidecar: ``make chapters`` writes ``zh/`` from the English
student notebooks (``chapters/``) and pages, replacing the prose only, so both languages share
every line of code and every graded region by construction.

Two pieces of a code cell outside the graded regions are translated, and nothing else of it. Its comments
are a unit of the page's sidecar, keyed by the cell's id: one line per comment, in the order of the code
(``code_comments``; a page under ``comments_pending`` in ``site.yml`` may keep them English). And the
messages of its ``assert`` statements (its visible tests' messages): ``translations/zh/<page>.messages.yml`` maps each
message's string literal, exactly as the English code writes it, to its Chinese literal (an f-string
keeps the same ``{...}`` fields). Keyed by the English itself, a reworded message has no Chinese and an
entry whose English is gone is named, so no hash is needed; every other character of the code, and
every graded cell (answers and graded tests), stays the English one's. A page listed under
``messages_pending`` in ``site.yml`` may show English messages until its file is complete.

The widgets' labels and readouts (a control's description and option labels, an HTML readout's text) are
translated too, in the notebook's widget state, through one table per language that the package ships
(``tfm_solution/assets/widgets/zh.json``, see ``tfm_solution.viz.language``): a running kernel translates
the live widgets with the same table. A widget text with Latin letters that the table neither translates
nor lists as ``neutral`` (symbols, tensor names, the data's tokens and sentences), and an entry of
``strings`` that no widget shows any more, are problems. The figures' own text stays English.

A unit whose translation is missing, or whose English changed after it was translated (the hash
differs), is a problem: ``make chapters`` and ``make chapters --check`` fail and name it. The one
exception is a page listed under ``pending`` in ``translations/zh/site.yml``: its untranslated
units are shown in English under a "译文待补" note, so the site builds while a page waits for its
translation. The list is meant to be emptied.

Commands for translators (``python scripts/translations.py ...``):

- ``status``: per page, how many units are translated, stale or missing, and the termbase's findings;
- ``todo PAGE``: print the missing and stale units of a page as sidecar blocks (English text,
  marked ``en=new``), ready to be translated and pasted into the page's sidecar, and its assert
  messages without Chinese as entries of its ``.messages.yml``;
- ``stamp PAGE [KEY ...]``: record the hash of the current English for the blocks marked
  ``en=new`` (or for the named keys, after their translation was brought up to date);
- ``todo diagnoses`` / ``stamp diagnoses [KEY ...]``: the same for the grader's Chinese (``diagnoses.yml``);
- ``todo grader`` / ``stamp grader [ENGLISH ...]``: the same for the rest of the grader's lines (``grader.yml``);
- ``build HTML_DIR``: build the Chinese site into ``HTML_DIR/zh`` (``make book`` does this) and check that no
  page shows Markdown's ``*``, ``**`` or backticks as text.

The words around the terms (visible tests, stub, notebook, the section headings ...) have one Chinese form each
in ``translations/zh/vocabulary.yml``; ``make chapters`` names any other form found in ``zh/``, the test
messages, the widget table and the grader's Chinese, and any unit that would show ``*`` or a backtick.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
import yaml

if TYPE_CHECKING:
    from tfm_solution.viz.language import Table

REPO = Path(__file__).resolve().parents[1]
LANGUAGE = "zh"
SITE = "zh"  # the generated Chinese course, beside the English one
TRANSLATIONS = Path("translations") / LANGUAGE
SETTINGS = TRANSLATIONS / "site.yml"
#: The grader's Chinese (its diagnoses of declared mistakes), read by ``autograder.diagnoses_zh``.
DIAGNOSES = TRANSLATIONS / "diagnoses.yml"
#: The rest of the grader's Chinese (every other line it writes), read by ``autograder.feedback_zh``.
GRADER = TRANSLATIONS / "grader.yml"
HASH_LENGTH = 16
TODO = "python scripts/translations.py todo"
#: The note that stands above an English unit shown on a pending page.
PENDING_NOTE = "> **译文待补**：这一部分还没有译成中文，下面是英文原文。"
#: The search dictionary of the Chinese site: the termbase's Chinese terms, so that search finds
#: "层归一化" as one word instead of its pieces.
SEARCH_DICTIONARY = "search_dictionary.txt"
#: The link on every Chinese page to the same page of the English site, one folder up
#: (``_config.yml`` holds the English site's link to this one).
LANGUAGE_LINK = {"href": "../", "label": "English", "hreflang": "en"}
#: Pages whose units are plain strings, not Markdown.
PLAIN = ("_toc", "_config")
_MARKER = re.compile(rf"^<!-- cell (?P<key>\S+) en=(?P<hash>[0-9a-f]{{{HASH_LENGTH}}}|new) -->$", re.M)
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})(?P<info>.*)$")


def english_hash(text: str) -> str:
    """The hash a translation records of the English it was made from."""
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def slug(text: str) -> str:
    """``"Query, key, value (查询, 键, 值)"`` -> ``"query-key-value"``: a key made of the English words."""
    english = re.sub(r"\(.*?\)", "", text).lower()
    return re.sub(r"[^a-z0-9]+", "-", english).strip("-") or "untitled"


# --------------------------------------------------------------------------------------------
# Pages and their units


@dataclass
class Page:
    """One page of the course as a list of parts: units to translate (``key`` set) and structure.

    Joining the parts' texts with newlines gives the English page back exactly.
    """

    docname: str  # "intro", "chapters/01_embeddings/embeddings", or "_toc" / "_config"
    parts: list[tuple[str | None, str]] = field(default_factory=list)
    comments: set[str] = field(default_factory=set)  # units that are a code cell's comments
    optional: set[str] = field(default_factory=set)  # units that may stay English (comments of a comments_pending page)

    def units(self) -> dict[str, str]:
        return {key: text for key, text in self.parts if key is not None}

    def add(self, key: str | None, lines: list[str]) -> None:
        """Append a part; a unit's blank edge lines become structure, so translations need not keep them."""
        if key is None:
            self.parts.append((None, "\n".join(lines)))
            return
        start, end = 0, len(lines)
        while start < end and not lines[start].strip():
            start += 1
        while end > start and not lines[end - 1].strip():
            end -= 1
        if start:
            self.parts.append((None, "\n".join(lines[:start])))
        if start < end:
            taken = {k for k, _ in self.parts}
            unique, n = key, 2
            while unique in taken:
                unique, n = f"{key}-{n}", n + 1
            self.parts.append((unique, "\n".join(lines[start:end])))
        if end < len(lines):
            self.parts.append((None, "\n".join(lines[end:])))


def markdown_page(docname: str, text: str) -> Page:
    """Split a Markdown page into sections (a heading and what follows it, up to the next heading)
    and, inside a ``{glossary}`` directive, into one unit per entry; fences stay inside their section."""
    page = Page(docname)
    lines = text.split("\n")
    key, chunk, fence, glossary = "top", [], None, False
    for line in lines:
        opened = _FENCE.match(line)
        if fence is None and opened and opened["info"].strip().startswith("{glossary}"):
            page.add(key, chunk)
            page.add(None, [line])
            key, chunk, fence, glossary = None, [], opened["fence"], True
            continue
        if glossary:
            if opened and opened["fence"] == fence and not opened["info"].strip():
                if key is not None:
                    page.add(key, chunk)
                page.add(None, [line])
                key, chunk, fence, glossary = "after-glossary", [], None, False
            elif line.strip() and not line[0].isspace():  # a term line starts an entry
                if key is not None:
                    page.add(key, chunk)
                key, chunk = f"term-{slug(line)}", [line]
            else:
                chunk.append(line)
            continue
        if fence is None and opened:
            fence = opened["fence"]
        elif fence is not None and opened and opened["fence"] == fence and not opened["info"].strip():
            fence = None
        elif fence is None and _HEADING.match(line):
            page.add(key, chunk)
            key, chunk = slug(_HEADING.match(line)["title"]), []
        chunk.append(line)
    page.add(key, chunk)
    return page


def _course_module(name: str):
    """A module of the course's own packages, also when this file runs as a script (Python then puts
    ``scripts/`` first on the path, not the repository); imported on first use, as only generation needs it."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(name)


def _contract():
    """``autograder.contract``: an exercise's statement ends with its contract, generated in both languages."""
    return _course_module("autograder.contract")


def notebook_page(docname: str, nb: nbformat.NotebookNode, root: Path | None = None) -> Page:
    """A notebook's units: its markdown cells, keyed by cell id (a statement's generated contract is not
    part of its unit: ``make chapters`` writes it in Chinese itself, see ``translate_notebook``), and the
    comments of each code cell outside the graded regions, keyed by the code cell's id (``code_comments``).
    With ``root``, the comments of a page listed under ``comments_pending`` in its ``site.yml`` may stay English."""
    page = Page(docname)
    hand_written = _contract().hand_written
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            page.parts.append((cell.id, hand_written(cell.source)))
        elif cell.cell_type == "code" and not graded(cell) and (comments := code_comments(cell.source)):
            page.parts.append((cell.id, comments))
            page.comments.add(cell.id)
            if root is not None and docname in (settings(root).get("comments_pending") or []):
                page.optional.add(cell.id)
    return page


# --------------------------------------------------------------------------------------------
# The comments of code cells: one unit per code cell, one line per comment (as d2l-zh, the Chinese
# notebook's comments are Chinese; the code itself is the English notebook's, character for character)


def _comment_tokens(source: str) -> list[tokenize.TokenInfo]:
    """The comments of a code cell that a reader reads: not the visible tests' ``# contract: key`` markers, which
    name a clause of the contract for the self-tests; none for a cell that does not tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []
    return [t for t in tokens if t.type == tokenize.COMMENT and not re.fullmatch(r"#\s*contract:[\w\- ,]*", t.string)]


def code_comments(source: str) -> str:
    """A code cell's comments, one per line, each as the code writes it (``# row i is ...``): its unit's English."""
    return "\n".join(t.string.rstrip() for t in _comment_tokens(source))


def comment_problem(english: str, chinese: str) -> str | None:
    """Why ``chinese`` cannot stand for the comments ``english`` (``None``: it can): one comment per line, in order."""
    lines = chinese.split("\n")
    if len(lines) != len(english.split("\n")):
        return f"the code has {len(english.splitlines())} comments, the translation {len(lines)} lines: one line per comment"
    if not all(line.startswith("#") for line in lines):
        return "every line of a comment unit is a comment: it starts with #"
    return None


def translate_comments(source: str, chinese: str) -> str:
    """``source`` with its comments replaced, in order, by the lines of ``chinese`` (the code is untouched)."""
    tokens, lines = _comment_tokens(source), chinese.split("\n")
    if len(tokens) != len(lines):
        return source
    rows = StringIO(source).readlines()
    starts = [0]
    for row in rows:
        starts.append(starts[-1] + len(row))
    for token, line in reversed(list(zip(tokens, lines))):
        start = starts[token.start[0] - 1] + token.start[1]
        end = starts[token.end[0] - 1] + token.end[1]
        source = source[:start] + line + source[end:]
    return source


def contract_problems(docname: str, nb: nbformat.NotebookNode) -> list[str]:
    """The statements of a notebook whose generated contract has no Chinese rendering."""
    contract = _contract()
    blocks = [(c.id, contract.written_contract(c.source)) for c in nb.cells if c.cell_type == "markdown"]
    return [f"{docname}: cell {key}: the contract at the end of the statement has no Chinese rendering: add the "
            "sentences its grading module declares to `ZH` in autograder/contract.py"
            for key, block in blocks if block and contract.localized(block, LANGUAGE) is None]


def toc_page(toc: dict) -> Page:
    """The table of contents' units: its part captions."""
    page = Page("_toc")
    for part in toc.get("parts", []):
        page.parts.append((f"caption-{slug(part['caption'])}", part["caption"]))
    return page


def config_page(config: dict) -> Page:
    """The book configuration's units: its title and author."""
    page = Page("_config")
    for key in ("title", "author"):
        page.parts.append((key, config[key]))
    return page


def toc_docnames(toc: dict) -> list[str]:
    """Every page of the table of contents, the root first."""
    found = [toc["root"]]
    for part in toc.get("parts", []):
        found += [entry["file"] for entry in part["chapters"]]
    return found


# --------------------------------------------------------------------------------------------
# Sidecar files


@dataclass(frozen=True)
class Translation:
    source_hash: str  # the hash of the English it translates, or "new" before `stamp`
    text: str


def sidecar_path(root: Path, docname: str) -> Path:
    return root / TRANSLATIONS / f"{docname}.md"


def parse_sidecar(text: str, where: str = "sidecar") -> dict[str, Translation]:
    """Key -> translation; the text before the first marker is a comment for translators."""
    found: dict[str, Translation] = {}
    marks = list(_MARKER.finditer(text))
    for mark, following in zip(marks, [*marks[1:], None]):
        body = text[mark.end() : following.start() if following else len(text)]
        if mark["key"] in found:
            raise ValueError(f"{where}: cell {mark['key']} is translated twice")
        found[mark["key"]] = Translation(mark["hash"], body.strip("\n"))
    return found


def read_sidecar(root: Path, docname: str) -> dict[str, Translation]:
    path = sidecar_path(root, docname)
    return parse_sidecar(path.read_text(), str(path.relative_to(root))) if path.is_file() else {}


def sidecar_block(key: str, source_hash: str, text: str) -> str:
    return f"<!-- cell {key} en={source_hash} -->\n{text}\n"


def settings(root: Path) -> dict:
    return yaml.safe_load((root / SETTINGS).read_text())


# --------------------------------------------------------------------------------------------
# Translating a page


@dataclass
class Outcome:
    """What translating one page found."""

    docname: str
    translated: int = 0
    pending: list[str] = field(default_factory=list)  # units shown in English (page listed as pending)
    problems: list[str] = field(default_factory=list)


def translate_units(page: Page, translations: dict[str, Translation], is_pending: bool) -> tuple[dict[str, str], Outcome]:
    """Key -> the text the Chinese page shows for each unit, and what was found on the way."""
    outcome = Outcome(page.docname)
    shown: dict[str, str] = {}
    units = page.units()
    comment_keys = page.comments
    sidecar = (TRANSLATIONS / f"{page.docname}.md").as_posix()
    for key, english in units.items():
        done = translations.get(key)
        if done is not None and done.source_hash == english_hash(english):
            why = comment_problem(english, done.text) if key in comment_keys else None
            if why is None:
                shown[key] = done.text
                outcome.translated += 1
                continue
            outcome.problems.append(f"{sidecar}: cell {key}: {why}")
            shown[key] = english
            continue
        # The toc's captions, the config's title and code comments are plain strings: no Markdown note there.
        shown[key] = english if page.docname in PLAIN or key in comment_keys else with_pending_note(english, key)
        first_line = next((line for line in english.splitlines() if line.strip()), "")[:70]
        why = "no translation" if done is None else (
            "translated but never stamped" if done.source_hash == "new" else "the English changed since it was translated")
        if is_pending or (done is None and key in page.optional):
            outcome.pending.append(key)
        else:
            outcome.problems.append(f"{sidecar}: cell {key}: {why} ({first_line!r}); `{TODO} {page.docname}` lists what to translate")
    for key in sorted(set(translations) - set(units)):
        outcome.problems.append(f"{sidecar}: cell {key}: translated, but the English page has no such cell")
    return shown, outcome


def with_pending_note(english: str, key: str = "") -> str:
    """The English unit under the "translation pending" note: after its heading if it starts with
    one, inside the definition if it is a glossary entry (the term line must come first)."""
    lines = english.split("\n")
    if key.startswith("term-"):
        return "\n".join([lines[0], f"  {PENDING_NOTE.lstrip('> ')}", "", *lines[1:]])
    if _HEADING.match(lines[0]):
        return "\n".join([lines[0], "", PENDING_NOTE, *lines[1:]])
    return f"{PENDING_NOTE}\n\n{english}"


# --------------------------------------------------------------------------------------------
# The visible tests' messages


def messages_path(root: Path, docname: str) -> Path:
    return root / TRANSLATIONS / f"{docname}.messages.yml"


def read_messages(root: Path, docname: str) -> dict[str, str]:
    """English message literal -> Chinese literal, for one notebook (empty when it has no file).

    Raises ``ValueError`` naming the file for one that is not such a mapping (most often a literal holding
    ``": "`` left unquoted, which YAML reads as a second key).
    """
    path = messages_path(root, docname)
    if not path.is_file():
        return {}
    try:
        messages = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path.relative_to(root)}: not valid YAML ({' '.join(str(exc).split())}); a literal "
                         "holding ': ' needs quotes around it") from None
    if not isinstance(messages, dict) or not all(isinstance(v, str) for v in [*messages, *messages.values()]):
        raise ValueError(f"{path.relative_to(root)}: not a mapping of English literals to Chinese ones")
    return messages


def graded(cell: nbformat.NotebookNode) -> bool:
    """An answer cell or a graded test cell: a graded region, never changed by a translation."""
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("grade") or meta.get("solution"))


def message_spans(source: str) -> list[tuple[int, int, str]]:
    """``(start, end, literal)`` character offsets in ``source`` of every string literal inside the message of
    an ``assert`` statement; none for a cell that is not plain Python."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = StringIO(source).readlines()  # the lines as tokenize reads them
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(row: int, byte_col: int) -> int:  # ast counts UTF-8 bytes in a line, we count characters
        return starts[row - 1] + len(lines[row - 1].encode()[:byte_col].decode())

    ranges = [(offset(n.msg.lineno, n.msg.col_offset), offset(n.msg.end_lineno, n.msg.end_col_offset))
              for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.msg is not None]
    found = []
    for token in tokenize.generate_tokens(StringIO(source).readline):
        if token.type == tokenize.STRING:
            start, end = starts[token.start[0] - 1] + token.start[1], starts[token.end[0] - 1] + token.end[1]
            if any(low <= start and end <= high for low, high in ranges):
                found.append((start, end, token.string))
    return found


def _fields(literal: str) -> list[str] | None:
    """The ``{...}`` fields of a string literal, as code; ``None`` when it is not one string literal."""
    try:
        node = ast.parse(literal, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return []
    if isinstance(node, ast.JoinedStr):
        return sorted(ast.unparse(v) for v in node.values if isinstance(v, ast.FormattedValue))
    return None


def message_problem(english: str, chinese: object) -> str | None:
    """Why ``chinese`` cannot stand for the message literal ``english`` (``None``: it can)."""
    if not isinstance(chinese, str) or _fields(chinese) is None:
        return "the Chinese is not one Python string literal"
    if _fields(chinese) != _fields(english):
        return f"the Chinese must keep the English's fields {_fields(english)}, it has {_fields(chinese)}"
    return None


def translate_messages(source: str, messages: dict[str, str]) -> tuple[str, list[str], set[str]]:
    """``source`` with each assert message's literal that ``messages`` translates replaced; the literals it
    lacks; the English literals it used."""
    missing, used = [], set()
    for start, end, literal in reversed(message_spans(source)):
        if literal in messages:
            source = source[:start] + messages[literal] + source[end:]
            used.add(literal)
        else:
            missing.append(literal)
    return source, missing[::-1], used


def message_problems(nb: nbformat.NotebookNode, docname: str, messages: dict[str, str], is_pending: bool) -> list[str]:
    """The messages of a notebook without Chinese (unless the page is pending), the entries whose English is
    gone and the entries that change more than the words."""
    where = (TRANSLATIONS / f"{docname}.messages.yml").as_posix()
    problems, used, untranslated = [], set(), 0
    for cell in nb.cells:
        if cell.cell_type != "code" or graded(cell):
            continue
        _, missing, found = translate_messages(cell.source, messages)
        used |= found
        untranslated += len(missing)
        if not is_pending:
            problems += [f"{where}: cell {cell.id}: the message {m[:70]} has no Chinese" for m in missing]
    if is_pending and not untranslated:
        problems.append(f"{SETTINGS}: the messages of {docname!r} are all translated: take it off messages_pending")
    problems += [f"{where}: {english[:70]}: no assert of the notebook has this message any more"
                 for english in messages if english not in used]
    problems += [f"{where}: {english[:70]}: {why}" for english, chinese in messages.items()
                 if (why := message_problem(english, chinese))]
    return problems


def translate_notebook(nb: nbformat.NotebookNode, shown: dict[str, str],
                       messages: dict[str, str] | None = None, words: Table | None = None,
                       missing_widgets: list[str] | None = None) -> nbformat.NotebookNode:
    """The notebook with each markdown cell's source replaced, the assert messages of its code cells outside
    the graded regions (``messages``), its widgets' text (the table ``words``, if given) and the lines the
    package printed (``printed_lines``) translated; every other byte is the English one's."""
    from nbgrader.utils import compute_checksum

    contract = _contract()
    out = copy.deepcopy(nb)
    if words is not None:
        translate_widgets(out, words, missing_widgets)
    printed = printed_lines() if words is not None else None
    for cell in out.cells:
        if printed is not None and cell.cell_type == "code" and not graded(cell):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream":
                    output.text = "".join(printed.lookup(line) or line for line in output.text.splitlines(keepends=True))
        if cell.cell_type == "code" and not graded(cell) and cell.id in shown:
            cell.source = translate_comments(cell.source, shown[cell.id])
        if cell.cell_type == "code" and (messages or cell.id in shown) and not graded(cell):
            if messages:
                cell.source = translate_messages(cell.source, messages)[0]
            # A locked (read-only) visible test carries nbgrader's checksum of its source.
            if "checksum" in cell.metadata.get("nbgrader", {}):
                cell.metadata.nbgrader.checksum = compute_checksum(cell)
        if cell.cell_type != "markdown":
            continue
        block = contract.written_contract(cell.source)
        # A pending page may lack the Chinese of its contract: the English one then stays (as its prose does).
        block = block and (contract.localized(block, LANGUAGE) or block)
        cell.source = f"{shown[cell.id]}\n\n{block}" if block else shown[cell.id]
        # A read-only (locked) markdown cell carries nbgrader's checksum of its source.
        if "checksum" in cell.metadata.get("nbgrader", {}):
            cell.metadata.nbgrader.checksum = compute_checksum(cell)
    out.metadata["course"] = {"language": LANGUAGE}
    return out


# --------------------------------------------------------------------------------------------
# The widgets' labels and readouts

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_TABLE = Path("tfm_solution") / "assets" / "widgets" / f"{LANGUAGE}.json"


def _language():
    """``tfm_solution.viz.language``: the one translator of widget text, for the live kernel and for zh/."""
    return _course_module("tfm_solution.viz.language")


def printed_lines() -> Table:
    """The lines the package prints itself (the table's ``live`` entries: whose code a cell ran, a stored figure):
    a cell's printed output is data and stays as it is, but for these lines."""
    data = json.loads((REPO / WIDGET_TABLE).read_text(encoding="utf-8"))
    return _language().Table(data.get("live", {}))


def widget_table() -> Table:
    """A fresh table (its ``used`` set empty), to tell which entries a generation used."""
    return _language().read_table(LANGUAGE)


def translate_widgets(nb: nbformat.NotebookNode, words: Table, missing: list[str] | None = None) -> None:
    """Translate, in place, the text of every widget model saved in ``nb``; add to ``missing`` what has none."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for model in state.values():
        model["state"] = _language().translate_state(model["state"], words, missing)


def widget_problems(docname: str, missing: list[str]) -> list[str]:
    """What a notebook's widgets show in English without an entry of the table (``missing``), once each."""
    return [f"{WIDGET_TABLE.as_posix()}: the widgets of {docname} show {text[:70]!r}, which has no Chinese: add it "
            "to `strings` (or, if it is data that reads the same in both languages, a pattern to `neutral`)"
            for text in dict.fromkeys(missing)]


def stale_widget_entries(words: Table, strings: dict[str, str] | None = None) -> list[str]:
    """The entries of ``strings`` (the table's, by default) whose English no widget of the course shows any
    more, given the table ``words`` that translated every notebook."""
    if strings is None:
        strings = json.loads((REPO / WIDGET_TABLE).read_text(encoding="utf-8"))["strings"]
    return [f"{WIDGET_TABLE.as_posix()}: {english[:70]!r}: no widget shows this any more" for english in strings
            if english not in words.used]


def translate_text(page: Page, shown: dict[str, str]) -> str:
    return "\n".join(shown[key] if key is not None else text for key, text in page.parts)


# --------------------------------------------------------------------------------------------
# The termbase: the glossary


@dataclass(frozen=True)
class Term:
    english: str  # as the glossary writes it, e.g. "Layer normalization"
    chinese: str  # the notes' form, e.g. "层归一化"


def termbase(glossary_md: str) -> list[Term]:
    """The English terms of the glossary with their Chinese forms, from its term lines
    (``Layer normalization (层归一化)``; ``Query, key, value (查询, 键, 值)`` pairs them in order)."""
    terms = []
    for key, text in markdown_page("glossary", glossary_md).units().items():
        if not key.startswith("term-"):
            continue
        line = text.split("\n", 1)[0]
        found = re.fullmatch(r"(?P<en>[^(]+?)\s*\((?P<zh>[^)]*[\u4e00-\u9fff][^)]*)\)", line.strip())
        if not found:
            continue
        names, forms = [n.strip() for n in found["en"].split(",")], [f.strip() for f in found["zh"].split(",")]
        pairs = zip(names, forms) if len(names) == len(forms) else [(names[0], forms[0])]
        terms += [Term(en, zh) for en, zh in pairs]
    return terms


def other_renderings(zh_glossary_md: str) -> dict[str, list[str]]:
    """Glossary entry key -> the renderings other Chinese texts use that this course does not
    (the entry's line ``其他资料中的译名：层规范化（《动手学深度学习》）、层标准化``)."""
    found = {}
    for key, text in markdown_page("glossary", zh_glossary_md).units().items():
        line = re.search(r"其他资料中的译名：(.+)", text)
        if line:
            found[key] = [re.sub(r"（.*?）", "", item).strip() for item in line[1].split("、")]
    return found


def prose(text: str) -> str:
    """The words of a Markdown unit: code, math, link targets and HTML tags removed."""
    text = re.sub(r"^\s*(`{3,}|:{3,}).*?^\s*\1\s*$", " ", text, flags=re.M | re.S)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$|`[^`\n]+`", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)|<[^>]+>", " ", text)
    return text


def _english_pattern(name: str) -> re.Pattern:
    words = [re.escape(w) for w in re.split(r"[\s-]+", name.lower())]
    last = words[-1]
    plural = rf"(?:{last}|{last}s|{last}es{'|' + last[:-1] + 'ies' if last.endswith('y') else ''})"
    return re.compile(r"(?<![\w-])" + r"[\s-]+".join([*words[:-1], plural]) + r"(?![\w-])", re.I)


def term_problems(english: str, chinese: str, terms: list[Term], where: str) -> list[str]:
    """A translated unit must use the glossary's Chinese form of every glossary term its English uses
    (the longest term first: "padding mask" is not also "mask"), and keep every Chinese phrase
    the English quotes (the notes' own wording)."""
    problems = []
    en, zh = prose(english), prose(chinese)
    for term in sorted(terms, key=lambda t: -len(t.english)):
        pattern = _english_pattern(term.english)
        if pattern.search(en):
            en = pattern.sub(" ", en)
            acronym = re.fullmatch(r"[A-Z0-9-]+", term.english) and term.english in zh
            if term.chinese not in zh and not acronym:
                problems.append(f"{where}: the English says {term.english!r}, the Chinese lacks {term.chinese!r}")
    for quote in sorted(set(re.findall(r"[\u4e00-\u9fff]+", english))):
        if quote not in chinese:
            problems.append(f"{where}: the English quotes {quote!r}, the Chinese does not")
    return problems


def rendering_problems(chinese: str, english: str, avoided: dict[str, list[str]], terms: list[Term], where: str) -> list[str]:
    """A rendering the glossary lists as other texts' (not this course's) must not appear, unless
    the English quotes it too (a quotation of the notes keeps their words)."""
    text = prose(chinese)
    for form in sorted({t.chinese for t in terms}, key=len, reverse=True):
        text = text.replace(form, " ")  # "束搜索" inside "集束搜索" is the course's own term
    return [
        f"{where}: uses {variant!r}, which the glossary lists as another text's rendering"
        for variants in avoided.values() for variant in variants if variant in text and variant not in english
    ]


# --------------------------------------------------------------------------------------------
# The vocabulary: one Chinese form for each word of the course's interface

VOCABULARY = TRANSLATIONS / "vocabulary.yml"
_HAN = re.compile(r"[\u4e00-\u9fff]")


@dataclass(frozen=True)
class Word:
    name: str  # the entry's key, e.g. "visible tests"
    chinese: str  # the course's form, e.g. "可见测试"
    variants: tuple[str, ...]  # the forms it replaces, e.g. ("公开测试",)
    allowed: tuple[str, ...] = ()  # longer words that contain a variant and are fine


def vocabulary(root: Path = REPO) -> list[Word]:
    """The interface words of ``translations/zh/vocabulary.yml``, each with its one Chinese form."""
    entries = yaml.safe_load((root / VOCABULARY).read_text()) or {}
    return [Word(name, entry["zh"], tuple(entry.get("not") or ()), tuple(entry.get("allow") or ()))
            for name, entry in entries.items()]


def _without_code(text: str) -> str:
    """``text`` with what reads as code removed: calls (``f(x, memory)``, nested too) and names with ``_`` or ``.``."""
    while True:
        shorter = re.sub(r"[\w.]+\([^()]*\)", " ", text)
        if shorter == text:
            break
        text = shorter
    return re.sub(r"[\w.]*[_.][\w.]+|\w+\.\w+", " ", text)


def vocabulary_problems(text: str, words: list[Word], where: str, terms: list[Term] = ()) -> list[str]:
    """Every form of the vocabulary's ``not`` lists that ``text`` (Chinese prose, or a Chinese string) uses:
    the course's own forms (the vocabulary's and the glossary's) and the ``allow`` words are set aside
    first, so 绝对值很大的负数 is not 很大的负数; a form in Latin letters counts as a whole word only."""
    text = _without_code(text)
    text = re.sub(r"\|[^|\n\u4e00-\u9fff]*(?=\|)", "|", text)  # a table's English column
    for word in words:  # the course's form with its English in brackets: 记忆（memory）
        text = re.sub(rf"{re.escape(word.chinese)}[\s*_]*（[^）\u4e00-\u9fff]*）", word.chinese, text)
    for form in sorted({w.chinese for w in words} | {t.chinese for t in terms} | {a for w in words for a in w.allowed},
                       key=len, reverse=True):
        if _HAN.search(form) or " " in form:
            text = text.replace(form, " ")
    found = []
    for word in words:
        for variant in word.variants:
            if re.fullmatch(r"[A-Za-z][A-Za-z -]*", variant):
                hit = re.search(rf"(?<![A-Za-z0-9_\-/.]){re.escape(variant)}(?![A-Za-z0-9_\-/.(])", text, re.I)
            else:
                hit = variant in text
            if hit:
                found.append(f"{where}: uses {variant!r} where the course writes {word.chinese!r} "
                             f"({VOCABULARY.as_posix()}: {word.name})")
    return found


def _chinese_lines(source: str) -> str:
    """The comments and string literals of a code cell that hold Chinese (its translated comments and messages)."""
    try:
        tokens = list(tokenize.generate_tokens(StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return "\n".join(line for line in source.splitlines() if _HAN.search(line))
    return "\n".join(t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING) and _HAN.search(t.string))


def _chinese_paragraphs(text: str) -> str:
    """The paragraphs of ``text`` that hold Chinese: a unit still shown in English (pending) is not checked."""
    return "\n\n".join(p for p in re.split(r"\n\s*\n", text) if _HAN.search(p))


def chinese_texts(site: Path, docnames: list[str] | None = None) -> list[tuple[str, str]]:
    """``(where, text)`` of the Chinese prose of the generated course under ``site``: each Markdown page, each
    markdown cell of a notebook, and the lines of its code cells that hold Chinese; only ``docnames``, if given."""
    found = []
    for path in sorted(site.rglob("*")):
        docname = path.relative_to(site).with_suffix("").as_posix()
        if docnames is not None and docname not in docnames or path.name.startswith("_"):
            continue
        where = f"{SITE}/{path.relative_to(site).as_posix()}"
        if path.suffix == ".md":
            found.append((where, _chinese_paragraphs(prose(path.read_text()))))
        elif path.suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            for cell in nb.cells:
                text = _chinese_paragraphs(prose(cell.source)) if cell.cell_type == "markdown" else _chinese_lines(cell.source)
                found.append((f"{where}: cell {cell.get('id')}", text))
    return found


def data_texts(root: Path) -> list[tuple[str, str]]:
    """``(where, text)`` of the Chinese kept as data: the test messages, the widget table and the grader's."""
    found = []
    for path in sorted((root / TRANSLATIONS).rglob("*.messages.yml")):
        where = path.relative_to(root).as_posix()
        try:
            messages = read_messages(root, path.relative_to(root / TRANSLATIONS).as_posix().removesuffix(".messages.yml"))
        except ValueError:
            continue  # named by generate
        found += [(f"{where}: {english[:60]}", chinese) for english, chinese in messages.items()]
    table = root / WIDGET_TABLE
    if not table.is_file():
        table = REPO / WIDGET_TABLE
    strings = json.loads(table.read_text(encoding="utf-8"))["strings"]
    found += [(f"{WIDGET_TABLE.as_posix()}: {english[:60]!r}", chinese) for english, chinese in strings.items()]
    diagnoses = root / DIAGNOSES
    if diagnoses.is_file():
        found += [(f"{DIAGNOSES.as_posix()}: {key[:60]!r}", chinese)
                  for key, chinese in _diagnoses_chinese(yaml.safe_load(diagnoses.read_text()))]
    grader = root / GRADER
    if grader.is_file():
        found += [(f"{GRADER.as_posix()}: {key[:60]!r}", chinese)
                  for key, chinese in _diagnoses_chinese(yaml.safe_load(grader.read_text()))]
    return found


def _diagnoses_chinese(data: dict) -> list[tuple[str, str]]:
    """``(English or key, Chinese)`` of every unit of the grader's Chinese (``diagnoses.yml``)."""
    found = []
    for section in (data or {}).values():
        if isinstance(section, dict):
            found += [(key, unit["zh"] if isinstance(unit, dict) else unit) for key, unit in section.items()]
        elif isinstance(section, list):
            found += [(unit.get("en", ""), unit["zh"]) for unit in section if isinstance(unit, dict)]
    return found


def vocabulary_check(root: Path, site: Path, docnames: list[str] | None = None) -> list[str]:
    """What ``make chapters`` names: a form the vocabulary replaces, anywhere in the Chinese course."""
    words = vocabulary(root)
    terms = termbase((root / "glossary.md").read_text())
    texts = chinese_texts(site, docnames) + data_texts(root)
    return [problem for where, text in texts for problem in vocabulary_problems(text, words, where, terms)]


# --------------------------------------------------------------------------------------------
# The grader's Chinese (translations/zh/diagnoses.yml, read by autograder.diagnoses_zh)


def _diagnoses():
    return _course_module("autograder.diagnoses_zh")


def _coverage():
    return _course_module("autograder.diagnoses_coverage")


def diagnoses_problems(root: Path) -> list[str]:
    """The grader's texts without an up-to-date Chinese unit, and units whose English is gone."""
    data = yaml.safe_load((root / DIAGNOSES).read_text(encoding="utf-8")) if (root / DIAGNOSES).is_file() else {}
    return [f"{DIAGNOSES.as_posix()}: {problem}; `{TODO} diagnoses` lists what to translate"
            for problem in _coverage().missing(data=data)]


def diagnoses_todo(root: Path) -> int:
    """Print the grader's texts that need a translation, as units of diagnoses.yml (English, ``en: new``)."""
    data = yaml.safe_load((root / DIAGNOSES).read_text(encoding="utf-8"))
    done = _diagnoses().units(data)
    for key, english in _coverage().declared().items():
        if key not in done or done[key].get("en") != english_hash(english):
            print(f"  {key}:\n    en: new\n    zh: {json.dumps(english, ensure_ascii=False)}")
    return 0


def diagnoses_stamp(root: Path, keys: list[str]) -> int:
    """Record the hash of the current English in the units marked ``en: new`` and in the named ones."""
    path = root / DIAGNOSES
    english = _coverage().declared()
    unknown = [k for k in keys if k not in english]
    if unknown:
        print(f"{DIAGNOSES}: no text {', '.join(unknown)}", file=sys.stderr)
        return 1

    def restamp(mark: re.Match) -> str:
        key = mark["key"]
        if key in english and (mark["hash"] == "new" or key in keys):
            return f"{mark['head']}{english_hash(english[key])}"
        return mark[0]

    path.write_text(re.sub(r"^(?P<head>  (?P<key>[^#\s][^\n]*?):\n    en: )(?P<hash>\S+)$", restamp,
                           path.read_text(encoding="utf-8"), flags=re.M), encoding="utf-8")
    return 0


def grader_problems(root: Path) -> list[str]:
    """The grader's lines without an up-to-date Chinese unit in ``grader.yml``, and units whose English is gone."""
    data = yaml.safe_load((root / GRADER).read_text(encoding="utf-8")) if (root / GRADER).is_file() else {}
    return [f"{GRADER.as_posix()}: {problem}; `{TODO} grader` lists what to translate"
            for problem in _coverage().grader_missing(data)]


def grader_todo(root: Path) -> int:
    """Print what ``grader.yml`` lacks: a case's line without a unit, a unit edited or never stamped, a template
    whose English the grader no longer writes."""
    data = yaml.safe_load((root / GRADER).read_text(encoding="utf-8")) if (root / GRADER).is_file() else {}
    for problem in _coverage().grader_missing(data):
        print(f"  {problem}")
    return 0


def grader_stamp(root: Path, keys: list[str]) -> int:
    """Record the hash of its English (the unit's key) in each unit of ``grader.yml`` marked ``en: new`` and in
    the named ones (by their English)."""
    path = root / GRADER

    def restamp(mark: re.Match) -> str:
        english = json.loads(mark["key"])
        if mark["hash"] == "new" or english in keys:
            return f"{mark['head']}{english_hash(english)}"
        return mark[0]

    path.write_text(re.sub(r'^(?P<head>  (?P<key>"(?:[^"\\]|\\.)*"):\n    en: )(?P<hash>\S+)$', restamp,
                           path.read_text(encoding="utf-8"), flags=re.M), encoding="utf-8")
    return 0


# --------------------------------------------------------------------------------------------
# Markup the reader would see: emphasis that CommonMark does not close next to CJK punctuation

_INVISIBLE = ("code", "pre", "script", "style", "kbd", "samp", "tt", "math")


def literal_markup(html: str) -> list[tuple[str, str]]:
    """``(mark, context)`` of every ``*``, ``**`` or backtick that the visible text of ``html`` shows literally (an
    emphasis CommonMark did not close: ``*“一本书”*：`` opens next to a CJK quotation mark only after a space). Code, preformatted text, scripts and math are not looked at."""
    from html.parser import HTMLParser

    class Visible(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.stack: list[bool] = []  # per open element: is it invisible?
            self.text: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag in ("br", "img", "hr", "input", "meta", "link", "wbr", "source"):
                return
            classes = (dict(attrs).get("class") or "").split()
            self.stack.append(tag in _INVISIBLE or any(c in ("math", "highlight", "output", "cell_output") for c in classes))

        def handle_endtag(self, tag):
            if self.stack and tag not in ("br", "img", "hr", "input", "meta", "link", "wbr", "source"):
                self.stack.pop()

        def handle_data(self, data):
            self.text.append(" " if any(self.stack) else data)

    parser = Visible()
    parser.feed(html)
    text = "".join(parser.text)
    return [(m[0], " ".join(text[max(0, m.start() - 20): m.end() + 20].split())) for m in re.finditer(r"\*+|`+", text)]


def _markdown_renderer():
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    return MarkdownIt("commonmark").enable("table").use(dollarmath_plugin)


def markup_problems(text: str, where: str, renderer=None) -> list[str]:
    """A Chinese unit (Markdown) that would show ``*``, ``**`` or a backtick: rendered as the site renders it."""
    html = (renderer or _markdown_renderer()).render(text)
    return [f"{where}: shows a literal {mark!r} ({context!r}): CommonMark leaves * and ** open next to CJK "
            "punctuation; write <em>...</em> or <strong>...</strong>, or rephrase" for mark, context in literal_markup(html)]


# --------------------------------------------------------------------------------------------
# Generation of zh/


def _pages(root: Path, release_root: Path, only: str | None) -> list[tuple[Page, object]]:
    """Every page of the English book with what it is built from (a notebook, the Markdown text,
    the toc or the config dict); the notebooks under chapters/ come from ``release_root``."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    config = yaml.safe_load((root / "_config.yml").read_text())
    pages: list[tuple[Page, object]] = [(toc_page(toc), toc), (config_page(config), config)]
    for docname in toc_docnames(toc):
        if only is not None and docname.startswith("chapters/") and docname.split("/")[1] != only:
            continue
        base = release_root if docname.startswith("chapters/") else root
        if (base / f"{docname}.ipynb").is_file():
            nb = nbformat.read(base / f"{docname}.ipynb", as_version=4)
            pages.append((notebook_page(docname, nb, root), nb))
        else:
            text = (root / f"{docname}.md").read_text()
            pages.append((markdown_page(docname, text), text))
    return pages


def zh_config(config: dict, shown: dict[str, str]) -> dict:
    """The Chinese site's _config.yml: the English one, in Chinese, one folder down."""
    out = copy.deepcopy(config)
    out.update(title=shown["title"], author=shown["author"])
    out["repository"] = {**config.get("repository", {}), "path_to_book": SITE}
    sphinx = out.setdefault("sphinx", {})
    sphinx["local_extensions"] = {name: f"../{path}" for name, path in sphinx.get("local_extensions", {}).items()}
    sphinx.setdefault("config", {}).update(
        language="zh_CN",
        html_search_options={"dict": SEARCH_DICTIONARY},
        language_links=LANGUAGE_LINK,
    )
    return out


def zh_toc(toc: dict, shown: dict[str, str]) -> dict:
    out = copy.deepcopy(toc)
    for part in out.get("parts", []):
        part["caption"] = shown[f"caption-{slug(part['caption'])}"]
    return out


GENERATED = "# Generated by `make chapters` from the English {name} and translations/zh/: do not edit.\n"


def generate(root: Path, out: Path, release_root: Path | None = None, only: str | None = None) -> list[str]:
    """Write the Chinese course into ``out/zh`` and return the problems found (stale or missing
    translations outside pending pages, translations of cells that no longer exist).

    Untranslated units are written in English under the pending note in any case, so the tree is
    always complete; the problems are what makes ``make chapters`` and ``--check`` fail.
    """
    release_root = release_root or root
    pending = set(settings(root).get("pending") or [])
    messages_pending = set(settings(root).get("messages_pending") or [])
    comments_pending = set(settings(root).get("comments_pending") or [])
    site = out / SITE
    problems: list[str] = []
    pages = _pages(root, release_root, only)
    known = {page.docname for page, _ in pages}
    problems += [f"{SETTINGS}: pending page {name!r} is not in _toc.yml" for name in sorted(pending - known) if only is None]
    if only is None:
        shutil.rmtree(site, ignore_errors=True)
    widget_words = widget_table()
    renderer = _markdown_renderer()
    for page, source in pages:
        translations = read_sidecar(root, page.docname)
        shown, outcome = translate_units(page, translations, page.docname in pending)
        problems += outcome.problems
        if page.docname not in PLAIN:
            sidecar = (TRANSLATIONS / f"{page.docname}.md").as_posix()
            problems += [found for key, text in shown.items() if key in translations and translations[key].text == text
                         and key not in page.comments  # a code cell's comments are code, not Markdown
                         for found in markup_problems(text, f"{sidecar}: cell {key}", renderer)]
        if isinstance(source, nbformat.NotebookNode) and page.docname not in pending:
            problems += contract_problems(page.docname, source)
        messages: dict[str, str] = {}
        if isinstance(source, nbformat.NotebookNode):
            try:
                messages = read_messages(root, page.docname)
                problems += message_problems(source, page.docname, messages, page.docname in messages_pending)
            except ValueError as unreadable:  # the page is still written, with English messages
                problems.append(str(unreadable))
        if page.docname in pending and not outcome.pending and not outcome.problems:
            problems.append(f"{SETTINGS}: {page.docname!r} is fully translated: take it off the pending list")
        if page.docname in comments_pending and not set(outcome.pending) & page.comments:
            problems.append(f"{SETTINGS}: the code comments of {page.docname!r} are all translated: take it off "
                            "comments_pending")
        target = site / page.docname
        target.parent.mkdir(parents=True, exist_ok=True)
        if page.docname == "_toc":
            target.with_suffix(".yml").write_text(GENERATED.format(name="_toc.yml") + _dump(zh_toc(source, shown)))
        elif page.docname == "_config":
            target.with_suffix(".yml").write_text(GENERATED.format(name="_config.yml") + _dump(zh_config(source, shown)))
        elif isinstance(source, nbformat.NotebookNode):
            missing: list[str] = []
            target.with_suffix(".ipynb").write_text(
                nbformat.writes(translate_notebook(source, shown, messages, widget_words, missing)) + "\n")
            problems += widget_problems(page.docname, missing)
        else:
            target.with_suffix(".md").write_text(translate_text(page, shown))
    if only is None:
        problems += stale_widget_entries(widget_words)
    problems += vocabulary_check(root, site, None if only is None else [page.docname for page, _ in pages])
    if only is None:
        problems += diagnoses_problems(root)
        problems += grader_problems(root)
    glossary = (root / "glossary.md").read_text()
    words = sorted({t.chinese for t in termbase(glossary) if " " not in t.chinese})
    (site / SEARCH_DICTIONARY).write_text("".join(f"{w}\n" for w in words))
    figures = root / "figures"
    if figures.is_dir():
        shutil.copytree(figures, site / "figures", dirs_exist_ok=True)
    return problems


def _dump(data: dict) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=100)


# --------------------------------------------------------------------------------------------
# Building the Chinese site


def build_site(html: Path, root: Path = REPO, fresh: bool = False) -> str:
    """Build ``zh/`` with Jupyter Book and place it at ``html/zh``; return the build log.

    Raises when the build fails or warns (the English build's ``-W`` rule).
    """
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE", "PYTEST_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    work = root / "_build" / SITE
    cmd = [str(bin_dir / "jupyter-book"), "build", str(root / SITE), "--path-output", str(work), "-W", "--keep-going"]
    done = subprocess.run([*cmd, *(["--all"] if fresh else [])], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    if done.returncode != 0 or "WARNING" in log:
        raise RuntimeError(f"the Chinese site did not build cleanly:\n{log[-5000:]}")
    shown = site_markup_problems(work / "_build" / "html")
    if shown:
        raise RuntimeError("the Chinese site shows Markdown's markup as text:\n" + "\n".join(shown))
    shutil.rmtree(html / SITE, ignore_errors=True)
    shutil.copytree(work / "_build" / "html", html / SITE)
    theme_in_chinese(html / SITE, settings(root).get("theme") or {})
    return log


def theme_in_chinese(html: Path, words: dict[str, str]) -> None:
    """Put the Chinese of the theme's own words (``theme`` in ``site.yml``) in their place on every built page."""
    for page in html.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        changed = text
        for english, chinese in words.items():
            changed = changed.replace(english, chinese)
        if changed != text:
            page.write_text(changed, encoding="utf-8")


def site_markup_problems(html: Path) -> list[str]:
    """Every built page of the Chinese site whose visible text shows ``*``, ``**`` or a backtick."""
    found = []
    for page in sorted(html.rglob("*.html")):
        if page.name in ("search.html", "genindex.html") or "_static" in page.parts:
            continue
        text = page.read_text(encoding="utf-8")
        main = re.search(r"<main\b.*?</main>", text, re.S)  # the page's content, not the theme around it
        found += [f"{page.relative_to(html).as_posix()}: shows a literal {mark!r} ({context!r})"
                  for mark, context in literal_markup(main[0] if main else text)]
    return found


# --------------------------------------------------------------------------------------------
# Commands


def status(root: Path) -> int:
    """Print, per page, how much is translated and every problem; return 1 if there is any."""
    pending = set(settings(root).get("pending") or [])
    terms = termbase((root / "glossary.md").read_text())
    avoided = other_renderings(translate_text(*_glossary_shown(root)))
    findings = 0
    for page, _ in _pages(root, root, None):
        translations = read_sidecar(root, page.docname)
        _, outcome = translate_units(page, translations, page.docname in pending)
        units = page.units()
        print(f"{page.docname}: {outcome.translated}/{len(units)} translated" + (" (pending)" if page.docname in pending else ""))
        lines = list(outcome.problems)
        for key, english in units.items():
            done = translations.get(key)
            if done is not None and done.source_hash == english_hash(english):
                where = f"{page.docname}: cell {key}"
                lines += term_problems(english, done.text, terms, where)
                if page.docname != "glossary":
                    lines += rendering_problems(done.text, english, avoided, terms, where)
        for line in lines:
            print(f"  {line}")
        findings += len(lines)
    found = vocabulary_check(root, root / SITE)
    print(f"vocabulary ({VOCABULARY.as_posix()}): {len(found)} other forms")
    for line in found:
        print(f"  {line}")
    return 1 if findings or found else 0


def _glossary_shown(root: Path) -> tuple[Page, dict[str, str]]:
    page = markdown_page("glossary", (root / "glossary.md").read_text())
    shown, _ = translate_units(page, read_sidecar(root, "glossary"), True)
    return page, shown


def todo(root: Path, docname: str) -> int:
    """Print the units of a page that need a translation, as sidecar blocks to fill in."""
    translations = read_sidecar(root, docname)
    pages = {page.docname: (page, source) for page, source in _pages(root, root, None)}
    if docname not in pages:
        print(f"no page {docname!r} in _toc.yml", file=sys.stderr)
        return 1
    page, source = pages[docname]
    for key, english in page.units().items():
        done = translations.get(key)
        if done is None or done.source_hash != english_hash(english):
            print(sidecar_block(key, "new", english))
    if isinstance(source, nbformat.NotebookNode):
        messages = read_messages(root, docname)
        missing = [m for cell in source.cells if cell.cell_type == "code" and not graded(cell)
                   for m in translate_messages(cell.source, messages)[1]]
        if missing:  # entries for the page's .messages.yml, each still English
            print(f"# {messages_path(root, docname).relative_to(root)}\n"
                  + yaml.safe_dump({m: m for m in missing}, allow_unicode=True, sort_keys=False, width=1000).rstrip())
    return 0


def stamp(root: Path, docname: str, keys: list[str]) -> int:
    """Record the current English hash in the blocks marked ``new`` and in the named blocks."""
    path = sidecar_path(root, docname)
    pages = {page.docname: page for page, _ in _pages(root, root, None)}
    units = pages[docname].units()
    unknown = [k for k in [*keys, *read_sidecar(root, docname)] if k not in units]
    if unknown:
        print(f"{path}: no English cell {', '.join(unknown)}", file=sys.stderr)
        return 1

    def restamp(mark: re.Match) -> str:
        if mark["hash"] == "new" or mark["key"] in keys:
            return f"<!-- cell {mark['key']} en={english_hash(units[mark['key']])} -->"
        return mark[0]

    path.write_text(_MARKER.sub(restamp, path.read_text()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", help="translated, stale and missing units per page, and termbase findings")
    todo_cmd = commands.add_parser("todo", help="print a page's untranslated units as sidecar blocks")
    todo_cmd.add_argument("page", help="a docname of _toc.yml, or _toc / _config, or diagnoses / grader (the grader's Chinese)")
    stamp_cmd = commands.add_parser("stamp", help="record the English hash of new (or named) blocks")
    stamp_cmd.add_argument("page")
    stamp_cmd.add_argument("keys", nargs="*")
    build_cmd = commands.add_parser("build", help="build the Chinese site into HTML_DIR/zh")
    build_cmd.add_argument("html", type=Path)
    build_cmd.add_argument("--all", action="store_true", help="rebuild every page")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command == "status":
        return status(root)
    if args.command == "todo":
        if args.page == "grader":
            return grader_todo(root)
        return diagnoses_todo(root) if args.page == "diagnoses" else todo(root, args.page)
    if args.command == "stamp":
        if args.page == "grader":
            return grader_stamp(root, args.keys)
        return diagnoses_stamp(root, args.keys) if args.page == "diagnoses" else stamp(root, args.page, args.keys)
    print(build_site(args.html.resolve(), root, fresh=args.all)[-2000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
