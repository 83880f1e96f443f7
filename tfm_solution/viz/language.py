"""The language of the widgets' labels and readouts: English, or the language of the notebook.

The code cells of the English and the Chinese course are the same, so a widget cannot be told
its language by the code that builds it. It finds it at run time instead, in this order:

1. ``set_language("zh")`` (``None`` clears it);
2. the environment variable ``TFM_LANGUAGE``;
3. the running notebook's own record, ``{"course": {"language": "zh"}}`` in its metadata (``make
   chapters`` writes it into every Chinese notebook), read from the notebook file whose path the
   front end gives the kernel (``__session__`` in Jupyter, ``__vsc_ipynb_file__`` in VS Code, or the
   ``JPY_SESSION_NAME`` environment variable);
4. English.

The widgets are built in English and then translated as rendered strings, through one table per
language (``tfm_solution/assets/widgets/<language>.json``): the same function translates a live
widget tree (``localize``) and the widget state saved in a notebook (``translate_state``, which
``make chapters`` applies to the Chinese notebooks), so a page and a running kernel show the same
words. The figures' own text (matplotlib PNGs) stays English.

The table maps an English string to its translation. ``{}`` in an English key stands for a field of
any text, ``{#}`` for a number: ``"epoch {#}"`` -> ``"第 {} 个周期"``; a field is itself translated
when the table knows it (unless it is code, in backticks), and the translation (a ``str.format`` string) may reorder fields
(``{1} … {0}``) or drop them. HTML is translated
one text node at a time (the text between two tags), so tags and styles never reach the table.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import ipywidgets as widgets

ENGLISH = "en"
ENV = "TFM_LANGUAGE"
TABLES = Path(__file__).resolve().parents[1] / "assets" / "widgets"
#: The attributes of a widget's state that hold text a reader sees: one string, or a list of them.
TEXT_TRAITS = ("description", "tooltip", "placeholder")
LIST_TRAITS = ("_options_labels", "tooltips", "titles")
#: Widgets whose ``value`` is text shown to the reader (HTML where the name says so).
TEXT_VALUE_MODELS = {"HTMLModel": True, "HTMLMathModel": True, "LabelModel": False}
_LATIN = re.compile(r"[A-Za-z]")
_TAG = re.compile(r"(<[^>]*>)")
_CODE = re.compile(r"`([^`<>]+)`")

#: A field of a pattern: ``{}`` any text, ``{#}`` a number (``1,024``, ``-1e9``, ``41.2%``).
_FIELD = re.compile(r"\{#?\}")
_NUMBER = r"[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?"

_override: str | None = None


def _compile(key: str) -> re.Pattern:
    """The regular expression of a pattern key: its fixed text literally, each field a group."""
    fixed = [re.escape(part) for part in _FIELD.split(key)]
    fields = [f"({_NUMBER})" if field == "{#}" else "(.+?)" for field in _FIELD.findall(key)]
    return re.compile("".join(part for pair in zip(fixed, [*fields, ""]) for part in pair), re.S)


def set_language(language: str | None) -> None:
    """Choose the widgets' language for this kernel (``"en"``, ``"zh"``); ``None`` goes back to detection."""
    global _override
    if language is not None and language != ENGLISH and not (TABLES / f"{language}.json").is_file():
        raise ValueError(f"no widget translations for {language!r}: there is no {TABLES.name}/{language}.json")
    _override = language


def notebook_language(path: str | os.PathLike) -> str:
    """The language a notebook file records in its metadata (``course.language``), English if none."""
    try:
        return _recorded_language(str(path), Path(path).stat().st_mtime_ns)
    except OSError:
        return ENGLISH


@lru_cache(maxsize=16)
def _recorded_language(path: str, mtime_ns: int) -> str:
    """Read once per version of the file: a notebook with its figures is megabytes of JSON, and every
    widget asks (``mtime_ns`` is part of the key, so a saved change is seen)."""
    try:
        metadata = json.loads(Path(path).read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return ENGLISH
    course = metadata.get("course")
    return course.get("language", ENGLISH) if isinstance(course, dict) else ENGLISH


def _candidates(name: str) -> Iterator[Path]:
    """Where the notebook ``name`` may be: as given, from the kernel's folder (Jupyter starts the kernel
    in the notebook's folder and may give the path from its own root)."""
    path = Path(name)
    yield path
    yield Path.cwd() / path.name


def notebook_path() -> Path | None:
    """The file of the notebook this kernel runs, if the front end said which."""
    names = []
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        names += [shell.user_ns.get(key) for key in ("__vsc_ipynb_file__", "__session__")]
    names.append(os.environ.get("JPY_SESSION_NAME"))
    for name in names:
        if isinstance(name, str) and name.endswith(".ipynb"):
            found = next((p for p in _candidates(name) if p.is_file()), None)
            if found is not None:
                return found
    return None


def said(text: str) -> str:
    """``text``, a line the package prints, in the language the notebook speaks (English where the table has none)."""
    language = current_language()
    return text if language == ENGLISH else table(language).text(text)


def current_language() -> str:
    """The language the widgets speak now (see the module's docstring for the order of the sources)."""
    if _override is not None:
        return _override
    if os.environ.get(ENV):
        language = os.environ[ENV]
    else:
        path = notebook_path()
        language = notebook_language(path) if path is not None else ENGLISH
    # a language without a table (a typo in the variable, another course's notebook) is read as English
    return language if language == ENGLISH or (TABLES / f"{language}.json").is_file() else ENGLISH


@dataclass
class Table:
    """English -> translation, exact strings and ``{}`` patterns; ``used`` collects the keys that matched."""

    strings: dict[str, str]
    neutral: list[re.Pattern] = field(default_factory=list)
    used: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        patterns = [key for key in self.strings if _FIELD.search(key)]
        # The most specific pattern first: the one with the most fixed text.
        patterns.sort(key=lambda key: -len(_FIELD.sub("", key)))
        self._patterns = [(_compile(key), key) for key in patterns]
        # A field in backticks is code (a function's name): it is never translated.
        self._code = {key: [key[m.start() - 1 : m.start()] == "`" for m in _FIELD.finditer(key)] for key in patterns}

    def lookup(self, text: str) -> str | None:
        """The translation of ``text`` (edge spaces kept), or ``None`` when the table has none."""
        core = text.strip()
        if not core:
            return None
        found = self._translate(core)
        if found is None:
            return None
        start = text.index(core)
        return text[:start] + found + text[start + len(core) :]

    def _translate(self, core: str) -> str | None:
        if core in self.strings:
            self.used.add(core)
            return self.strings[core]
        for pattern, key in self._patterns:
            match = pattern.fullmatch(core)
            if match:
                self.used.add(key)
                fields = [value if code else self.lookup(value) or value
                          for value, code in zip(match.groups(), self._code[key], strict=True)]
                return self.strings[key].format(*fields)
        return None

    def is_neutral(self, text: str) -> bool:
        """Text that reads the same in every language: no Latin letter, or a pattern the table lists
        (symbols, tensor names, tokens and sentences of the data)."""
        core = text.strip()
        return not _LATIN.search(core) or any(p.fullmatch(core) for p in self.neutral)

    def text(self, text: str, missing: list[str] | None = None) -> str:
        """``text`` translated; the English is kept (and added to ``missing``) when the table has none."""
        found = self.lookup(text)
        if found is None and missing is not None and not self.is_neutral(text):
            missing.append(text.strip())
        return text if found is None else found

    def html(self, value: str, missing: list[str] | None = None) -> str:
        """An HTML string with each text node translated but a name set as code; tags, attributes and entities stay
        as they are."""
        parts = _TAG.split(value)
        for i in range(0, len(parts), 2):  # even positions are the text between tags
            if i and parts[i - 1].lower() == "<code>" and re.fullmatch(r"[\w.]+", parts[i]):
                continue  # `attention` is the function, never the word
            plain = html.unescape(parts[i])
            found = self.text(plain, missing)
            if found != plain:  # a name in backticks is set as code, as the page's own text sets it
                parts[i] = _CODE.sub(r"<code>\1</code>", html.escape(found, quote=False))
        return "".join(parts)


def read_table(language: str) -> Table:
    """The translation table of ``language``, read afresh (``strings`` and the ``live`` ones, which only a
    running kernel shows, such as a training monitor's first line)."""
    data = json.loads((TABLES / f"{language}.json").read_text(encoding="utf-8"))
    return Table({**data["strings"], **data.get("live", {})}, [re.compile(p) for p in data.get("neutral", [])])


#: The table of a language, read once per kernel.
table = lru_cache(maxsize=None)(read_table)


def translate_state(state: dict, words: Table, missing: list[str] | None = None) -> dict:
    """One widget model's saved state (the ``state`` dict of a model in a notebook's widget state) with its
    text translated; its ``_model_name`` decides whether ``value`` is text. The input is not changed."""
    out = dict(state)
    for name in TEXT_TRAITS:
        if isinstance(out.get(name), str):
            out[name] = words.text(out[name], missing)
    for name in LIST_TRAITS:  # lists in a saved state, tuples on a live widget
        if isinstance(out.get(name), list | tuple):
            out[name] = type(out[name])(words.text(item, missing) if isinstance(item, str) else item for item in out[name])
    is_html = TEXT_VALUE_MODELS.get(out.get("_model_name", ""))
    if is_html is not None and isinstance(out.get("value"), str):
        out["value"] = words.html(out["value"], missing) if is_html else words.text(out["value"], missing)
    return out


def _localize_one(widget: widgets.Widget, language: str) -> None:
    """Translate the text of one widget."""
    traits = widget.traits()
    names = [n for n in (*TEXT_TRAITS, *LIST_TRAITS, "value") if n in traits and not traits[n].read_only]
    state = translate_state({"_model_name": widget._model_name, **{n: getattr(widget, n) for n in names}},
                            table(language))
    for name in names:
        if state[name] != getattr(widget, name):
            setattr(widget, name, state[name])
    if "_options_labels" in widget.trait_names() and widget.options:
        labels = [table(language).text(label) for label in widget._options_labels]
        if labels != list(widget._options_labels):
            index = widget.index  # setting the options moves the selection to the first one
            widget.options = list(zip(labels, widget._options_values, strict=True))
            widget.index = index


def localize(widget: widgets.Widget) -> widgets.Widget:
    """Translate a widget tree into the current language, and keep it translated: later readouts,
    and children added later (frames drawn on demand), are translated as they come. English is a no-op.

    Returns the widget, so that a builder can end with ``return localize(box)``.
    """
    language = current_language()
    if language == ENGLISH:
        return widget
    _localize_tree(widget, language)
    return widget


def _localize_tree(widget: widgets.Widget, language: str) -> None:
    if getattr(widget, "_tfm_language", None) == language:
        return
    widget._tfm_language = language
    _localize_one(widget, language)
    if widget._model_name in TEXT_VALUE_MODELS:  # a readout that changes (a training monitor's chart)
        widget.observe(lambda change: _localize_one(change["owner"], language), names="value")
    if widget.has_trait("children"):
        for child in widget.children:
            _localize_tree(child, language)
        widget.observe(lambda change: [_localize_tree(c, language) for c in change["new"]], names="children")
