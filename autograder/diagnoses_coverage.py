"""Whether every text the grader can show in Chinese has its unit: the diagnoses in ``translations/zh/diagnoses.yml``
(``missing``, over the texts ``declared`` lists) and every other line in ``translations/zh/grader.yml``
(``grader_missing``, over the cases' lines ``case_texts`` lists and the grader's own string literals); the checks
``make chapters`` and the tests run.

A tool, not part of grading: it reads the grading modules, which the loader ``autograder.diagnoses_zh`` must not
import (they import it).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from autograder import feedback_zh
from autograder.capstone import SAY
from autograder.cases import graded_cases
from autograder.diagnoses_zh import english_hash, units
from autograder.exercises.ch12_capstone import COMPONENTS
from autograder.registry import REGISTRY


def declared() -> dict[str, str]:
    """Unit key -> the English it translates, for every text the grader can show in Chinese: each declared
    mistake (``"ch01.embeddings missing_scale"``), each capstone sentence (``"say greedy"``) and each component's
    name, description and hint (``"masks hint"``; a name that is code, such as ``make_model``, needs none).
    Read from the grading modules on each call."""
    english = {f"{e.id} {name}": m.message for e in REGISTRY for name, m in e.mistakes.items()}
    english |= {f"say {key}": text for key, text in SAY.items()}
    for c in COMPONENTS:
        english |= {f"{c[0]} description": c[1], f"{c[0]} hint": c[4]}
        if not ("_" in c[0] or any(ch.isupper() for ch in c[0])):  # `make_model`, `LayerNorm`: code, no Chinese
            english[f"{c[0]} name"] = c[0]
    return english



def missing(english: dict[str, str] | None = None, data: dict | None = None) -> list[str]:
    """What keeps a text of the grader from its Chinese: ``"key: no translation"``, ``"key: the English changed
    since it was translated"`` and ``"key: no such text any more"``; ``english`` is ``declared()`` by default."""
    english = declared() if english is None else english
    found = units(data)
    problems = []
    for key, text in english.items():
        unit = found.get(key)
        if unit is None:
            problems.append(f"{key}: no translation")
        elif unit.get("en") != english_hash(text):
            problems.append(f"{key}: the English changed since it was translated"
                            if unit.get("en") != "new" else f"{key}: translated but never stamped")
    problems += [f"{key}: no such text any more" for key in found if key not in english]
    return problems


# --------------------------------------------------------------------------------------------
# The rest of the grader's Chinese: translations/zh/grader.yml, read by autograder.feedback_zh

GRADER_SOURCES = (*sorted(Path(__file__).resolve().parent.rglob("*.py")),
                  Path(__file__).resolve().parents[1] / "tfm_solution" / "my_chapters.py")
"""The grader's modules, and the chapters' loader it shares with the capstone notebook, whose string literals hold
the English of every template of ``grader.yml``."""
FIELD_NAMES = re.compile(r"\{(\w+)\}")
"""A field as the Chinese of a template writes it (without ``:text``)."""
MIN_PIECE = 6
"""A template's English between two fields is found in the grader's string literals whole, or in pieces that are
(a sentence the grader writes from several literals, ``f"{missing}: an import..."``): each at least this many
characters long, but punctuation and the chunk's ends (the " s" of ``"{seconds} s"``, the "a " of ``"a {type}"``).
A heuristic: it names a template whose words the grader no longer writes, not one whose words it writes
elsewhere."""


def case_texts() -> dict[str, str]:
    """Every case's line name and "Checked:" line as the grader writes them (seed 0: titles and checks do not
    depend on the seed), by where they come from."""
    texts = {}
    for exercise in REGISTRY:
        for number, case in enumerate(graded_cases(exercise, 0)):
            label = "structure" if case.structure else "public" if case.public else "hidden"
            texts[f"{exercise.id} case {number} title"] = f"{exercise.id} {label}: {case.title}"
            texts[f"{exercise.id} case {number} checks"] = f"Checked: {case.checks}."
    return texts


def _literals() -> str:
    """Every string literal of the grader's modules (an f-string's literal parts apart), one per line."""
    found = []
    for path in GRADER_SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
    return "\x00".join(found)


def _found(chunk: str, literals: str) -> bool:
    """Whether ``chunk`` is in the literals whole, or made of pieces of at least ``MIN_PIECE`` characters that are."""
    if chunk in literals:
        return True
    at = 0
    while at < len(chunk):
        low, high = at, len(chunk)  # the longest piece from ``at`` found in the literals (found is monotone)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if chunk[at:middle] in literals else (low, middle - 1)
        piece = chunk[at:low]
        short = len(piece) < MIN_PIECE and re.search("[A-Za-z]", piece)
        if not piece or (short and 0 < at and low < len(chunk)):
            return False  # a short piece with letters inside a chunk: words found by chance, not the grader's
        at = low
    return True


def grader_missing(data: dict | None = None) -> list[str]:
    """What keeps a line of the grader from its Chinese in ``grader.yml`` (``data``: the file as read): a case's
    line no unit translates, a unit edited since it was stamped (or never stamped), a template whose Chinese
    does not use exactly its fields, a template whose English the grader's modules no longer hold, and a case
    unit no case uses any more."""
    data = feedback_zh._read() if data is None else data
    problems = []
    for section in ("lines", "cases"):
        for english, unit in (data.get(section) or {}).items():
            stamp = unit.get("en") if isinstance(unit, dict) else None
            if stamp == "new":
                problems.append(f"{section} {english!r}: translated but never stamped")
            elif stamp != english_hash(english):
                problems.append(f"{section} {english!r}: the English changed since it was translated")
            elif sorted(feedback_zh.fields(english)) != sorted(FIELD_NAMES.findall(str(unit.get("zh", "")))):
                problems.append(f"{section} {english!r}: the Chinese does not use exactly the English's fields")
    literals = _literals()
    for english in data.get("lines") or {}:
        chunks = [c for c in feedback_zh.FIELD.split(english)[::3] if c.strip()]
        if not all(_found(c, literals) for c in chunks):
            problems.append(f"lines {english!r}: no such text in the grader any more")
    catalogue = feedback_zh.Catalogue(data)
    used: set[str] = set()
    for where, text in case_texts().items():
        if catalogue.line(text, used=used) is None:
            problems.append(f"{where} {text!r}: no translation")
    problems += [f"cases {english!r}: no such text any more" for english in data.get("cases") or {}
                 if english not in used]
    return problems
