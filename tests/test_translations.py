"""The Chinese course: one source per cell, stale translations caught, the glossary as termbase,
and notebooks that the grader treats exactly as the English ones."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbgrader.utils import compute_checksum

from autograder.course_code import gather
from autograder.extract import find_notebook, read_submission
from autograder.grade import grade_path
from autograder.registry import REGISTRY
from scripts import translations as tr

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = sorted({(e.chapter, e.notebook) for e in REGISTRY})


def _zh_units() -> list[tuple[str, str, str, str]]:
    """(page, key, English, Chinese) of every unit with an up-to-date translation."""
    found = []
    for page, _ in tr._pages(REPO, REPO, None):
        translations = tr.read_sidecar(REPO, page.docname)
        for key, english in page.units().items():
            done = translations.get(key)
            if done is not None and done.source_hash == tr.english_hash(english):
                found.append((page.docname, key, english, done.text))
    return found


def _course_copy(tmp_path: Path, chapter: str) -> Path:
    """What the Chinese course is generated from: the English pages, one chapter's release, the translations."""
    root = tmp_path / "course"
    for name in ("_toc.yml", "_config.yml", "intro.md", "how_to_use.md", "maintainers.md", "glossary.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    for folder in ("appendix", "figures", "translations", f"chapters/{chapter}"):
        shutil.copytree(REPO / folder, root / folder)
    return root


def _generated(tmp_path: Path, chapter: str, notebook: str) -> tuple[Path, Path]:
    """A copy of the course with ``chapter``, its Chinese generated with no problem; and the chapter's release."""
    root = _course_copy(tmp_path, chapter)
    assert tr.generate(root, root, only=chapter) == []
    return root, root / "chapters" / chapter / notebook


def _edit_cell(path: Path, cell_id: str, edit) -> None:
    nb = nbformat.read(path, as_version=4)
    edit(nb, next(i for i, c in enumerate(nb.cells) if c.get("id") == cell_id))
    nbformat.write(nb, path)


@pytest.mark.fast
def test_a_changed_english_sentence_a_new_cell_and_a_deleted_one_are_named(tmp_path):
    chapter, notebook = "01_embeddings", "embeddings.ipynb"
    root, release = _generated(tmp_path, chapter, notebook)

    def change_a_sentence(nb, i):
        nb.cells[i].source = nb.cells[i].source.replace("a row of words", "a sequence of words")

    _edit_cell(release, "fbc2e413", change_a_sentence)
    problems = tr.generate(root, root, only=chapter)
    assert problems == [f"translations/zh/chapters/{chapter}/embeddings.md: cell fbc2e413: the English changed since it "
                        f"was translated ('# 1. Embeddings'); `{tr.TODO} chapters/{chapter}/embeddings` lists what to translate"]
    # Until it is translated, the Chinese notebook shows that cell in English, under the note.
    shown = nbformat.read(root / "zh" / "chapters" / chapter / notebook, as_version=4)
    cell = next(c for c in shown.cells if c.id == "fbc2e413")
    assert tr.PENDING_NOTE in cell.source and "a sequence of words" in cell.source

    def add_one_delete_another(nb, i):
        nb.cells.insert(i + 1, nbformat.v4.new_markdown_cell("A new paragraph.", id="brand-new"))
        nb.cells = [c for c in nb.cells if c.id != removed]  # its translation is left over

    removed = "38dd49cf"
    _edit_cell(release, "fbc2e413", add_one_delete_another)
    problems = tr.generate(root, root, only=chapter)
    assert any("cell brand-new: no translation" in p for p in problems), problems
    assert any(f"cell {removed}: translated, but the English page has no such cell" in p for p in problems), problems


@pytest.mark.fast
def test_a_pending_page_builds_in_english_until_translated_and_must_then_leave_the_list(tmp_path):
    chapter = "01_embeddings"
    root = _course_copy(tmp_path, chapter)
    docname = f"chapters/{chapter}/embeddings"
    sidecar = tr.sidecar_path(root, docname)
    settings = root / tr.SETTINGS
    others = [p for p in tr.settings(REPO)["pending"] if p != docname]
    # Fully translated and listed as pending: the list is stale.
    settings.write_text(f"pending: {[*others, docname]}\n")
    assert tr.generate(root, root, only=chapter) == [f"{tr.SETTINGS}: {docname!r} is fully translated: take it off the pending list"]
    # Half its translations gone: no problem, the English shows under the note, cell by cell.
    blocks = sidecar.read_text().split("<!-- cell ")
    sidecar.write_text("<!-- cell ".join(blocks[: len(blocks) // 2]))
    assert tr.generate(root, root, only=chapter) == []
    nb = nbformat.read(root / "zh" / "chapters" / chapter / "embeddings.ipynb", as_version=4)
    english = nbformat.read(root / "chapters" / chapter / "embeddings.ipynb", as_version=4)
    translated = tr.read_sidecar(root, docname)
    for cell, original in zip(nb.cells, english.cells, strict=True):
        if cell.cell_type == "markdown":
            assert (tr.PENDING_NOTE in cell.source) == (cell.id not in translated), cell.id
            # (a statement's generated contract is always shown in Chinese: only its prose can wait)
            prose = tr._contract().hand_written(original.source)
            kept = set(prose.splitlines()) <= set(cell.source.splitlines())
            assert kept == (cell.id not in translated), cell.id
    # Off the list, the same state fails.
    settings.write_text(f"pending: {others}\n")
    assert len(tr.generate(root, root, only=chapter)) == len(tr.notebook_page(docname, english).units()) - len(translated)


@pytest.mark.fast
def test_sidecars_parse_and_stamp(tmp_path):
    text = "a comment\n\n<!-- cell a en=new -->\n第一段\n\n<!-- cell b en=0123456789abcdef -->\n第二段\n"
    assert tr.parse_sidecar(text) == {"a": tr.Translation("new", "第一段"), "b": tr.Translation("0123456789abcdef", "第二段")}
    with pytest.raises(ValueError, match="translated twice"):
        tr.parse_sidecar(text + "<!-- cell a en=new -->\n再来\n")
    # Markdown pages: sections and glossary entries, and the page comes back whole.
    for name in ("intro.md", "how_to_use.md", "glossary.md"):
        page = tr.markdown_page(name, (REPO / name).read_text())
        assert "\n".join(text for _, text in page.parts) == (REPO / name).read_text()
    assert "term-layer-normalization" in tr.markdown_page("glossary", (REPO / "glossary.md").read_text()).units()


@pytest.mark.fast
@pytest.mark.parametrize("chapter,notebook", CHAPTERS)
def test_the_chinese_notebook_shares_every_code_cell_output_widget_and_grade_cell(chapter, notebook):
    english = nbformat.read(REPO / "chapters" / chapter / notebook, as_version=4)
    chinese = nbformat.read(REPO / tr.SITE / "chapters" / chapter / notebook, as_version=4)
    assert chinese.metadata.pop("course") == {"language": tr.LANGUAGE}
    tr.translate_widgets(english, tr.widget_table())
    assert chinese.metadata == english.metadata  # kernel, widget state (its labels and readouts translated)
    assert [c.get("id") for c in chinese.cells] == [c.get("id") for c in english.cells]
    for zh, en in zip(chinese.cells, english.cells, strict=True):
        assert zh.cell_type == en.cell_type
        if en.cell_type == "code" and tr.graded(en):
            assert zh == en, en.id  # source, outputs, execution count, nbgrader metadata
        elif en.cell_type == "code":  # only comments and the asserts' messages may differ (and a locked cell's checksum)
            assert _code_shape(zh.source) == _code_shape(en.source), en.id
            assert _without_messages(_without_comments(zh.source)) == _without_messages(_without_comments(en.source)), en.id
            assert {**zh, "source": "", "metadata": {}, "outputs": []} == {**en, "source": "", "metadata": {}, "outputs": []}
            assert _printed_apart(zh.outputs) == _printed_apart(en.outputs), en.id
            for zh_line, en_line in _printed_lines(zh.outputs, en.outputs):  # the package's own lines, in Chinese
                assert en_line.startswith(PRINTED) and CJK.search(zh_line), (en.id, en_line, zh_line)
                assert re.findall(r"`[^`]*`", zh_line) == re.findall(r"`[^`]*`", en_line), (en.id, zh_line)
            assert _without_checksum(zh.metadata) == _without_checksum(en.metadata), en.id
        else:
            assert zh.metadata == en.metadata
            assert zh.source != en.source, f"{en.id} is not translated"
        if "checksum" in zh.metadata.get("nbgrader", {}):
            assert compute_checksum(zh) == zh.metadata.nbgrader.checksum, en.id


CJK = re.compile(r"[\u4e00-\u9fff]")
PRINTED = ("Here the cells below ran the reference", "The cells below run", "Your `", "Checked with the reference",
           "Stored figure:", "Write `", "This cell needs")
"""How each line the package prints itself begins (``yours_or_reference``, the stored figures): the one output a
Chinese notebook may show in Chinese."""


def _stream_lines(outputs: list) -> list[str]:
    return [line for o in outputs if o.get("output_type") == "stream" for line in o["text"].splitlines()]


def _printed_lines(zh: list, en: list) -> list[tuple[str, str]]:
    return [(z, e) for z, e in zip(_stream_lines(zh), _stream_lines(en), strict=True) if z != e]


def _printed_apart(outputs: list) -> list:
    """The outputs with their stream text set aside (compared line by line on its own)."""
    return [{**o, "text": len(o["text"].splitlines())} if o.get("output_type") == "stream" else o for o in outputs]


def _code_shape(source: str) -> str:
    """The syntax tree of a code cell with its string constants set aside (comments are not in it): what the
    Chinese notebook's code must share with the English one's. IPython's magics are read as Python first."""
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
        elif isinstance(node, ast.JoinedStr):
            # a message's fields, in the order its language puts them (`message_problem` checks they are the same)
            node.values = sorted((v for v in node.values if isinstance(v, ast.FormattedValue)), key=ast.dump)
    return ast.dump(tree)


def _without_comments(source: str) -> str:
    """The code with every comment a reader reads emptied (``# contract:`` markers stay)."""
    for token in reversed(tr._comment_tokens(source)):
        lines = source.split("\n")
        row = lines[token.start[0] - 1]
        lines[token.start[0] - 1] = row[:token.start[1]] + "#" + row[token.end[1]:]
        source = "\n".join(lines)
    return source


@pytest.mark.fast
def test_a_translated_comment_changes_the_comment_only():
    source = 'x = f(a, "s")   # the scores: (n_q, n_k)\n# second\nif x:  # third\n    y = "#not a comment"\n# contract: inputs\n'
    english = tr.code_comments(source)
    assert english == "# the scores: (n_q, n_k)\n# second\n# third"  # the contract marker is no comment to translate
    chinese = "# 得分：(n_q, n_k)\n# 第二条\n# 第三条"
    assert tr.comment_problem(english, chinese) is None
    assert tr.translate_comments(source, chinese) == (
        'x = f(a, "s")   # 得分：(n_q, n_k)\n# 第二条\nif x:  # 第三条\n    y = "#not a comment"\n# contract: inputs\n')
    assert "one line per comment" in tr.comment_problem(english, "# 得分\n# 第二条")
    assert "starts with #" in tr.comment_problem(english, "# 得分\n第二条\n# 第三条")
    assert _code_shape(tr.translate_comments(source, chinese)) == _code_shape(source)
    assert _code_shape('x = f(a, "s")') != _code_shape('x = f(b, "s")')  # code that differs is caught


def _without_messages(source: str) -> str:
    """The code with every assert message's literal emptied: what both languages share."""
    for start, end, _ in reversed(tr.message_spans(source)):
        source = source[:start] + '""' + source[end:]
    return source


def _without_checksum(metadata) -> dict:
    nbgrader = {k: v for k, v in metadata.get("nbgrader", {}).items() if k != "checksum"}
    return {**metadata, "nbgrader": nbgrader}


@pytest.mark.fast
@pytest.mark.parametrize("chapter,notebook", CHAPTERS)
def test_the_visible_tests_speak_chinese_where_the_chapter_is_translated(chapter, notebook):
    """Outside ``messages_pending`` every assert message of the Chinese notebook is Chinese, and each cell still parses."""
    docname = f"chapters/{chapter}/{notebook.removesuffix('.ipynb')}"
    chinese = nbformat.read(REPO / tr.SITE / "chapters" / chapter / notebook, as_version=4)
    spans = [(cell, literal) for cell in chinese.cells if cell.cell_type == "code" and not tr.graded(cell)
             for _, _, literal in tr.message_spans(cell.source)]
    for cell, _ in spans:
        compile(cell.source, cell.id, "exec")
    if docname in (tr.settings(REPO).get("messages_pending") or []):
        pytest.skip("its messages are still to be translated (messages_pending)")
    assert spans
    english = [literal for _, literal in spans if not re.search(r"[\u4e00-\u9fff]", literal)]
    # a message that is only code or a formula (`f"tgt_mask\n{...}"`, "self.dropout = nn.Dropout(dropout)",
    # "GELU(0) = 0 * Phi(0) = 0") has no words to translate: prose has two English words in a row
    words = [re.sub(r"\{[^}]*\}|\\n", " ", e.lstrip("f")[1:-1]) for e in english]
    assert not [e for e, w in zip(english, words) if re.search(r"[A-Za-z]+ [A-Za-z]+", w)], english


@pytest.mark.fast
def test_a_reworded_message_and_a_message_without_chinese_are_named(tmp_path):
    chapter, notebook = "01_embeddings", "embeddings.ipynb"
    root, release = _generated(tmp_path, chapter, notebook)
    old, new = '"the table must receive a gradient"', '"the embedding table must receive a gradient"'
    cell_id = next(c.id for c in nbformat.read(release, as_version=4).cells if old in c.source)
    _edit_cell(release, cell_id, lambda nb, i: setattr(nb.cells[i], "source", nb.cells[i].source.replace(old, new)))
    where = f"translations/zh/chapters/{chapter}/embeddings.messages.yml"
    assert tr.generate(root, root, only=chapter) == [
        f"{where}: cell {cell_id}: the message {new} has no Chinese",
        f"{where}: {old}: no assert of the notebook has this message any more"]
    # Until it is translated, the Chinese notebook shows the new message in English.
    shown = nbformat.read(root / "zh" / "chapters" / chapter / notebook, as_version=4)
    assert new in next(c for c in shown.cells if c.id == cell_id).source


@pytest.mark.fast
def test_an_unquoted_colon_in_a_messages_file_is_named_and_the_chinese_page_is_still_written(tmp_path):
    chapter, notebook = "01_embeddings", "embeddings.ipynb"
    root = _course_copy(tmp_path, chapter)
    where = f"translations/zh/chapters/{chapter}/embeddings.messages.yml"
    with open(root / where, "a") as f:
        f.write('f"{name}: a new message": f"{name}：新的消息"\n')  # YAML reads the first ": " as the key's end
    problems = tr.generate(root, root, only=chapter)
    assert len(problems) == 1 and problems[0].startswith(f"{where}: not valid YAML") and "needs quotes" in problems[0]
    assert (root / "zh" / "chapters" / chapter / notebook).is_file()


@pytest.mark.fast
@pytest.mark.parametrize("chinese,problem", [
    ('f"形状应为 (4, 4)，实际为 {tuple(sim.shape)}"', None),
    ('f"形状应为 (4, 4)，实际为 {sim.shape}"', "fields"),  # the code in a field is not the translator's
    ('"形状应为 (4, 4)"', "fields"),
    ('f"形状 {tuple(sim.shape)}" + "x"', "one Python string literal"),
    ('形状应为 (4, 4)', "one Python string literal"),
    (None, "one Python string literal"),
])
def test_a_chinese_message_keeps_the_fields_of_its_english(chinese, problem):
    found = tr.message_problem('f"expected (4, 4), got {tuple(sim.shape)}"', chinese)
    assert found is None if problem is None else problem in found


@pytest.mark.fast
def test_a_locked_markdown_cell_gets_the_checksum_of_its_translation():
    cell = nbformat.v4.new_markdown_cell("Read-only text.", id="intro-text")
    cell.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True, "grade_id": "intro-text", "schema_version": 3}
    cell.metadata.nbgrader["checksum"] = compute_checksum(cell)
    nb = nbformat.v4.new_notebook(cells=[cell])
    out = tr.translate_notebook(nb, {"intro-text": "只读的文字。"})
    assert out.cells[0].source == "只读的文字。"
    assert out.cells[0].metadata.nbgrader.checksum == compute_checksum(out.cells[0]) != cell.metadata.nbgrader.checksum


@pytest.mark.fast
def test_the_glossary_is_the_termbase_and_the_chinese_pages_follow_it():
    terms = tr.termbase((REPO / "glossary.md").read_text())
    assert tr.Term("Layer normalization", "层归一化") in terms and tr.Term("Beam search", "集束搜索") in terms and tr.Term("KV cache", "KV 缓存") in terms
    assert tr.Term("key", "键") in terms  # "Query, key, value (查询, 键, 值)" pairs in order
    # The Chinese glossary names each term by the notes' form the English entry gives.
    english_entries = tr.markdown_page("glossary", (REPO / "glossary.md").read_text()).units()
    chinese_entries = tr.read_sidecar(REPO, "glossary")
    for key, english in english_entries.items():
        forms = [t.chinese for t in tr.termbase(f"```{{glossary}}\n{english}\n```")]
        term_line = chinese_entries[key].text.split("\n", 1)[0]
        assert all(form in term_line for form in forms), (key, term_line)
    avoided = tr.other_renderings(tr.translate_text(*tr._glossary_shown(REPO)))
    assert "层规范化" in avoided["term-layer-normalization"] and "束搜索" in avoided["term-beam-search"]
    units = _zh_units()
    assert len({page for page, *_ in units}) >= 7  # chapters 1-4, the glossary, the toc, the config
    problems = []
    for page, key, english, chinese in units:
        where = f"{page}: cell {key}"
        problems += tr.term_problems(english, chinese, terms, where)
        if page != "glossary":
            problems += tr.rendering_problems(chinese, english, avoided, terms, where)
    assert problems == []


@pytest.mark.fast
def test_the_termbase_checks_can_fail():
    terms = tr.termbase((REPO / "glossary.md").read_text())
    avoided = {"term-layer-normalization": ["层规范化"], "term-beam-search": ["束搜索"]}
    english = "Each sub-layer ends with a layer normalization; the notes call it 层归一化 (see `LayerNorm`)."
    assert tr.term_problems(english, "每个子层都以层归一化结束；笔记称之为层归一化（见 `LayerNorm`）。", terms, "x") == []
    found = tr.term_problems(english, "每个子层都以层规范化结束（见 `LayerNorm`）。", terms, "x")
    assert found == ["x: the English says 'Layer normalization', the Chinese lacks '层归一化'",
                     "x: the English quotes '层归一化', the Chinese does not"]
    # The longest term wins: "padding mask" asks for 填充掩码, and its "mask" asks for nothing more.
    assert tr.term_problems("the padding mask", "填充掩码", terms, "x") == []
    assert tr.term_problems("the padding mask", "填充的掩码", terms, "x") == [
        "x: the English says 'Padding mask', the Chinese lacks '填充掩码'"]
    # Code and math are not prose: a `mask` argument asks for no translation.
    assert tr.term_problems("pass `mask=None` and $K$", "传入 `mask=None` 和 $K$", terms, "x") == []
    assert tr.rendering_problems("用集束搜索解码", "beam search", avoided, terms, "x") == []
    assert tr.rendering_problems("用束搜索解码，再做层规范化", "beam search", avoided, terms, "x") == [
        "x: uses '层规范化', which the glossary lists as another text's rendering",
        "x: uses '束搜索', which the glossary lists as another text's rendering"]
    # A quotation the English makes keeps its words.
    assert tr.rendering_problems("笔记写作层规范化", "the notes write 层规范化", avoided, terms, "x") == []


def _chinese_solution(chapter: str, notebook: str, folder: Path) -> Path:
    """The solution notebook of a chapter with its prose in Chinese (what a Chinese student submits)."""
    docname = f"chapters/{chapter}/{Path(notebook).stem}"
    nb = nbformat.read(REPO / "solutions" / chapter / notebook, as_version=4)
    pending = docname in set(tr.settings(REPO).get("pending") or [])
    shown, outcome = tr.translate_units(tr.notebook_page(docname, nb, REPO), tr.read_sidecar(REPO, docname), pending)
    assert outcome.problems == []
    (folder / chapter).mkdir(parents=True)
    path = folder / chapter / notebook
    nbformat.write(tr.translate_notebook(nb, shown), path)
    return path


@pytest.mark.slow
def test_each_chapter_s_solution_scores_the_same_in_both_languages(tmp_path):
    """Every chapter's solution, graded as it is and with its prose in Chinese: the same tests, the same points."""
    english, chinese = tmp_path / "en", tmp_path / "zh"

    def both(chapters):
        for chapter, notebook in chapters:
            (english / chapter).mkdir(parents=True)
            shutil.copy(REPO / "solutions" / chapter / notebook, english / chapter / notebook)
            _chinese_solution(chapter, notebook, chinese)

    # Chapter 12 trains the student's whole course: what decides its grade, given the seed, is the code it
    # gathers from the chapters, compared at the end; training it twice more here would double the suite's cost.
    graded = [e for e in REGISTRY if not e.runner]
    both(sorted({(e.chapter, e.notebook) for e in graded}))
    reports = {name: grade_path(folder) for name, folder in (("en", english), ("zh", chinese))}
    # Every scored test; lines worth 0 points (a time measured on a busy machine) may differ.
    seen = {name: [(t.name, t.score, t.max_score, t.status) for t in report.tests if t.max_score > 0]
            for name, report in reports.items()}
    assert seen["zh"] == seen["en"]
    assert reports["zh"].score == reports["zh"].max_score == sum(e.points for e in graded)
    assert {t.name.split(" ")[0] for t in reports["zh"].tests} == {e.id for e in graded}
    assert reports["zh"].seeds == reports["en"].seeds  # the same cases: the answers' code is the same
    runners = [e for e in REGISTRY if e.runner]
    both(sorted({(e.chapter, e.notebook) for e in runners}))
    for exercise in runners:
        gathered = {}
        for name, folder in (("en", english), ("zh", chinese)):
            notebooks = read_submission(folder)
            found = gather(notebooks, find_notebook(notebooks, exercise), exercise)
            assert found.error is None, (name, found.error)
            gathered[name] = [chunk["source"] for chunk in found.chunks]
        assert len(gathered["en"]) > 20 and gathered["zh"] == gathered["en"], exercise.id


@pytest.mark.fast
def test_the_lines_the_package_printed_read_in_chinese_on_the_chinese_pages():
    """"Here the cells below ran the reference `rate`; ..." printed on chapters 5-9's Chinese pages in English: every
    line the package prints itself is Chinese there, and the data around it is the English notebook's."""
    printed = 0
    for path in sorted((REPO / tr.SITE / "chapters").glob("*/*.ipynb")):
        lines = [line for cell in nbformat.read(path, as_version=4).cells for line in _stream_lines(cell.get("outputs", []))]
        assert not [line for line in lines if line.startswith(PRINTED)], path.parent.name
        printed += sum(line.startswith("在本页，下面的单元格运行的是参考实现") for line in lines)
    assert printed >= 10
