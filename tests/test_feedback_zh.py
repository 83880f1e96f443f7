"""A Chinese notebook's feedback is Chinese, every sentence of it: the grader's lines are rendered from the
templates of ``translations/zh/grader.yml`` (``autograder.feedback_zh``) with their numbers and code exact, a line
no template matches stays English, and an English notebook's feedback is the grader's English, unchanged.

Three gradings of the course's own notebooks, as ``make chapters`` writes them: chapter 3 with a declared
mistake (``attention``) and an answer that raises (``softmax_saturation``), in Chinese and in English; chapter 1
with an answer that runs out of memory (``Embeddings``) and one that loops for ever through a library shortcut
(``cosine_similarity_matrix``), in Chinese.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import jsonschema
import nbformat
import pytest
import yaml

from autograder import feedback_zh
from autograder.diagnoses_coverage import case_texts, grader_missing
from autograder.diagnoses_zh import english_hash
from autograder.feedback_zh import Catalogue, _prose, render
from autograder.grade import grade_path
from autograder.mistakes import submission_source
from autograder.report import read_submission
from autograder.results import Report, TestResult, _width, graded, table, to_gradescope, write_results
from autograder.sandbox import Limits

REPO = Path(__file__).resolve().parents[1]
HAN = re.compile(r"[\u4e00-\u9fff]")
FENCE = re.compile(r"^(`{3,})[^\n]*\n.*?^\1[ \t]*$", re.M | re.S)
CODE = re.compile(r"(`+).*?\1")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")

RAISES = "import torch\n\ndef softmax_saturation(query, key, scaled=True):\n    raise ValueError('no saturation today')\n"
GREEDY = '''import math
import torch
from torch import nn

class Embeddings(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x):
        hoard = torch.ones(2 ** 40)  # 4 TiB: far beyond the memory limit
        return self.lut(x) * math.sqrt(self.d_model)
'''
LOOPS = '''import torch
import torch.nn.functional as F

def cosine_similarity_matrix(x):
    while True:
        F.cosine_similarity(x, x)
'''


def english_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (Markdown) that are English: outside code blocks and code spans, a stretch between
    two marks of Chinese punctuation with two English words in a row and no Chinese character. Names, numbers,
    shapes and code are no sentences."""
    found = []
    for line in FENCE.sub("", text).splitlines():
        for sentence in re.split(r"[。；：，（）！？]", CODE.sub("", line)):
            if _prose(sentence) and not HAN.search(sentence):
                found.append(line)
    return found


def _notebook(tmp: Path, page: str, answers: dict[str, str], language: str) -> Path:
    """A chapter's notebook of the ``language`` course with these answer cells (by grade id)."""
    nb = nbformat.read(REPO / ("zh/chapters" if language == "zh" else "chapters") / page, as_version=4)
    for grade_id, source in answers.items():
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        cell.source = source
    path = tmp / language / Path(page).name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


CHAPTER_3 = ("03_attention/attention.ipynb",
             {"ch03-attention": submission_source("ch03.attention", "missing_scale"), "ch03-softmax-saturation": RAISES})
CHAPTER_1 = ("01_embeddings/embeddings.ipynb", {"ch01-embeddings": GREEDY, "ch01-cosine-similarity-matrix": LOOPS})


@pytest.fixture(scope="module")
def chapter_3(tmp_path_factory) -> dict[str, Report]:
    """Chapter 3 graded with a declared mistake and a crash, in both languages (the same code: the same seed)."""
    tmp = tmp_path_factory.mktemp("chapter_3")
    return {language: grade_path(_notebook(tmp, *CHAPTER_3, language)) for language in ("zh", "en")}


@pytest.fixture(scope="module")
def chapter_1(tmp_path_factory) -> Report:
    """Chapter 1 in Chinese, graded with an answer over the memory limit and one over the time limit."""
    tmp = tmp_path_factory.mktemp("chapter_1")
    return grade_path(_notebook(tmp, *CHAPTER_1, "zh"), limits=Limits(call_timeout_s=1.0, start_timeout_s=20.0))


def _all_text(results: dict) -> list[str]:
    return [results["output"], *(f"{t['name']}\n{t['output']}" for t in results["tests"])]


def test_a_chinese_notebook_with_a_declared_mistake_and_a_crash_is_answered_in_chinese(chapter_3):
    report = chapter_3["zh"]
    assert report.language == "zh"
    results = to_gradescope(report)
    assert [s for text in _all_text(results) for s in english_sentences(text)] == []
    assert english_sentences(table(report)) == [] and "总分" in table(report)
    outputs = {t["name"]: t["output"] for t in results["tests"]}
    assert "ch03.attention 公开用例：2 个查询，3 个键，没有掩码" in outputs
    assert "**诊断：missing_scale**" in outputs["ch03.attention 公开用例：2 个查询，3 个键，没有掩码"]
    crashed = outputs["ch03.softmax_saturation 公开用例：3 个查询，4 个键，有缩放"]
    assert "你的代码抛出了异常：" in crashed and "ValueError: no saturation today" in crashed  # quoted as raised
    # The grader's own words are kept for the tools that read them (the class report).
    english = graded(results)
    assert [t["name"] for t in english["tests"]] == [t.name for t in report.tests]
    assert english["tests"][0]["output"] == report.tests[0].output


def test_the_numbers_of_the_differences_stay_exact(chapter_3):
    report = chapter_3["zh"]
    results = to_gradescope(report)
    compared = 0
    for test, shown in zip(report.tests, results["tests"], strict=True):
        own = [line for line in test.output.splitlines() if line.startswith("- ")]
        said = [line for line in shown["output"].splitlines() if line.startswith("- ")]
        assert len(own) == len(said)
        for english, chinese in zip(own, said, strict=True):
            assert Counter(NUMBER.findall(english)) == Counter(NUMBER.findall(chinese)), (english, chinese)
            assert re.findall(r"`[^`]*`", english) == re.findall(r"`[^`]*`", chinese) or "through" in english
            compared += 1
    assert compared > 50


def test_the_same_english_notebook_gets_the_graders_english(chapter_3):
    english, chinese = chapter_3["en"], chapter_3["zh"]
    assert english.language == "en"
    results = to_gradescope(english)
    assert "language" not in results["extra_data"] and "english" not in results["extra_data"]
    assert not any(HAN.search(text) for text in _all_text(results))
    assert [t["output"] for t in results["tests"]] == [t.output for t in english.tests]  # nothing rendered
    assert "test" in table(english).splitlines()[0] and "总分" not in table(english)
    # The same code, the same seed: the same cases and scores in both languages.
    assert [t.name for t in english.tests] == [t.name for t in chinese.tests]
    assert [t.score for t in english.tests] == [t.score for t in chinese.tests]


def test_time_memory_and_policy_lines_are_chinese_and_the_class_report_still_reads_them(chapter_1, tmp_path):
    results = to_gradescope(chapter_1)
    assert [s for text in _all_text(results) for s in english_sentences(text)] == []
    feedback = "\n".join(_all_text(results))
    assert "超出了内存限制：" in feedback and "秒后超时" in feedback
    assert "你的答案调用了 `cosine_similarity`：这道练习要求你自己实现它。" in feedback
    write_results(results, tmp_path / "student.json")
    submission = read_submission(tmp_path / "student.json")
    assert submission.language == "zh"
    assert {f.kind for f in submission.flags} >= {"memory", "timeout", "policy"}


def test_every_case_and_every_template_has_its_chinese():
    assert grader_missing() == []
    data = yaml.safe_load(feedback_zh.PATH.read_text(encoding="utf-8"))
    assert len(data["lines"]) > 120 and len(data["cases"]) > 300
    catalogue = Catalogue(data)
    texts = case_texts()
    assert len(texts) > 400
    assert all(HAN.search(catalogue.line(text)) for text in texts.values())


def _without(data: dict, section: str, english: str) -> dict:
    return {**data, section: {k: v for k, v in data[section].items() if k != english}}


def test_a_missing_or_stale_unit_leaves_its_line_english_and_is_named(chapter_3):
    data = yaml.safe_load(feedback_zh.PATH.read_text(encoding="utf-8"))
    report = chapter_3["zh"]
    # A template removed: its lines stay English, and the sentence check above would fail.
    checked = "Checked: {checks:text}."
    lines = Catalogue(_without(data, "lines", checked)).render(report.tests[0].output).splitlines()
    assert lines[0] == report.tests[0].output.splitlines()[0] and english_sentences(lines[0])
    # A case's unit removed, or its English edited without a new stamp: named, and its line English.
    title = "2 queries, 3 keys, no mask"
    assert any(title in p and "no translation" in p for p in grader_missing(_without(data, "cases", title)))
    edited = {**data, "cases": {**data["cases"], title + "!": data["cases"][title]}}
    assert any("changed since it was translated" in p for p in grader_missing(edited))
    assert Catalogue(edited).line(title + "!") is None
    # A template whose English the grader no longer writes, and one whose Chinese lost a field.
    gone = {**data, "lines": {**data["lines"], "{n} unicorns were consulted": {
        "en": english_hash("{n} unicorns were consulted"), "zh": "请教了 {n} 只独角兽"}}}
    assert any("no such text in the grader" in p for p in grader_missing(gone))
    lost = {**data, "lines": {**data["lines"], checked: {**data["lines"][checked], "zh": "检查内容。"}}}
    assert any("exactly the English's fields" in p for p in grader_missing(lost))


def test_rendering_keeps_code_numbers_and_the_english_it_cannot_translate():
    catalogue = Catalogue({"lines": {english: {"en": english_hash(english), "zh": chinese} for english, chinese in (
        ("{where:text}: first mismatch at index {index}", "{where}：第一处不一致在下标 {index}"),
        ("gradient of `{name}`", "`{name}` 的梯度"),
        ("your code raised:", "你的代码抛出了异常："),
        ("Score: {score} / {max}", "得分：{score} / {max}"),
    )}})
    text = ("your code raised:\n\n```text\nyour code raised:\nValueError: 1.5e-3\n```\n\n- output: first mismatch at "
            "index [0, 2]\n- gradient of `w_1`: first mismatch at index [3]\n- a line the catalogue does not have\n\n"
            "Score: 0.75 / 2")
    assert catalogue.render(text) == (
        "你的代码抛出了异常：\n\n```text\nyour code raised:\nValueError: 1.5e-3\n```\n\n- output：第一处不一致在下标 "
        "[0, 2]\n- `w_1` 的梯度：第一处不一致在下标 [3]\n- a line the catalogue does not have\n\n得分：0.75 / 2")
    # A plain field that would capture English words does not fit; English text no unit has stays whole.
    assert catalogue.line("the first answer: first mismatch at index [1]") is None
    # No catalogue (a copy of the grader without translations), or an English notebook: the English unchanged.
    assert Catalogue({}).render(text) == text and render(text, "en") == text


def test_the_table_lines_up_chinese_names():
    report = Report(tests=[TestResult("ch03.attention hidden: causal mask", 0.0, 0.75, "Checked: causal mask.")],
                    language="zh")
    lines = table(report).splitlines()
    assert lines[2].startswith("ch03.attention 隐藏用例：因果掩码") and lines[2].endswith("0/0.75  未通过")
    assert _width(lines[0]) - _width("结果") == _width(lines[2]) - _width("未通过")  # a CJK character is two columns


@pytest.mark.fast
@pytest.mark.parametrize("own", [["positional_encoding"], ["positional_encoding", "attention"]])
@pytest.mark.parametrize("lost", [False, True])
def test_a_graded_releases_note_on_the_students_own_prerequisites_is_chinese(own, lost):
    """In a graded release the student's own earlier answers stand in for unreleased references; the note that
    says so (and names an earlier exercise that lost points) reads in Chinese, every variant."""
    from autograder.grade import _own_note
    from autograder.registry import by_id

    exercise = by_id("ch02.PositionalEncoding")
    tests = [TestResult(f"{by_id(i).id} hidden: a case", 0.0 if lost else 1.0, 1.0, "")
             for i in ("ch02.positional_encoding", "ch03.attention")]
    note = _own_note(exercise, own, Report(tests=tests))
    assert ("lost points" in note) == lost
    rendered = render(note, "zh")
    assert not english_sentences(rendered), rendered


@pytest.mark.fast
def test_a_run_that_failed_before_the_language_was_read_says_so_in_both_languages():
    from autograder.results import GRADESCOPE_SCHEMA, error_results

    results = error_results("Traceback\nOSError: disk on fire")
    jsonschema.validate(results, GRADESCOPE_SCHEMA)
    english, chinese = results["output"].split("\n\n")
    assert "autograder failed" in english and not english_sentences(chinese) and "老师" in chinese
