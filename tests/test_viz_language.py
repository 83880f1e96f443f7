"""The widgets' language: found at run time from the notebook, and their labels and readouts translated
through one table, the same for a running kernel and for the Chinese notebooks that ``make chapters`` writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import ipywidgets as widgets
import nbformat
import pytest

from scripts import translations as tr
from tfm_solution.viz import language
from tfm_solution.viz.frames import FramePlayer

REPO = Path(__file__).resolve().parents[1]
CHAPTER_NOTEBOOKS = sorted((REPO / "chapters").glob("*/*.ipynb"))


@pytest.fixture(autouse=True)
def _detected_language(monkeypatch):
    """Each test starts with nothing chosen: no override, no environment variable, no front end."""
    language.set_language(None)
    for name in (language.ENV, "JPY_SESSION_NAME"):
        monkeypatch.delenv(name, raising=False)
    yield
    language.set_language(None)


def _notebook(path: Path, metadata: dict) -> Path:
    nb = nbformat.v4.new_notebook(metadata=metadata)
    path.write_text(nbformat.writes(nb))
    return path


@pytest.mark.fast
def test_the_language_is_the_one_the_running_notebook_records(tmp_path, monkeypatch):
    chinese = _notebook(tmp_path / "zh.ipynb", {"course": {"language": "zh"}})
    english = _notebook(tmp_path / "en.ipynb", {"language_info": {"name": "python"}})
    assert language.notebook_language(chinese) == "zh"
    assert language.notebook_language(english) == "en"
    assert language.notebook_language(tmp_path / "gone.ipynb") == "en"
    (tmp_path / "broken.ipynb").write_text("{not json")
    assert language.notebook_language(tmp_path / "broken.ipynb") == "en"

    assert language.current_language() == "en"  # no front end said which notebook runs
    monkeypatch.setenv("JPY_SESSION_NAME", str(chinese))
    assert language.current_language() == "zh"
    # Jupyter may give the path from its own root; the kernel runs in the notebook's folder.
    monkeypatch.setenv("JPY_SESSION_NAME", "some/server/root/zh.ipynb")
    monkeypatch.chdir(tmp_path)
    assert language.current_language() == "zh"
    monkeypatch.setenv("JPY_SESSION_NAME", str(english))
    assert language.current_language() == "en"


@pytest.mark.fast
def test_the_kernel_s_session_names_the_notebook(tmp_path, monkeypatch):
    """``__session__`` (Jupyter) and ``__vsc_ipynb_file__`` (VS Code) in the user's namespace."""
    import IPython

    chinese = _notebook(tmp_path / "zh.ipynb", {"course": {"language": "zh"}})

    class Shell:
        user_ns: dict = {}

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell)
    for name in ("__session__", "__vsc_ipynb_file__"):
        Shell.user_ns = {name: str(chinese)}
        assert language.current_language() == "zh", name
    Shell.user_ns = {"__session__": str(tmp_path / "elsewhere.ipynb")}
    assert language.current_language() == "en"


@pytest.mark.fast
def test_an_explicit_choice_wins_over_the_notebook(tmp_path, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", str(_notebook(tmp_path / "zh.ipynb", {"course": {"language": "zh"}})))
    monkeypatch.setenv(language.ENV, "en")
    assert language.current_language() == "en"
    language.set_language("zh")
    assert language.current_language() == "zh"
    language.set_language("en")
    assert language.current_language() == "en"
    with pytest.raises(ValueError, match="no widget translations for 'xx'"):
        language.set_language("xx")


@pytest.mark.fast
def test_a_language_without_a_table_is_read_as_english(tmp_path, monkeypatch):
    """A typo in the variable, or a notebook of another course, must not stop every widget from building."""
    monkeypatch.setenv(language.ENV, "fr")
    assert language.current_language() == "en"
    monkeypatch.delenv(language.ENV)
    monkeypatch.setenv("JPY_SESSION_NAME", str(_notebook(tmp_path / "fr.ipynb", {"course": {"language": "fr"}})))
    assert language.current_language() == "en"
    monkeypatch.setenv(language.ENV, "zh")
    assert language.current_language() == "zh"


def _table() -> language.Table:
    return language.Table(
        {
            "off": "关闭",
            "epoch {#}": "第 {} 个周期",
            "T = {#}, top-k {}:": "T = {}，top-k {}：",
            "Query word: {} ({})": "查询词：{0}",
            "{} of {}": "{1} 中的 {0}",
            "Drawn with `{}`.": "由 `{}` 绘制。",
        },
        neutral=[language.re.compile(r"<s>|[▁-]\S+")],
    )


@pytest.mark.fast
def test_a_pattern_translates_its_fields_and_keeps_numbers_and_code():
    words = _table()
    assert words.lookup("epoch 12") == "第 12 个周期"
    assert words.lookup("epoch 1,024") == "第 1,024 个周期"
    assert words.lookup("epoch off") is None  # {#} is a number, nothing else
    assert words.lookup("T = 0.5, top-k off:") == "T = 0.5，top-k 关闭："  # a known field is translated
    assert words.lookup("T = 1, top-k 5:") == "T = 1，top-k 5："
    assert words.lookup("Drawn with `off`.") == "由 `off` 绘制。"  # code in backticks never is
    assert words.lookup("Query word: 它 (it)") == "查询词：它"  # a field may be dropped...
    assert words.lookup("layer 2 of 3") == "3 中的 layer 2"  # ...or moved
    assert words.lookup("  off ") == "  关闭 "  # the edge spaces stay around the translation
    assert words.lookup("of") is None and words.lookup("") is None
    assert words.used == {"epoch {#}", "T = {#}, top-k {}:", "off", "Drawn with `{}`.", "Query word: {} ({})", "{} of {}"}


@pytest.mark.fast
def test_html_is_translated_one_text_node_at_a_time():
    words = _table()
    missing: list[str] = []
    value = '<p title="off">off</p><b>epoch 3</b> &lt;s&gt; <i>-ing</i><td>what is this?</td>'
    assert words.html(value, missing) == '<p title="off">关闭</p><b>第 3 个周期</b> &lt;s&gt; <i>-ing</i><td>what is this?</td>'
    assert missing == ["what is this?"]  # tokens and symbols are neutral; prose without an entry is named
    assert words.html("<b>a &amp; b</b>") == "<b>a &amp; b</b>"  # untranslated text keeps its bytes


def _controls() -> FramePlayer:
    control = widgets.ToggleButtons(options=["no mask", "padding mask"], index=1, description="mask:")
    return FramePlayer(control, lambda i: "<p>Drawn with the reference `attention`.</p>", 2, header=[widgets.HTML("")])


@pytest.mark.fast
def test_a_live_widget_speaks_chinese_in_a_chinese_notebook_and_stays_english_otherwise():
    english = _controls()
    assert english.control.description == "mask:" and english.control._options_labels == ("no mask", "padding mask")

    language.set_language("zh")
    player = _controls()
    assert player.control.description == "掩码："
    assert player.control._options_labels == ("不加掩码", "填充掩码")
    assert (player.control.index, player.control.value) == (1, "padding mask")  # the same choice, the same value
    assert player.stack.children[0].value == "<p>由参考实现 <code>attention</code> 绘制。</p>"
    readout = player.children[0]
    readout.value = "<b>Drawn with your own `attention`.</b>"  # a readout that changes later (a monitor)
    assert readout.value == "<b>由你自己的 <code>attention</code> 绘制。</b>"


def _chinese_widget_state(path: Path) -> tuple[dict, list[str]]:
    nb = nbformat.read(path, as_version=4)
    missing: list[str] = []
    tr.translate_widgets(nb, tr.widget_table(), missing)
    return nb.metadata.get("widgets", {}), missing


@pytest.mark.fast
def test_every_label_and_readout_of_the_chinese_notebooks_is_translated_and_every_entry_is_used():
    """The English chapters' widget text is translated or neutral, the table has no entry that no widget
    shows, and zh/ holds exactly the translated state (``make chapters`` is what writes it)."""
    words = tr.widget_table()
    untranslated = {}
    for path in CHAPTER_NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        missing: list[str] = []
        tr.translate_widgets(nb, words, missing)
        if missing:
            untranslated[path.parent.name] = sorted(set(missing))
        chinese = nbformat.read(REPO / tr.SITE / path.relative_to(REPO), as_version=4)
        assert chinese.metadata.get("widgets") == nb.metadata.get("widgets"), f"{path.parent.name}: run `make chapters`"
    assert untranslated == {}, "add these to tfm_solution/assets/widgets/zh.json"
    assert tr.stale_widget_entries(words) == []


@pytest.mark.fast
def test_the_chinese_widgets_set_names_as_code_not_in_backticks():
    """A Chinese HTML readout shows a name as code (the page's text does the same), never with the Markdown
    backticks of its table entry: "预览图由参考实现 `Batch` 绘制" read with literal backticks on every chapter."""
    words = tr.widget_table()
    assert words.html("<div>Drawn with the reference `Batch`.</div>") == "<div>由参考实现 <code>Batch</code> 绘制。</div>"
    shown = [model["state"]["value"] for path in CHAPTER_NOTEBOOKS
             for model in nbformat.read(REPO / tr.SITE / path.relative_to(REPO), as_version=4)
             .metadata.get("widgets", {}).get(tr.WIDGET_STATE, {}).get("state", {}).values()
             if isinstance(model["state"].get("value"), str) and model["state"].get("_model_name") == "HTMLModel"]
    assert shown and not [value for value in shown if "`" in re.sub(r"<[^>]*>", "", value)]


@pytest.mark.fast
def test_a_label_without_chinese_and_an_entry_no_widget_shows_are_named():
    state = {"_model_name": "ToggleButtonsModel", "description": "brand-new label:", "_options_labels": ["no mask", "d_k"]}
    nb = nbformat.v4.new_notebook(metadata={"widgets": {tr.WIDGET_STATE: {"state": {"m1": {"state": state}}}}})
    words = tr.widget_table()
    missing: list[str] = []
    tr.translate_widgets(nb, words, missing)
    shown = nb.metadata.widgets[tr.WIDGET_STATE]["state"]["m1"]["state"]
    assert shown["_options_labels"] == ["不加掩码", "d_k"] and shown["description"] == "brand-new label:"
    [problem] = tr.widget_problems("chapters/03_attention/attention", missing)
    assert "'brand-new label:'" in problem and "chapters/03_attention/attention" in problem
    stale = tr.stale_widget_entries(words, {"no mask": "不加掩码", "a label long gone": "早已不见的标签"})
    assert len(stale) == 1 and "'a label long gone'" in stale[0]


@pytest.mark.fast
def test_the_table_is_well_formed():
    """Every translation formats with its English's fields (``str.format`` raises on a field the English lacks)
    and differs from its English (text that reads the same belongs in ``neutral``)."""
    data = json.loads((REPO / tr.WIDGET_TABLE).read_text(encoding="utf-8"))
    for english, chinese in {**data["strings"], **data["live"]}.items():
        chinese.format(*range(len(language._FIELD.findall(english))))
        assert chinese.strip() and chinese != english, english
    assert not set(data["strings"]) & set(data["live"])


@pytest.mark.fast
def test_the_checks_line_on_whose_code_runs_speaks_the_notebooks_language(capsys):
    """`yours_or_reference` prints which code the cells below run: in a Chinese notebook, in Chinese, every form of
    it (the stub, the error, the student's own) with the name kept as it is written."""
    from tfm_solution.viz.checks import yours_or_reference

    def rate(step, model_size, factor, warmup):
        raise NotImplementedError()

    language.set_language("zh")
    yours_or_reference(rate)
    assert capsys.readouterr().out == "你的 `rate` 还是桩代码，所以下面的单元格运行的是参考实现 `rate`。完成练习后再运行一次它们。\n"

    def rate(step, model_size, factor, warmup):  # noqa: F811 - the student's next try
        return 1 / 0

    yours_or_reference(rate)
    assert capsys.readouterr().out == ("你的 `rate` 抛出了 ZeroDivisionError: division by zero。下面的单元格改为运行参考实现 "
                                       "`rate`。\n")
    language.set_language("en")

    def rate(step, model_size, factor, warmup):  # noqa: F811
        return factor * model_size ** -0.5 * min(max(step, 1) ** -0.5, max(step, 1) * warmup ** -1.5)

    yours_or_reference(rate)
    assert capsys.readouterr().out == "The cells below run your own `rate`.\n"
