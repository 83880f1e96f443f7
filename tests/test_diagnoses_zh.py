"""The diagnoses of declared mistakes in the notebook's language: every one has its Chinese, and a notebook of
the Chinese course that makes one is told so in Chinese, with one Chinese line saying the rest stays English."""

from __future__ import annotations

import re
from pathlib import Path
from string import Formatter

import nbformat
import pytest

from autograder.capstone import SAY
from autograder.diagnoses_zh import CAPSTONE_SAY, CAPSTONE_ZH, ENGLISH_REST, ZH, diagnosis, missing
from autograder.exercises.ch12_capstone import COMPONENTS
from autograder.extract import parse_notebook
from autograder.grade import grade_path
from autograder.mistakes import submission_source
from autograder.registry import REGISTRY, by_id

REPO = Path(__file__).resolve().parents[1]
HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.mark.fast
def test_every_declared_mistake_has_a_chinese_diagnosis_and_no_chinese_is_left_over():
    declared = {m.message for e in REGISTRY for m in e.mistakes.values()}
    assert len(declared) > 100  # the registry is the course's, not an empty stand-in
    assert missing() == []
    assert sorted(set(ZH) - declared) == []  # a message reworded in a grading module leaves its old Chinese here
    # The capstone's diagnosis: its components (missing() names one without Chinese) and its sentences.
    assert sorted(set(CAPSTONE_ZH) - {text for c in COMPONENTS for text in (c[0], c[1], c[4])}) == []
    assert set(CAPSTONE_SAY) == set(SAY)
    for key, chinese in CAPSTONE_SAY.items():
        fields = [{f for _, f, _, _ in Formatter().parse(text) if f} for text in (SAY[key], chinese)]
        assert fields[1] <= fields[0] and (HAN.search(chinese) or key == "names"), key


@pytest.mark.fast
@pytest.mark.parametrize("english", sorted(ZH) + sorted(CAPSTONE_ZH))
def test_a_chinese_diagnosis_keeps_the_code_and_numbers_of_its_english(english):
    """Formulas and code stay as they are: every code span, call and number of the English is in the Chinese."""
    chinese = ZH.get(english) or CAPSTONE_ZH[english]
    assert HAN.search(chinese) and not chinese.endswith(("。", "."))  # the line template adds the full stop
    spans = [f"`{span.strip()}`" for span in re.findall(r"`([^`]+)`", english)]
    calls = re.findall(r"[\w.]+\([^()]*\)", re.sub(r"`[^`]+`", " ", english))
    numbers = re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?", re.sub(r"`[^`]+`", " ", english))
    for piece in [*spans, *calls, *numbers]:
        assert piece in chinese, (piece, chinese)


@pytest.mark.fast
def test_the_diagnosis_line_follows_the_language_and_falls_back_to_english():
    message = next(iter(ZH))
    assert diagnosis("missing_scale", message) == f"**Diagnosis: missing_scale**: {message}."
    assert diagnosis("missing_scale", message, "zh") == f"**诊断：missing_scale**：{ZH[message]}。"
    assert diagnosis("new_one", "an English message", "zh") == "**Diagnosis: new_one**: an English message."


def _notebook(metadata) -> bytes:
    return nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")],
                                                    metadata=metadata)).encode()


@pytest.mark.fast
@pytest.mark.parametrize("metadata,language", [
    ({"course": {"language": "zh"}}, "zh"),
    ({}, "en"),
    ({"course": {"language": "fr"}}, "en"),
    ({"course": {"language": ["zh"]}}, "en"),
    ({"course": "zh"}, "en"),
])
def test_the_grader_reads_the_language_the_notebook_records(metadata, language):
    assert parse_notebook("nb.ipynb", _notebook(metadata)).language == language


@pytest.mark.fast
def test_a_chinese_notebook_with_a_declared_mistake_is_told_in_chinese(tmp_path):
    """Chapter 1's Chinese notebook as ``make chapters`` writes it, its answer replaced by a declared mistake,
    graded as its graded cell grades it (one exercise, one worker)."""
    exercise = by_id("ch01.embeddings")
    nb = nbformat.read(REPO / "zh" / "chapters" / exercise.chapter / exercise.notebook, as_version=4)
    assert nb.metadata["course"]["language"] == "zh"
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == exercise.solution_grade_id)
    answer.source = submission_source(exercise.id, "divides_by_sqrt")
    path = tmp_path / exercise.notebook
    nbformat.write(nb, path)
    report = grade_path(path, only=exercise.id)
    feedback = "\n".join(t.output for t in report.tests)
    message = exercise.mistakes["divides_by_sqrt"].message
    assert report.exercise_score(exercise.id) < exercise.points
    assert f"**诊断：divides_by_sqrt**：{ZH[message]}。" in feedback
    assert "**Diagnosis:" not in feedback and message not in feedback
    assert report.notes.count(ENGLISH_REST) == 1 and HAN.search(ENGLISH_REST)
