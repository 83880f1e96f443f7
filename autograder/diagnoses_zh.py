"""The grader's diagnoses in Chinese, for a notebook that records language zh: a small loader of
``translations/zh/diagnoses.yml``, where the Chinese lives beside the course's other translations.

A chapter's grading module declares its classic wrong answers in English (``Mistake.message``); the file has the
Chinese of each, stamped with the hash of the English it translates, as every unit of ``translations/zh/`` is.
A notebook of the Chinese course records ``{"course": {"language": "zh"}}`` in its metadata (``make chapters``
writes it); the grader then names a recognised mistake in Chinese (``diagnosis``), and the rest of its feedback
is rendered in Chinese from ``translations/zh/grader.yml`` (``autograder.feedback_zh``). The capstone's diagnosis of a model
that does not learn is there too: its sentences (``CAPSTONE_SAY``, by their key in ``capstone.SAY``) and each
component's name, description and hint (``CAPSTONE_ZH``).

A Chinese text is looked up by the hash of the English it is asked for, so a message reworded in a grading module
finds no Chinese until its unit is translated again and stamped: the grader then shows the English line, and
``diagnoses_coverage.missing`` names the unit. This module imports nothing of the grader: what the grading modules
declare is gathered by ``autograder.diagnoses_coverage``, the check that ``make chapters`` and the tests run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path

LANGUAGES = ("en", "zh")
"""The languages a notebook may record; any other value is graded as English."""

PATH = Path(__file__).resolve().parents[1] / "translations" / "zh" / "diagnoses.yml"
"""The Chinese of the grader (in a copy of the grader without the course's translations, diagnoses stay English)."""


def english_hash(text: str) -> str:
    """The stamp of a unit: the one ``scripts/translations.py`` gives every translated unit."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(path: Path = PATH) -> dict:
    try:
        import yaml

        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (ImportError, OSError):
        return {}


class ByEnglish(Mapping):
    """Units ``{key: {"en": hash, "zh": text}}`` looked up by the English they translate (``ZH[message]``)."""

    def __init__(self, units: dict):
        self.units = units
        self._by_hash = {unit["en"]: unit["zh"] for unit in units.values()}

    def __getitem__(self, english: str) -> str:
        return self._by_hash[english_hash(english)]

    def __iter__(self) -> Iterator[str]:  # the stamps: the English itself lives in the grading modules
        return iter(self._by_hash)

    def __len__(self) -> int:
        return len(self._by_hash)

    def __contains__(self, english: object) -> bool:
        return isinstance(english, str) and english_hash(english) in self._by_hash


_DATA = _read()
_CAPSTONE = _DATA.get("capstone") or {}

#: The Chinese of every declared mistake's message, by its English.
ZH = ByEnglish(_DATA.get("mistakes") or {})
#: The capstone diagnosis's sentences, by their key in ``capstone.SAY`` (the same ``{...}`` fields).
CAPSTONE_SAY: dict[str, str] = {key[4:]: unit["zh"] for key, unit in _CAPSTONE.items() if key.startswith("say ")}
#: The components' names, descriptions and hints, by their English (a name that is code stays as it is).
CAPSTONE_ZH = ByEnglish({key: unit for key, unit in _CAPSTONE.items() if not key.startswith("say ")})


def diagnosis(name: str, message: str, language: str = "en") -> str:
    """The feedback line naming the declared mistake ``name``: in Chinese for "zh" when ``ZH`` has its message."""
    if language == "zh" and message in ZH:
        return f"**诊断：{name}**：{ZH[message]}。"
    return f"**Diagnosis: {name}**: {message}."


def units(data: dict | None = None) -> dict[str, dict]:
    """Every unit of the file (or of ``data``, the file as read), by key."""
    data = _DATA if data is None else data
    return {**(data.get("mistakes") or {}), **(data.get("capstone") or {})}
