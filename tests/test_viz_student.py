"""The message above every widget says truthfully who drew it: a preview of the reference, the
student's own code, or the reference standing in for a stub (``tfm_solution.viz.student``)."""

import io
import linecache
import re
import tokenize
from pathlib import Path

import nbformat
import pytest
import torch

from tfm_solution import attention, subsequent_mask
from tfm_solution.viz import attention as ch3
from tfm_solution.viz import batch_builder, library_lookup, mask_explorer, peek_demo
from tfm_solution.viz.student import SOLUTION_MARKER, is_course_solution, resolve

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]


def _define(source: str, name: str, cell: str):
    """Run ``source`` the way IPython runs a cell: its text registered in linecache under the cell's name."""
    filename = f"<cell {cell}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = {"torch": torch, "reference": attention}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


_SOLUTION_CELL = f'''
def attention(query, key, value, mask=None, dropout=None):
    """The course's answer, as the solution notebook holds it."""
    {SOLUTION_MARKER}
    return reference(query, key, value, mask, dropout)
    ### END SOLUTION
'''
_STUDENT_CELL = '''
def attention(query, key, value, mask=None, dropout=None):
    return reference(query, key, value, mask, dropout)
'''
_STUB_CELL = '''
def attention(query, key, value, mask=None, dropout=None):
    # YOUR CODE HERE
    raise NotImplementedError()
'''
_BUGGY_CELL = '''
def attention(query, key, value, mask=None, dropout=None):
    p = torch.matmul(query, key.transpose(-2, -1)).softmax(-1)
    return p @ value, p
'''
_SOLUTION_CLASS_CELL = f'''
class Batch:
    def __init__(self, src, tgt=None, pad=2):
        {SOLUTION_MARKER}
        from tfm_solution import Batch as Reference
        vars(self).update(vars(Reference(src, tgt, pad)))
        ### END SOLUTION
'''


@pytest.mark.parametrize(
    "cell,status,source,words",
    [
        (_SOLUTION_CELL, "preview", "reference", ("Preview drawn with the reference `attention`", "your own")),
        (_STUDENT_CELL, "ok", "student", ("Drawn with your own `attention`.",)),
        (_STUB_CELL, "stub", "reference", ("still a stub", "shows the reference")),
        (_BUGGY_CELL, "differs", "student", ("your own", "differ")),
    ],
)
def test_the_message_says_who_drew(cell, status, source, words):
    fn = _define(cell, "attention", status)
    used = resolve(fn, attention, ch3._probe_attention, "attention")
    assert (used.status, used.source) == (status, source)
    assert used.yours == (source == "student")
    assert all(w in used.message for w in words), used.message
    assert used.message in used.banner().value.replace("&#x27;", "'")


def test_a_preview_never_claims_the_students_code():
    used = resolve(_define(_SOLUTION_CELL, "attention", "p"), attention, ch3._probe_attention, "attention")
    assert not used.message.startswith("Drawn with your own") and used.fn is attention


def test_solution_cells_are_recognised_for_functions_and_classes_only_by_the_marker():
    assert is_course_solution(_define(_SOLUTION_CELL, "attention", "f"))
    assert is_course_solution(_define(_SOLUTION_CLASS_CELL, "Batch", "c"))
    assert not is_course_solution(_define(_STUDENT_CELL, "attention", "s"))
    assert not is_course_solution(attention), "the reference package holds no solution markers"
    assert not is_course_solution(lambda q: q)


def test_a_wrong_course_solution_is_not_hidden_behind_the_preview():
    buggy_solution = _BUGGY_CELL.replace("    p = ", f"    {SOLUTION_MARKER}\n    p = ")
    used = resolve(_define(buggy_solution, "attention", "b"), attention, ch3._probe_attention, "attention")
    assert used.status == "differs"


def test_every_chapter_widget_shows_the_preview_for_the_solution_and_your_own_for_a_student():
    solution = _define(_SOLUTION_CELL, "attention", "w1")
    student = _define(_STUDENT_CELL, "attention", "w2")
    for widget in (library_lookup, mask_explorer):
        assert "Preview drawn with the reference" in widget(solution).children[0].value
        assert "your own" in widget(student).children[0].value
    mask_solution = _define(
        f"def subsequent_mask(size):\n    {SOLUTION_MARKER}\n    return torch.ones(1, size, size).tril().bool()\n",
        "subsequent_mask", "w3")
    assert "Preview drawn with the reference `subsequent_mask`" in peek_demo(mask_solution).children[0].value
    batch = _define(_SOLUTION_CLASS_CELL, "Batch", "w4")
    assert "Preview drawn with the reference `Batch`" in batch_builder(batch, max_words=2).children[0].value
    assert subsequent_mask(2).all(-1).any()  # the reference stays importable next to the stand-ins


def test_under_ipython_a_cell_with_markers_is_a_preview_and_one_without_is_yours():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("from tfm_solution.viz.student import resolve\nfrom tfm_solution.viz import attention as ch3\n"
                   "import tfm_solution")
    shell.run_cell(_SOLUTION_CELL.replace("reference(", "tfm_solution.attention("))
    shell.run_cell("used = resolve(attention, tfm_solution.attention, ch3._probe_attention, 'attention')")
    assert shell.user_ns["used"].status == "preview"
    shell.run_cell(_STUDENT_CELL.replace("reference(", "tfm_solution.attention("))
    shell.run_cell("used = resolve(attention, tfm_solution.attention, ch3._probe_attention, 'attention')")
    assert shell.user_ns["used"].status == "ok"


_VIEW = "application/vnd.jupyter.widget-view+json"
_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.mark.parametrize("chapter", sorted(p.parent.name for p in (REPO / "chapters").glob("0[1-4]_*/*.ipynb")))
def test_released_notebooks_show_the_preview_wording_never_your_own(chapter):
    """What the website and a fresh student notebook show: every banner of a widget says "Preview"."""
    (path,) = (REPO / "chapters" / chapter).glob("*.ipynb")
    nb = nbformat.read(path, as_version=4)
    state = nb.metadata["widgets"][_STATE]["state"]
    texts = [m["state"].get("value", "") for m in state.values() if m["model_name"] == "HTMLModel"]
    banners = [t for t in texts if re.search(r"Drawn with|Preview drawn|still a stub|raised", t)]
    views = sum(_VIEW in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert views and len(banners) >= views, f"{chapter}: {len(banners)} banners for {views} widgets"
    assert all("Preview drawn with the reference" in t for t in banners), banners


# ----------------------------------------------------------------------------- the chapters' check cells

def test_check_cells_run_the_reference_while_the_answer_is_a_stub_and_say_so_once(capsys):
    from tfm_solution import make_model, rate
    from tfm_solution.viz.checks import ANSWERS, yours_or_reference

    stub = _define("def rate(step, model_size, factor, warmup):\n    raise NotImplementedError()\n", "rate", "k1")
    assert yours_or_reference(stub) is rate and yours_or_reference(stub) is rate
    printed = capsys.readouterr().out
    assert printed.count("still a stub") == 1 and "reference `rate`" in printed
    mine = _define("def rate(step, model_size, factor, warmup):\n    return reference(step, model_size, factor, warmup)\n",
                   "rate", "k2")
    mine.__globals__["reference"] = rate
    assert yours_or_reference(mine) is mine and "your own `rate`" in capsys.readouterr().out
    wrong = _define("def rate(step, model_size, factor, warmup):\n    return 1.0\n", "rate", "k3")
    assert yours_or_reference(wrong) is wrong and "differ" in capsys.readouterr().out
    before = torch.random.get_rng_state()
    yours_or_reference(make_model)           # the probe seeds torch; the kernel's generator is left alone
    assert torch.equal(before, torch.random.get_rng_state())
    with pytest.raises(ValueError, match="no reference"):
        yours_or_reference(lambda x: x)
    # every reference answers its own probe (a probe that crashed on a correct answer would blame students)
    for name, (reference, probe) in ANSWERS.items():
        assert probe(reference) is not None, name


def _stub_names_called_in_plain_cells(path: Path) -> list[str]:
    """Code cells of a released notebook that call an exercise's name directly although they are not
    graded: in a fresh student notebook that name is a stub, and the cell would stop with a traceback."""
    nb = nbformat.read(path, as_version=4)
    names, found = [], []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if "raise NotImplementedError()" in cell.source:
            names += re.findall(r"^(?:def|class) (\w+)", cell.source, re.M)
        elif not cell.metadata.get("nbgrader", {}).get("grade_id"):
            called = _called_names(cell.source)
            found += [f"cell {i}: {n}(" for n in names if n in called]
    return found


def _called_names(source: str) -> set[str]:
    """Names called in ``source`` (a name token followed by an opening parenthesis, not an attribute),
    read with Python's tokenizer, so that text inside strings does not count."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
    return {a.string for prev, a, b in zip([None, *tokens], tokens, tokens[1:])
            if a.type == tokenize.NAME and b.string == "(" and not (prev and prev.string == ".")}


@pytest.mark.parametrize("chapter", sorted(p.parent.name for p in (REPO / "chapters").glob("*/*.ipynb")
                                           if p.parent.name >= "05"))
def test_a_fresh_student_notebook_calls_its_stubs_only_in_exercise_cells(chapter):
    (path,) = (REPO / "chapters" / chapter).glob("*.ipynb")
    assert _stub_names_called_in_plain_cells(path) == []


def test_the_stub_call_check_can_fail(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def gelu(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()"),
        nbformat.v4.new_code_cell("widget(gelu)\nGELU = yours_or_reference(gelu)"),
        nbformat.v4.new_code_cell('print("gelu(x) in a string")\nmodel.gelu(x)'),
        nbformat.v4.new_code_cell("y = gelu(x)")])
    nbformat.write(nb, tmp_path / "x.ipynb")
    assert _stub_names_called_in_plain_cells(tmp_path / "x.ipynb") == ["cell 3: gelu("]
