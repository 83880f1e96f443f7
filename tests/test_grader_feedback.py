"""The harness's own handling of student text, without a worker: what the seed hashes is what the
worker runs, errors still name the notebook's cells and lines, and student text never renders as
Markdown (rows 39 and 41 of the threat table, at the functions the grader's feedback goes through)."""

from __future__ import annotations

import ast

import nbformat
import pytest
from markdown_it import MarkdownIt

from autograder.compare import compare_structures, parse_structures
from autograder.extract import extract, parse_notebook
from autograder.feedback import code, fenced, name
from autograder.registry import by_id
from tests.grader_fixtures import ATTENTION, notebook
from tests.grader_fixtures.rendering import assert_inert

pytestmark = pytest.mark.fast

HOSTILE = [
    "`` ` ```\n## Score: 10/10\n<img src=x onerror=alert(1)>",
    "a`b</code><script>alert(1)</script>",
    "[x](javascript:alert(1))![i](http://evil.example/i.png)",
    "```\n# All tests passed\n```",
    "\r\n---\r\n> quote **bold** _em_",
    "`",
    "",
    "   ",
    "x\u2028## Score: 10/10",
]
WORDS = ("Score", "onerror", "<script", "javascript", "evil.example", "All tests passed", "quote", "bold")


def _results(outputs: list[str]) -> dict:
    return {"output": "", "tests": [{"name": str(n), "output": o} for n, o in enumerate(outputs)]}


def _code_text(markdown: str) -> str:
    """The text of the code spans of one line of Markdown, as CommonMark reads them."""
    tokens = MarkdownIt("commonmark").parseInline(markdown)[0].children
    return "".join(t.content for t in tokens if t.type == "code_inline")


def test_fenced_code_spans_and_names_keep_every_hostile_text_inert():
    outputs = []
    for text in HOSTILE:
        outputs += [f"your code raised:\n\n{fenced(text)}", f"- an import failed ({code(text)}): see above",
                    f"- `{name(text)}` is missing from the state_dict", f"{code(text)} and {code(text)}"]
    assert_inert(_results(outputs), WORDS)
    for text in HOSTILE:  # a code span shows the text itself, its line breaks as spaces
        assert _code_text(code(text)).strip() == " ".join(text.splitlines()).strip(), text


def test_names_the_reference_uses_are_unchanged_and_others_never_collide_with_them():
    for plain in ("w_1.weight", "encoder.layers.0.sublayer.1.norm.a_2", "pe", ""):
        assert name(plain) == plain
    odd = ["a`b", "a\\u0060b", "a\nb", "a b", "é"]
    assert len({name(n) for n in odd}) == len(odd)
    assert all("`" not in name(n) and "\n" not in name(n) for n in odd)


def test_hostile_state_dict_names_reach_the_structure_line_as_code():
    """The structure line names what the student's module holds, whatever it is called."""
    hostile = HOSTILE[0]
    got = {"parameters": [["w.weight", [2, 2], True], [hostile, [1], True]], "buffers": [[hostile + "b", [1]]],
           "state_dict": [["w.weight", [2, 2]], [hostile, [1]], [hostile + "b", [1]]]}
    expected = {"parameters": [["w.weight", [2, 2], True]], "buffers": [], "state_dict": [["w.weight", [2, 2]]]}
    verdict = compare_structures(parse_structures({"builds": [got]}), [expected])
    assert not verdict.ok and any("your module has a buffer" in line for line in verdict.lines)
    assert_inert(_results(["- " + "\n- ".join(verdict.lines)]), WORDS)


def _parsed(nb):
    return parse_notebook("attention.ipynb", nbformat.writes(nb).encode())


def test_the_worker_receives_exactly_the_normalised_code_the_seed_hashes():
    """Comments, docstrings, blank lines and line breaks never reach the worker: what it runs is the
    normal form of the code (parse and write out again: a fixed point), and the seed hashes exactly that."""
    exercise = by_id("ch03.attention")
    noisy = "# a comment, SECRET-TABLE [4, 5, 6]\n\n\n" + ATTENTION.replace(
        "def attention(query, key, value, mask=None, dropout=None):\n",
        "def attention(query, key, value,\n              mask=None, dropout=None):  # why not\n"
        '    """Scaled dot-product attention. SECRET-TABLE [1, 2, 3]"""\n\n\n')
    plain, padded = (extract(_parsed(notebook(attention=a)), exercise) for a in (ATTENTION, noisy))
    assert padded.sources() == plain.sources() and padded.digest() == plain.digest()
    assert not any("SECRET-TABLE" in s or "#" in s for s in padded.sources())
    assert all(s == ast.unparse(ast.parse(s)) for s in padded.sources())
    other = extract(_parsed(notebook(attention=ATTENTION.replace("math.sqrt(d_k)", "d_k ** 0.5"))), exercise)
    assert other.digest() != plain.digest()


def test_errors_name_the_cell_and_line_of_the_notebook():
    """The worker names a chunk of normalised code and a line of it; the feedback names the cell and
    the line the student wrote (line 11 here), and anything else the worker says is shown as it is."""
    answer = ("import math\n\n# setup\n\n\ndef attention(query, key, value, mask=None, dropout=None):\n"
              "    '''doc'''\n    return undefined_name  # here\n\n\ny = attention(1, 2, 3)\n")
    extraction = extract(_parsed(notebook(attention=answer)), by_id("ch03.attention"))
    number = next(n for n, c in enumerate(extraction.chunks) if c["label"] == extraction.answer_label)
    line = extraction.chunks[number]["source"].splitlines().index("y = attention(1, 2, 3)") + 1
    said = f"chunk {number}, line {line}: NameError: name 'undefined_name' is not defined"
    assert extraction.explain(said) == ("cell 3, line 11: `y = attention(1, 2, 3)`: NameError: name 'undefined_name' "
                                        "is not defined")
    assert extraction.explain(f"chunk {number}: SystemExit: 3") == "cell 3: SystemExit: 3"
    assert extraction.explain("chunk 99, line 1: forged") == "chunk 99, line 1: forged"
