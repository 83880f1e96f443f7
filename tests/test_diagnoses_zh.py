"""The diagnoses of declared mistakes in the notebook's language: every one has its Chinese, and a notebook of
the Chinese course that makes one is told so in Chinese (the rest of its feedback: tests/test_feedback_zh.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from string import Formatter

import nbformat
import pytest
import yaml

from autograder.capstone import SAY
from autograder.diagnoses_coverage import declared, missing
from autograder.diagnoses_zh import CAPSTONE_SAY, CAPSTONE_ZH, PATH, ZH, diagnosis, units
from autograder.extract import parse_notebook
from autograder.grade import grade_path
from autograder.mistakes import submission_source
from autograder.registry import REGISTRY, by_id

REPO = Path(__file__).resolve().parents[1]
HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.mark.fast
def test_every_declared_mistake_has_a_chinese_diagnosis_and_no_chinese_is_left_over():
    declared_messages = {m.message for e in REGISTRY for m in e.mistakes.values()}
    assert len(declared_messages) > 100  # the registry is the course's, not an empty stand-in
    assert PATH == REPO / "translations" / "zh" / "diagnoses.yml"
    assert missing() == []  # every text has its unit, stamped with its English; no unit is left over
    assert all(message in ZH for message in declared_messages) and len(ZH) == len(declared_messages)
    # The capstone's diagnosis: its sentences keep their fields.
    assert set(CAPSTONE_SAY) == set(SAY)
    for key, chinese in CAPSTONE_SAY.items():
        fields = [{f for _, f, _, _ in Formatter().parse(text) if f} for text in (SAY[key], chinese)]
        assert fields[1] <= fields[0] and (HAN.search(chinese) or key == "names"), key


@pytest.mark.fast
def test_a_changed_english_a_new_text_and_a_text_gone_are_named():
    english = declared()
    data = yaml.safe_load(PATH.read_text(encoding="utf-8"))
    key = "ch01.embeddings missing_scale"
    changed = {**english, key: english[key] + " (reworded)", "ch01.embeddings new_one": "a new mistake"}
    del changed["ch01.embeddings divides_by_sqrt"]
    assert missing(changed, data) == [f"{key}: the English changed since it was translated",
                                      "ch01.embeddings new_one: no translation",
                                      "ch01.embeddings divides_by_sqrt: no such text any more"]
    # The grader then shows the reworded message in English: a Chinese text is found by the English it translates.
    assert english[key] in ZH and changed[key] not in ZH
    assert diagnosis("missing_scale", changed[key], "zh") == f"**Diagnosis: missing_scale**: {changed[key]}."
    data["mistakes"][key]["en"] = "new"
    assert missing(english, data) == [f"{key}: translated but never stamped"]


@pytest.mark.fast
def test_the_chinese_is_data_and_its_loader_imports_no_grading_module():
    """The loader reads translations/zh/diagnoses.yml and nothing of the grader: grade and extract import it, and
    chapter 12's grading module imports the capstone harness, which imports grade (no import circle)."""
    code = ("import sys; import autograder.diagnoses_zh; "
            "print(sorted(m for m in sys.modules if m.startswith('autograder')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['autograder', 'autograder.diagnoses_zh']"
    source = (REPO / "autograder" / "diagnoses_zh.py").read_text()
    assert len(source.splitlines()) < 150 and not HAN.search(source.replace("诊断：", ""))
    assert len(units()) == len(declared())


@pytest.mark.fast
@pytest.mark.parametrize("key", sorted(k for k in declared() if not k.startswith("say ")))
def test_a_chinese_diagnosis_keeps_the_code_and_numbers_of_its_english(key):
    """Formulas and code stay as they are: every code span, call and number of the English is in the Chinese."""
    english = declared()[key]
    chinese = ZH.get(english) or CAPSTONE_ZH[english]
    assert HAN.search(chinese) and not chinese.endswith(("。", "."))  # the line template adds the full stop
    spans = [f"`{span.strip()}`" for span in re.findall(r"`([^`]+)`", english)]
    calls = re.findall(r"[\w.]+\([^()]*\)", re.sub(r"`[^`]+`", " ", english))
    numbers = re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?", re.sub(r"`[^`]+`", " ", english))
    for piece in [*spans, *calls, *numbers]:
        assert piece in chinese, (piece, chinese)


@pytest.mark.fast
def test_the_diagnosis_line_follows_the_language_and_falls_back_to_english():
    message = by_id("ch03.attention").mistakes["missing_scale"].message
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
    assert report.language == "zh"
