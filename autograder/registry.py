"""The exercise registry: every graded exercise of the course, collected from the chapters.

Each chapter's grading lives in its own module ``autograder/exercises/chNN_slug.py`` (see
``autograder/exercises/__init__.py``); this module finds them all and lists their
exercises in chapter order. Generation (``make chapters``), the grader, the tests and the
README's exercise table read ``REGISTRY``; nothing else repeats it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from autograder import exercises
from autograder.exercises.shared import Exercise

__all__ = ["REGISTRY", "Exercise", "by_chapter", "by_id", "chapters", "chapter_modules"]

_CHAPTER_MODULE = re.compile(r"ch(\d\d)_\w+")


def chapter_modules() -> list[str]:
    """Names of the chapter grading modules under ``autograder/exercises``, in chapter order."""
    found = [m.name for m in pkgutil.iter_modules(exercises.__path__) if _CHAPTER_MODULE.fullmatch(m.name)]
    return sorted(found, key=lambda name: int(_CHAPTER_MODULE.fullmatch(name).group(1)))


def _collect() -> tuple[Exercise, ...]:
    """Every chapter module's ``EXERCISES``, checked for what would confuse the grader."""
    collected: list[Exercise] = []
    for name in chapter_modules():
        number = name[2:4]
        for exercise in importlib.import_module(f"{exercises.__name__}.{name}").EXERCISES:
            if not exercise.id.startswith(f"ch{number}.") or not exercise.chapter.startswith(f"{number}_"):
                raise ValueError(f"{name}: exercise {exercise.id} ({exercise.chapter}) belongs to another chapter")
            collected.append(exercise)
    ids = [e.id for e in collected]
    if len(set(ids)) != len(ids):
        raise ValueError(f"exercise ids are not unique: {sorted({i for i in ids if ids.count(i) > 1})}")
    return tuple(collected)


REGISTRY: tuple[Exercise, ...] = _collect()


def by_id(exercise_id: str) -> Exercise:
    """The exercise with this id; ``KeyError`` if there is none."""
    for exercise in REGISTRY:
        if exercise.id == exercise_id:
            return exercise
    raise KeyError(exercise_id)


def by_chapter(chapter: str) -> list[Exercise]:
    """The exercises of one chapter folder, in registry order."""
    return [e for e in REGISTRY if e.chapter == chapter]


def chapters() -> list[str]:
    """Chapter folders that have exercises, in order."""
    return sorted({e.chapter for e in REGISTRY})
