"""The grader's feedback in Chinese, for a notebook that records language zh: every line the grader writes,
rendered from a catalogue of templates kept as data (``translations/zh/grader.yml``).

The grader itself speaks English, and its reports (``results.Report``) stay English inside: the class report,
the scores per exercise and the self-tests read them. Only where the feedback of one submission is rendered
(``results.to_gradescope`` and ``results.table``) is it put into the notebook's language, line by line:

- a fenced code block (what a student's code raised or printed, a traceback) is kept byte for byte;
- every other line is looked up whole among the exact units (a case's title or what it checks, as the chapter's
  grading module declares it), then matched against each template, the longest first. A template is an
  English line with named fields, ``"{where}: first mismatch at index {index}"``; its Chinese has the same
  fields, ``"{where}：第一处不一致在下标 {index}"``. A field captures what the line holds there (numbers,
  shapes, code spans, names) and is copied unchanged, so every number stays byte-exact; a field written
  ``{name:text}`` holds English words of the grader's (a case's title, a nested sentence) and is translated
  in turn, the same way; a plain field that would capture English words does not fit (another template may),
  and ``{name:raw}`` is copied whatever it holds (an exception's own message, a Python or torch text);
- a list item's ``- `` and a heading's ``## `` are kept around the line they carry;
- a line that no unit matches stays English, as it was written: a grader message added or reworded
  since the catalogue was translated is shown in English until its unit is written (the coverage check,
  ``autograder.diagnoses_coverage.grader_missing``, names it).

Each unit is stamped, like every unit of ``translations/zh/``, with the hash of the English it translates
(``en:``); a unit whose English key was edited after it was stamped is not used until it is stamped again
(``scripts/translations.py stamp grader``). This module imports nothing of the grader, so any part of it may
import this one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from autograder.diagnoses_zh import english_hash

PATH = Path(__file__).resolve().parents[1] / "translations" / "zh" / "grader.yml"
"""The catalogue (in a copy of the grader without the course's translations, feedback stays English)."""

FIELD = re.compile(r"\{(\w+)(?::(text|raw))?\}")
"""A template's field: ``{name}`` is copied as it is, ``{name:text}`` is translated in turn, ``{name:raw}`` is copied
whatever it holds."""

_FENCE = re.compile(r"^(`{3,})")
_CODE = re.compile(r"(`+).*?\1")
_PROSE = re.compile(r"[A-Za-z]{2,}[,;:]?\s+[A-Za-z]{2,}")  # two words in a row: English, not a name
_PREFIX = re.compile(r"^(\s*(?:[-*] |#{1,6} |\d+\. )?)(.*?)(\s*)$", re.S)
_DEPTH = 6  # nested text fields followed at most this deep (a title inside a check inside a line)


def _prose(text: str) -> bool:
    """Whether ``text`` holds English words outside its code spans (two in a row), not only names and numbers."""
    return bool(_PROSE.search(_CODE.sub("", text)))


def _read(path: Path = PATH) -> dict:
    try:
        import yaml

        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (ImportError, OSError):
        return {}


@dataclass(frozen=True)
class Template:
    """One English line with fields, its regular expression and its Chinese."""

    english: str
    chinese: str
    pattern: re.Pattern
    kinds: dict[str, str]  # each field's kind: "" (copied: no English words), "text" (translated), "raw" (copied)

    @classmethod
    def of(cls, english: str, chinese: str) -> Template:
        parts, kinds, at = [], {}, 0
        for field in FIELD.finditer(english):
            parts.append(re.escape(english[at:field.start()]))
            parts.append(f"(?P<{field[1]}>.+?)")
            kinds[field[1]] = field[2] or ""
            at = field.end()
        parts.append(re.escape(english[at:]))
        return cls(english, chinese, re.compile("".join(parts), re.S), kinds)

    @property
    def literal(self) -> int:
        """How many characters of the English are not fields (a longer template is tried first)."""
        return len(FIELD.sub("", self.english))


def fields(text: str) -> list[str]:
    """The names of the fields of a template (English or Chinese), in order."""
    return [f[1] for f in FIELD.finditer(text)]


class Catalogue:
    """The Chinese of the grader's lines: exact units (``cases``: a case's title or what it checks) and templates
    (``lines``), from the catalogue's data (``grader.yml`` as read). A unit whose stamp is not the hash of its
    English is left out: its line stays English until it is translated again and stamped."""

    def __init__(self, data: dict | None = None):
        data = _read() if data is None else data
        self.exact: dict[str, str] = {}
        templates = []
        for section in ("cases", "lines"):
            for english, unit in (data.get(section) or {}).items():
                if not isinstance(unit, dict) or unit.get("en") != english_hash(english) or not unit.get("zh"):
                    continue
                if fields(english):
                    templates.append(Template.of(english, unit["zh"]))
                else:
                    self.exact[english] = unit["zh"]
        self.templates = sorted(templates, key=lambda t: -t.literal)

    def line(self, text: str, depth: int = 0, used: set[str] | None = None) -> str | None:
        """The Chinese of one line of the grader's, or ``None`` when no unit matches it (``used`` collects the
        English of the units it took)."""
        if text in self.exact:
            if used is not None:
                used.add(text)
            return self.exact[text]
        if depth >= _DEPTH or not text:
            return None
        for template in self.templates:
            found = template.pattern.fullmatch(text)
            if found is None:
                continue
            values = {}
            for name, value in found.groupdict().items():
                kind = template.kinds[name]
                if kind == "text":
                    chinese = self.line(value, depth + 1, used)
                    if chinese is None and _prose(value):
                        break  # English words no unit translates: not this template
                    value = value if chinese is None else chinese  # a name (`output`, `p_attn`) stays as it is
                elif kind == "" and _prose(value):
                    break  # a field that holds no words holds words: the template does not fit this line
                values[name] = value
            else:
                if used is not None:
                    used.add(template.english)
                return FIELD.sub(lambda f: values[f[1]], template.chinese)
        return None

    def render(self, text: str) -> str:
        """``text`` (the grader's Markdown) in Chinese, line by line; code blocks and unmatched lines unchanged."""
        out, fence = [], None
        for line in text.split("\n"):
            opening = _FENCE.match(line.lstrip())
            if fence is not None:
                if line.strip() == fence:
                    fence = None
                out.append(line)
                continue
            if opening:
                fence = opening[1]
                out.append(line)
                continue
            head, body, tail = _PREFIX.fullmatch(line).groups()
            chinese = self.line(body) if body else None
            out.append(line if chinese is None else f"{head}{chinese}{tail}")
        return "\n".join(out)


_CATALOGUE: Catalogue | None = None


def catalogue() -> Catalogue:
    """The catalogue of ``translations/zh/grader.yml``, read once."""
    global _CATALOGUE
    if _CATALOGUE is None:
        _CATALOGUE = Catalogue()
    return _CATALOGUE


def render(text: str, language: str = "en") -> str:
    """``text``, a piece of the grader's feedback, in ``language`` ("zh": Chinese where the catalogue has it)."""
    return catalogue().render(text) if language == "zh" else text


def units(data: dict | None = None) -> dict[str, dict]:
    """Every unit of the catalogue (or of ``data``, the file as read), by its English."""
    data = _read() if data is None else data
    return {**(data.get("cases") or {}), **(data.get("lines") or {})}
