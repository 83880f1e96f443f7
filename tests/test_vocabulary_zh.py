"""The Chinese course speaks one vocabulary (``translations/zh/vocabulary.yml``): a replaced form planted in a
sidecar, a test message, the widget table or the grader's Chinese is named by the check ``make chapters`` runs,
and the edition passes it; Markdown that the site would show as literal ``*`` or backticks is named too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autograder.contract import LABELS_ZH
from scripts import translations as tr

REPO = Path(__file__).resolve().parents[1]
CHAPTER = "01_embeddings"
DOCNAME = f"chapters/{CHAPTER}/embeddings"


def _course_copy(tmp_path: Path) -> Path:
    root = tmp_path / "course"
    root.mkdir()
    for name in ("_toc.yml", "_config.yml", "intro.md", "how_to_use.md", "maintainers.md", "glossary.md"):
        shutil.copy(REPO / name, root / name)
    for folder in ("appendix", "figures", "translations", f"chapters/{CHAPTER}"):
        shutil.copytree(REPO / folder, root / folder)
    return root


def _plant(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@pytest.mark.fast
def test_the_edition_uses_the_vocabulary_s_forms_only():
    assert tr.vocabulary_check(REPO, REPO / tr.SITE) == []


@pytest.mark.fast
def test_a_planted_variant_is_named_wherever_it_is(tmp_path):
    root = _course_copy(tmp_path)
    assert tr.generate(root, root, only=CHAPTER) == []
    sidecar = tr.sidecar_path(root, DOCNAME)
    _plant(sidecar, "### 可见测试", "### 公开测试")
    _plant(sidecar, "桩代码", "空壳")
    problems = tr.generate(root, root, only=CHAPTER)
    where = f"{tr.SITE}/{DOCNAME}.ipynb: cell "
    assert len(problems) == 2, problems
    assert any(p.startswith(where) and "uses '公开测试' where the course writes '可见测试'" in p for p in problems)
    assert any(p.startswith(where) and "uses '空壳' where the course writes '桩代码'" in p for p in problems)
    # A test message: the messages file is named with the English it translates.
    messages = tr.messages_path(root, DOCNAME)
    english, chinese = next(iter(tr.read_messages(root, DOCNAME).items()))
    _plant(messages, chinese, chinese[:-1] + "（在笔记本里）" + chinese[-1])
    found = [p for p in tr.generate(root, root, only=CHAPTER) if "'笔记本'" in p]
    assert any(p.startswith(f"{tr.TRANSLATIONS.as_posix()}/{DOCNAME}.messages.yml: ") for p in found), found
    assert any(p.startswith(where) for p in found), found  # and in the notebook that shows it


@pytest.mark.fast
def test_the_grader_s_chinese_and_the_widget_table_are_checked_too(tmp_path):
    root = _course_copy(tmp_path)
    _plant(root / tr.DIAGNOSES, "微批次", "小批次")
    table = root / tr.WIDGET_TABLE
    table.parent.mkdir(parents=True)
    table.write_text((REPO / tr.WIDGET_TABLE).read_text(encoding="utf-8").replace("记事本", "notebook", 1), encoding="utf-8")
    found = [where for where, text in tr.data_texts(root)
             for where in tr.vocabulary_problems(text, tr.vocabulary(root), where)]
    assert any(p.startswith(f"{tr.DIAGNOSES.as_posix()}: ") and "'小批次'" in p for p in found), found
    assert any(p.startswith(f"{tr.WIDGET_TABLE.as_posix()}: ") and "'notebook'" in p for p in found), found


@pytest.mark.fast
@pytest.mark.parametrize("text,variant", [
    ("把被屏蔽的得分设为一个绝对值很大的负数", None),  # the course's form contains 很大的负数
    ("把被屏蔽的得分设为一个很大的负数", "很大的负数"),
    ("在笔记本电脑的 CPU 上，每个记事本都不到一分钟", None),
    ("每个笔记本都不到一分钟", "笔记本"),
    ("按 layer(x, memory, src_mask) 的方式调用每一层", None),  # code, not prose
    ("编码器的 memory 被投影一次", "memory"),
    ("编码器的输出，即**记忆**（memory）", None),  # a first use gives the English in brackets
    ("| 周期 | epoch | 把训练数据完整过一遍 |", None),  # a term table's English column
    ("训练十个 epoch", "epoch"),
    ("## 常见错误", "## 常见错误"),
])
def test_the_vocabulary_check_reads_prose_not_code(text, variant):
    found = tr.vocabulary_problems(text, tr.vocabulary(REPO), "x")
    assert found == ([] if variant is None else [p for p in found if f"uses {variant!r}" in p]) and \
        (variant is None or found), found


@pytest.mark.fast
def test_the_contract_labels_are_the_vocabulary_s():
    words = {w.name: w.chinese for w in tr.vocabulary(REPO)}
    assert {key: words.get(f"contract: {key}") for key in LABELS_ZH} == LABELS_ZH


@pytest.mark.fast
@pytest.mark.parametrize("markdown,shown", [
    ("比如*“一本关于人工智能的书”*：这就是查询。", "*"),  # CommonMark opens * next to “ only after a space
    ("比如<em>“一本关于人工智能的书”</em>：这就是查询。", None),
    ("这是**查询**（query），见 `attention` 和 $a*b$。", None),
    ("**“注意力就是你所需要的一切”**，论文这样说。", None),
    ("见`x`的**“值”**。", "**"),
])
def test_markdown_the_reader_would_see_is_named(markdown, shown):
    found = tr.markup_problems(markdown, "x")
    assert (found == []) if shown is None else (found and f"literal {shown!r}" in found[0]), found


@pytest.mark.fast
def test_a_planted_unclosed_emphasis_fails_generation_and_the_site_check(tmp_path):
    root = _course_copy(tmp_path)
    sidecar = tr.sidecar_path(root, DOCNAME)
    _plant(sidecar, "### 可见测试", "### 可见测试\n\n比如*“一本书”*：这就是查询。")
    problems = tr.generate(root, root, only=CHAPTER)
    assert len(problems) == 2 and all("shows a literal '*'" in p for p in problems), problems  # both stars
    assert problems[0].startswith(f"{tr.TRANSLATIONS.as_posix()}/{DOCNAME}.md: cell ")
    # The built site's check reads the HTML a page shows (its code and math aside).
    html = tmp_path / "html"
    (html / "chapters").mkdir(parents=True)
    (html / "chapters" / "ok.html").write_text(
        "<main><p>见 <code>a*b</code>、<span class='math notranslate'>\\(a*b\\)</span></p>"
        "<div class='cell_output'><pre>**</pre></div></main>")
    (html / "chapters" / "bad.html").write_text("<html><main><p>比如*“一本书”*：这就是查询。</p></main></html>")
    assert [p.split(" (")[0] for p in tr.site_markup_problems(html)] == ["chapters/bad.html: shows a literal '*'"] * 2


@pytest.mark.fast
def test_every_chinese_unit_renders_without_literal_markup():
    renderer = tr._markdown_renderer()
    problems = []
    for page, _ in tr._pages(REPO, REPO, None):
        if page.docname in tr.PLAIN:
            continue
        for key, done in tr.read_sidecar(REPO, page.docname).items():
            if key not in page.comments:
                problems += tr.markup_problems(done.text, f"{page.docname}: {key}", renderer)
    assert problems == []


@pytest.mark.fast
def test_the_chinese_site_s_download_and_colab_buttons_give_the_chinese_notebook():
    """The Chinese site is built from zh/ (its pages' sources are the Chinese notebooks, which the download button
    serves), and its repository path is zh/, which the Colab button opens: zh/chapters/NN_slug/name.ipynb."""
    import yaml

    config = yaml.safe_load((REPO / tr.SITE / "_config.yml").read_text())
    english = yaml.safe_load((REPO / "_config.yml").read_text())
    assert config["repository"]["path_to_book"] == tr.SITE
    assert config["launch_buttons"] == english["launch_buttons"] and config["html"]["use_download_button"]
    assert (REPO / tr.SITE / "chapters" / CHAPTER / "embeddings.ipynb").is_file()
