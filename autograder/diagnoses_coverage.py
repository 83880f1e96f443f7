"""Whether every text the grader can show in Chinese has its unit in ``translations/zh/diagnoses.yml``: the check
``make chapters`` and the tests run (``missing``), and the list of those texts (``declared``).

A tool, not part of grading: it reads the grading modules, which the loader ``autograder.diagnoses_zh`` must not
import (they import it).
"""

from __future__ import annotations

from autograder.capstone import SAY
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
