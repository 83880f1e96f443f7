"""The grader's parts that need no worker: wire format, comparison, extraction, archives,
mistake catalogue, cases, seeds and the results schema."""

from __future__ import annotations

import inspect
import json
import os
from decimal import Decimal
import stat
import zipfile

import jsonschema
import nbformat
import pytest
import torch

from autograder.sandboxed import procedure, wire
from autograder.cases import CASES, built, case_points, graded_cases
from autograder.compare import compare
from autograder.extract import (MAX_ZIP_MEMBERS, Notebook, SubmissionError, Unreadable, extract, parse_notebook,
                                read_submission)
from autograder.grade import (Report, TestResult, _expected, _judge, _provided, _reference_state, default_seed,
                              resolve)
from autograder.registry import REGISTRY, Exercise, by_id
from autograder.results import GRADESCOPE_SCHEMA, error_results, split_points, to_gradescope
from tests.grader_fixtures import ATTENTION, notebook

pytestmark = pytest.mark.fast


def _roundtrip(value):
    buffers: list[bytes] = []
    tree = wire.pack_value(value, buffers, 1 << 20)
    frame = wire.encode_frame({"value": tree, "buffers": [len(b) for b in buffers]}, buffers)
    r, w = os.pipe()
    try:
        wire.write_all(w, frame)
        header, out = wire.read_frame(r)
    finally:
        os.close(r)
        os.close(w)
    return wire.unpack_value(header["value"], out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int8, torch.uint8, torch.bool])
def test_tensors_cross_as_bytes_exactly(dtype):
    x = (torch.randn(3, 4, 5) * 10).to(dtype)
    y = _roundtrip((x[:, 1:], 2.5, None))  # non-contiguous view in a tuple
    assert y[0].dtype == dtype and y[0].shape == (3, 3, 5)
    assert torch.equal(y[0], x[:, 1:]) and y[1:] == (2.5, None)


def test_nan_and_unsupported_values_cross_as_data():
    nan, gen = _roundtrip((float("nan"), (i for i in range(3))))
    assert nan != nan
    assert isinstance(gen, wire.Unsupported) and "generator" in gen.why


def test_tensor_subclass_and_torch_function_are_stripped():
    class Liar(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return torch.zeros(1)

    x = torch.randn(4, 2)
    got = _roundtrip(x.as_subclass(Liar))
    assert type(got) is torch.Tensor and torch.equal(got, x)


def test_size_cap_and_malformed_bytes_are_refused():
    assert "size cap" in wire.pack_value(torch.zeros(1000), [], 100)["unsupported"]
    with pytest.raises(ValueError, match="do not match"):
        wire.unpack_value({"tensor": 0, "dtype": "float32", "shape": [4]}, [b"\0" * 12])
    with pytest.raises(ValueError):
        wire.unpack_value({"tensor": 0, "dtype": "object", "shape": [1]}, [b"\0"])


def test_compare_reports_shape_dtype_and_first_mismatch_without_values():
    e = torch.randn(2, 3, 4)
    assert compare(e.clone(), e, 1e-4, 1e-5).ok
    assert "shape (2, 4, 3)" in compare(e.transpose(1, 2), e, 1e-4, 1e-5).lines[0]
    assert "**Contract: dtype**: result is float64, expected float32" == compare(e.double(), e, 1e-4, 1e-5).lines[0]
    g = e.clone()
    g[1, 2, 0] += 1.0
    g[1, 2, 3] = float("nan")
    verdict = compare(g, e, 1e-4, 1e-5)
    text = "\n".join(verdict.lines)
    assert not verdict.ok and "first mismatch at index [1, 2, 0]" in text and "1 NaN" in text
    assert "max absolute error 1" in text and f"{e[1, 2, 0].item():.4f}" not in text
    assert not compare(torch.full((2,), float("nan")), torch.full((2,), float("nan")), 1e-4, 1e-5).ok
    assert "tuple of 2" in compare(e, (e, e), 1e-4, 1e-5).lines[0]


def _parsed(nb) -> Notebook:
    parsed = parse_notebook("attention.ipynb", nbformat.writes(nb).encode())
    assert isinstance(parsed, Notebook)
    return parsed


def test_extraction_keeps_definitions_and_the_answer_cell_only():
    before = [nbformat.v4.new_code_cell("%matplotlib inline\nSCALE = 2\nx = torch.randn(3)\nprint('plot')\n"
                                        "def helper(t):\n    return t")]
    after = [nbformat.v4.new_code_cell("out = attention(1, 2, 3)\nassert out is None")]
    ex = extract(_parsed(notebook(before=before, after=after)), by_id("ch03.attention"))
    code = "\n".join(c["source"] for c in ex.chunks)
    assert ex.error is None and "SCALE = 2" in code and "def helper" in code and "def attention" in code
    assert "randn" not in code and "print" not in code and "assert out" not in code
    assert "grade_in_notebook" not in code and "matplotlib" not in code


def test_extraction_finds_answers_by_name_and_reports_redefinitions():
    later = [nbformat.v4.new_code_cell("def attention(q, k, v, mask=None, dropout=None):\n    return q")]
    ex = extract(_parsed(notebook(after=later)), by_id("ch03.attention"))
    assert ex.error is None and any("defined again in cell 7" in n for n in ex.notes)
    assert ex.chunks[-1]["source"].startswith("def attention(q, k, v")  # runs last, so it wins
    ex = extract(_parsed(notebook(metadata=False, after=later)), by_id("ch03.attention"))
    assert any("no cell has the answer id" in n for n in ex.notes)
    assert ex.answer_source.startswith("def attention(q, k, v")


def test_syntax_errors_cost_only_their_exercise():
    broken = notebook(attention="def attention(q, k, v):\n    return q +\n")
    nb = _parsed(broken)
    assert "syntax error" in extract(nb, by_id("ch03.attention")).error
    other = extract(nb, by_id("ch03.softmax_saturation"))
    assert other.error is None and any("syntax error" in n for n in other.notes)


def test_answer_turned_into_markdown_is_missing():
    nb = notebook()
    nb.cells[2] = nbformat.v4.new_markdown_cell(nb.cells[2].source)
    assert "no definition of `attention`" in extract(_parsed(nb), by_id("ch03.attention")).error


@pytest.mark.parametrize("content", [b"{not json", b'<<<<<<< HEAD\n{"cells": []}\n=======\n{}\n>>>>>>> branch\n',
                                     b"\xff\xfe garbage"])
def test_unreadable_notebooks_are_reported_not_raised(content):
    parsed = parse_notebook("attention.ipynb", content)
    assert isinstance(parsed, Unreadable) and parsed.reason.startswith("could not read notebook")


def test_old_nbformat_is_upgraded():
    v3 = nbformat.writes(nbformat.convert(notebook(), 3)).encode()
    nb = parse_notebook("attention.ipynb", v3)
    assert isinstance(nb, Notebook) and extract(nb, by_id("ch03.attention")).error is None


def _zip(path, members, links=()):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return path


def test_zip_paths_are_normalised_and_links_skipped(tmp_path):
    good = nbformat.writes(notebook()).encode()
    path = _zip(tmp_path / "s.zip", [("../../evil/attention.ipynb", good), ("torch.py", b"raise SystemExit")],
                links=["link.ipynb"])
    notebooks = read_submission(path)
    assert [nb.name for nb in notebooks] == ["evil/attention.ipynb"]
    assert not (tmp_path.parent / "evil").exists()


def test_zip_bombs_and_floods_are_refused_before_reading(tmp_path):
    bomb = _zip(tmp_path / "bomb.zip", [("a.ipynb", b"\0" * (201 * 1024 * 1024))])
    assert bomb.stat().st_size < 2 * 1024 * 1024
    with pytest.raises(SubmissionError, match="200 MB"):
        read_submission(bomb)
    many = _zip(tmp_path / "many.zip", [(f"f{i}.txt", b"") for i in range(MAX_ZIP_MEMBERS + 1)])
    with pytest.raises(SubmissionError, match="at most"):
        read_submission(many)


def test_registry_collects_one_module_per_chapter_in_order():
    from autograder.registry import chapter_modules

    modules = chapter_modules()
    assert modules == sorted(modules) and len(modules) == len({m[:4] for m in modules}) >= 4
    assert [e.chapter[:2] for e in REGISTRY] == sorted(e.chapter[:2] for e in REGISTRY)
    assert {f"ch{e.chapter[:2]}_{e.chapter[3:]}" for e in REGISTRY} == set(modules)
    for exercise in REGISTRY:
        assert exercise.id in CASES and exercise.cases(0)
        assert resolve(exercise.reference) is not None


def _same(p, q) -> bool:
    if isinstance(p, torch.Tensor) or isinstance(q, torch.Tensor):
        return isinstance(p, torch.Tensor) and isinstance(q, torch.Tensor) and p.shape == q.shape and torch.equal(p, q)
    if isinstance(p, tuple) and isinstance(q, tuple):
        return len(p) == len(q) and all(_same(a, b) for a, b in zip(p, q))
    return p == q


def _same_inputs(x, y) -> bool:
    # A rule-judged case (chapter 12's Part B) draws what it samples into the rule's own arguments.
    return _same(x.args, y.args) and getattr(x.rule, "args", None) == getattr(y.rule, "args", None)


def test_hidden_inputs_are_fresh_per_seed_and_public_ones_fixed():
    for exercise_id, build in CASES.items():
        runs = [build(seed) for seed in (1, 2, 3, 4)]
        assert len({len(r) for r in runs}) == 1 and any(c.public for c in runs[0])
        varying = []
        for i, case in enumerate(runs[0]):
            same = [_same_inputs(case, r[i]) and r[i].public == case.public for r in runs[1:]]
            assert all(same) or not case.public, (exercise_id, case.title)  # public inputs are fixed
            varying.append(not all(same))
        assert any(varying), exercise_id  # hidden inputs change from one submission to the next


def test_seed_depends_on_the_answer_and_the_salt(monkeypatch):
    exercise = by_id("ch03.attention")
    one = extract(_parsed(notebook()), exercise)
    two = extract(_parsed(notebook(attention=ATTENTION + "\nEDITED = True\n")), exercise)
    unsalted = default_seed(exercise, one)
    assert unsalted == default_seed(exercise, extract(_parsed(notebook()), exercise)) != default_seed(exercise, two)
    monkeypatch.setenv("AUTOGRADER_SALT", "course secret")
    assert default_seed(exercise, one) != unsalted


def test_hidden_feedback_shows_no_inputs_but_public_feedback_does():
    exercise = by_id("ch03.attention")
    cases = CASES[exercise.id](7)
    reply = {"ok": True, "value": {"seq": [{"none": True}, {"none": True}]}}
    public = _judge(exercise, cases[0], "p", 1.0, resolve(exercise.reference), reply, [])
    hidden = _judge(exercise, cases[1], "h", 1.0, resolve(exercise.reference), reply, [])
    assert "Inputs:" in public.output and "Inputs:" not in hidden.output
    assert public.score == hidden.score == 0.0


def test_prerequisites_travel_as_source_and_never_the_exercise_itself():
    ex = Exercise(id="chXX.mha", chapter="xx", notebook="x.ipynb", name="MultiHeadedAttention", kind="module",
                  signature="", points=1, solution_grade_id="a", test_grade_id="b",
                  reference="tfm_solution.multihead:MultiHeadedAttention", cases=lambda seed: [],
                  prerequisites=("tfm_solution.attention:attention", "tfm_solution.cloning:clones"))
    source, names, modules = _provided(ex)
    assert names == ["attention", "clones"] and "def attention(" in source and "def clones(" in source
    assert "class MultiHeadedAttention" not in source and "softmax_saturation" not in source
    assert modules["tfm_solution"] == names and modules["tfm_solution.cloning"] == ["clones"]
    namespace: dict = {}
    exec(compile(source, "provided", "exec"), namespace)  # noqa: S102 - our own reference code
    q = torch.randn(2, 3, 4)
    torch.testing.assert_close(namespace["attention"](q, q, q)[0], resolve(ex.prerequisites[0])(q, q, q)[0])
    selfish = Exercise(**{**ex.__dict__, "prerequisites": ("tfm_solution.multihead:MultiHeadedAttention",)})
    with pytest.raises(ValueError, match="own prerequisite"):
        _provided(selfish)


def test_results_validate_against_gradescope_schema():
    report = Report(tests=[TestResult("a", 1.0, 1.0, "ok"), TestResult("b", 0.0, 2.0, "no")], seeds={"x": 1})
    results = to_gradescope(report)
    jsonschema.validate(results, GRADESCOPE_SCHEMA)
    assert results["score"] == 1.0 and [t["status"] for t in results["tests"]] == ["passed", "failed"]
    jsonschema.validate(error_results("boom"), GRADESCOPE_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(results, score="10"), GRADESCOPE_SCHEMA)
    json.dumps(results, allow_nan=False)


def test_case_points_are_cents_that_add_up_exactly_for_every_exercise():
    """Largest remainder in cents, by the cases' weights: the JSON's numbers, read as decimals, add up exactly,
    and a case of weight w gets w ordinary shares (to the cent)."""
    assert split_points(4, 3) == [1.34, 1.33, 1.33] and split_points(5, 4) == [1.25] * 4
    tests = []
    for exercise in REGISTRY:
        for seed in (0, 1, 2):
            cases = graded_cases(exercise, seed)
            parts = case_points(exercise.points, cases)
            exact = [Decimal(repr(p)) for p in parts]
            assert sum(exact) == exercise.points, (exercise.id, parts)
            assert all(d == d.quantize(Decimal("0.01")) for d in exact), parts
            unit = Decimal(exercise.points) / sum(c.weight for c in cases)
            assert all(abs(d - c.weight * unit) < Decimal("0.01") for d, c in zip(exact, cases)), parts
        tests += [TestResult(f"{exercise.id} case {i}", p, p, "passed") for i, p in enumerate(parts)]
        tests.append(TestResult(f"{exercise.id} notes", 0.0, 0.0, "a note"))
    results = json.loads(json.dumps(to_gradescope(Report(tests=tests))), parse_float=Decimal)
    total = sum(e.points for e in REGISTRY)
    assert sum(t["max_score"] for t in results["tests"]) == results["extra_data"]["max_score"] == total
    assert sum(t["score"] for t in results["tests"]) == results["score"] == total


def test_pytest_verdicts_decide_and_harness_errors_are_reported_not_raised():
    """The graded tests run under pytest; a case that crashes the harness is an
    "autograder error" line at 0, and the other cases still count."""
    from autograder.checks import run_checks
    from autograder.grade import ERROR_NOTE

    class FakeRun:
        exercise = by_id("ch03.attention")
        cases = [0, 1, 2]
        weights = [2.0, 2.0, 2.0]

        def __init__(self):
            self.results = {}

        def name(self, number):
            return f"case {number}"

        def case_result(self, number):
            if number == 1:
                raise RuntimeError("harness bug")
            result = TestResult(self.name(number), 2.0 if number == 0 else 0.0, 2.0, "out")
            self.results[number] = result
            return result

    run = FakeRun()
    run_checks([run])
    assert [r.score for _, r in sorted(run.results.items())] == [2.0, 0.0, 0.0]
    assert ERROR_NOTE in run.results[1].output and "harness bug" in run.results[1].output


def test_folders_skip_links_checkpoints_and_other_files(tmp_path):
    good = nbformat.writes(notebook())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "attention.ipynb").write_text(good)
    (tmp_path / "sub" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "sub" / ".ipynb_checkpoints" / "attention-checkpoint.ipynb").write_text(good)
    (tmp_path / "loop").symlink_to(tmp_path)  # a link cycle must not be walked
    (tmp_path / "stolen.ipynb").symlink_to(tmp_path / "sub" / "attention.ipynb")
    (tmp_path / "sitecustomize.py").write_text("raise SystemExit")
    assert [nb.name for nb in read_submission(tmp_path)] == ["sub/attention.ipynb"]


def test_nbgrader_pipeline_grades_in_the_sandbox_and_starts_no_kernel():
    from nbgrader.preprocessors import Execute, SaveAutoGrades

    from autograder.nbgrader_plugin import GradeOutsideKernel, autograde_preprocessors

    steps = autograde_preprocessors()
    assert Execute not in steps and steps.index(GradeOutsideKernel) < steps.index(SaveAutoGrades)


# ----------------------------------------------------------------------------- module exercises: rigor

def test_fixed_dropout_keeps_each_entry_with_probability_1_minus_p_and_scales_it():
    """The stand-in behaves like dropout (oracle: its definition), is the same on every replay,
    stands in for nn.Dropout, F.dropout and torch.dropout inside ``with``, and is undone after."""
    x = torch.rand(200, 300) + 1.0  # no zeros, so a zero means "dropped"
    original = torch.nn.functional.dropout
    with procedure.FixedDropout(seed=5):
        y = torch.nn.Dropout(0.3)(x)
        again = torch.nn.functional.dropout(x, 0.3)  # second call: another mask
        off = torch.nn.functional.dropout(x, 0.3, training=False)
    with procedure.FixedDropout(seed=5):
        replay = torch.dropout(x, 0.3, True)
    assert torch.nn.functional.dropout is original
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01
    torch.testing.assert_close(y[kept], x[kept] / 0.7)
    assert torch.equal(replay, y) and not torch.equal(again, y) and off is x
    with procedure.FixedDropout(seed=6):
        assert not torch.equal(torch.nn.functional.dropout(x, 0.3), y)  # the seed draws the mask
        assert torch.equal(torch.nn.functional.dropout(x.double(), 1.0), torch.zeros_like(x.double()))
        with pytest.raises(ValueError, match="between 0 and 1"):
            torch.nn.functional.dropout(x, 1.5)


_PE_ANSWER = """
import math
import torch
from torch import nn
import torch.nn.functional as F


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len={default}):
        super().__init__()
        self.p = dropout
        self.dropout = nn.Dropout({rate})
        position = torch.arange(max_len, dtype=torch.float64)[:, None]
        omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * omega), torch.cos(position * omega)
        {table}

    def forward(self, x):
        {forward}
"""
_PE_SLOTS = {"default": "5000", "rate": "dropout", "table": 'self.register_buffer("pe", pe.float()[None])',
             "forward": "return self.dropout(x + self.pe[:, : x.size(1)].to(x.dtype))"}


def _grade_in_process(exercise, source: str, seed: int = 77) -> list[tuple[str, bool, str]]:
    """Every graded case of ``exercise`` on an answer, judged here: (title, passed, feedback)."""
    from tests.grader_fixtures.inprocess import grade_source

    graded = grade_source(exercise, source, seed, diagnose=())
    return [(t.name, t.score >= t.max_score, t.output) for t in graded.lines]


_IN_PLACE = "x += self.pe[:, : x.size(1)].to(x.dtype)\n        return self.dropout(x)"
_NO_GRAD = "with torch.no_grad():\n            return self.dropout(x + self.pe[:, : x.size(1)].to(x.dtype))"


@pytest.mark.parametrize("change,fails", [
    ({}, ""),
    ({"forward": "return x + self.pe[:, : x.size(1)].to(x.dtype)"}, "training mode"),
    ({"forward": "return self.dropout(self.dropout(x + self.pe[:, : x.size(1)].to(x.dtype)))"}, "training mode"),
    ({"forward": "return self.dropout(x) + self.pe[:, : x.size(1)].to(x.dtype)"}, "training mode"),
    ({"rate": "0.1"}, "training mode"),
    ({"forward": "return self.dropout(x.detach() + self.pe[:, : x.size(1)].to(x.dtype))"}, "training mode"),
    ({"forward": _NO_GRAD}, "training mode"),
    ({"forward": "return F.dropout(x + self.pe[:, : x.size(1)].to(x.dtype), self.p, self.training)"}, ""),
    ({"forward": _IN_PLACE}, "inputs"),
    ({"forward": "return F.dropout(x + self.pe[:, : x.size(1)].to(x.dtype), self.p)"}, "eval mode"),
    ({"table": "self.pe = nn.Parameter(pe.float()[None])"}, "structure"),
    ({"table": "self.register_buffer('pe', pe.float()[None], persistent=False)"}, "structure"),
    ({"table": "self.pe = pe.float()[None]"}, "structure"),
    ({"table": "self.register_buffer('pe', pe.float())",
      "forward": "return self.dropout(x + self.pe[: x.size(1)].to(x.dtype))"}, "structure"),
    ({"default": "1000"}, "structure"),  # a wrong default: seen in one build only
])
def test_train_mode_and_structure_cases_catch_what_eval_mode_cannot(change, fails):
    """Right answers pass (nn.Dropout or F.dropout with the module's training flag); a dropout that is
    missing, doubled, misplaced or ignores its rate, or an input cut off from autograd, fails the
    training-mode cases only; F.dropout without the training flag (dropout in eval mode) fails the
    eval-mode cases; a table that is not a saved buffer of the reference's shape fails the structure
    line only (the module keeps its own table); an add in place into the caller's `x` fails every case
    that calls the module (the contract's inputs clause)."""
    exercise = by_id("ch02.PositionalEncoding")
    judged = _grade_in_process(exercise, _PE_ANSWER.format(**{**_PE_SLOTS, **change}))
    failed = [name for name, ok, _ in judged if not ok]
    train = [name for name, _, _ in judged if name.endswith("in training mode")]
    structure = [name for name, _, _ in judged if " structure: " in name]
    assert len(train) == 2 and len(structure) == 1
    calls = [n for n, _, _ in judged if n not in structure]
    expected = {"": [], "training mode": train, "structure": structure, "inputs": calls,
                "eval mode": [n for n in calls if n not in train]}[fails]
    assert failed == expected, judged
    if fails == "inputs":
        assert all("**Contract: inputs unchanged**: your code changed its argument `x` in place" in text
                   for name, _, text in judged if name in calls)


@pytest.mark.parametrize("got,line", [
    ({"parameters": [["pe", [1, 4, 2], True]], "buffers": [], "state_dict": [["pe", [1, 4, 2]]]},
     "`pe` is a trainable parameter; the reference registers it as a buffer"),
    ({"parameters": [], "buffers": [["pe", [1, 4, 2]]], "state_dict": []},
     "`pe` is a buffer left out of the state_dict (persistent=False)"),
    ({"parameters": [], "buffers": [], "state_dict": []}, "`pe` is missing: the reference has a buffer"),
    ({"parameters": [], "buffers": [["pe", [4, 2]]], "state_dict": [["pe", [4, 2]]]},
     "`pe` has shape (4, 2), expected shape (1, 4, 2)"),
    ({"parameters": [["scale", [], True]], "buffers": [["pe", [1, 4, 2]]], "state_dict": [["scale", []], ["pe", [1, 4, 2]]]},
     "your module has a parameter `scale` that the reference does not have"),
])
def test_structure_lines_name_the_difference(got, line):
    from autograder.compare import compare_structures, parse_structures

    expected = {"parameters": [], "buffers": [["pe", [1, 4, 2]]], "state_dict": [["pe", [1, 4, 2]]]}
    assert compare_structures([expected], [expected]).ok
    found = compare_structures(parse_structures({"builds": [got]}), [expected])
    assert not found.ok and any(line in text for text in found.lines), found.lines
    assert "the reference's state_dict holds: `pe` (1, 4, 2)" in found.lines[-1]


def test_frozen_parameters_other_builds_and_malformed_structures():
    from autograder.compare import compare_structures, parse_structures

    lut = {"parameters": [["lut.weight", [6, 4], True]], "buffers": [], "state_dict": [["lut.weight", [6, 4]]]}
    frozen = {**lut, "parameters": [["lut.weight", [6, 4], False]]}
    assert "`lut.weight` is frozen (requires_grad=False)" in compare_structures([frozen], [lut]).lines[0]
    assert "`lut.weight` is a buffer; it must be a trainable parameter" in compare_structures(
        [{"parameters": [], "buffers": [["lut.weight", [6, 4]]], "state_dict": [["lut.weight", [6, 4]]]}],
        [lut]).lines[0]
    # A slip only another build shows (here: a wrong default size) is named once, as such.
    wide = {"parameters": [["lut.weight", [9, 4], True]], "buffers": [], "state_dict": [["lut.weight", [9, 4]]]}
    found = compare_structures([lut, frozen, lut], [lut, wide, wide]).lines
    assert found[0] == "built with another case's arguments: `lut.weight` has shape (6, 4), expected shape (9, 4)"
    assert len(found) == 3 and "frozen" in found[1] and found[2].endswith("`lut.weight` (6, 4)")
    assert parse_structures({"builds": [lut, wide]}) == [lut, wide]
    for bad in (None, [], [None], [{**lut, "extra": []}], [{**lut, "parameters": [["w", [-1], True]]}],
                [{**lut, "buffers": [[1, [2]]]}], [{**lut, "state_dict": [["w" * 500, [2]]]}],
                [{**lut, "parameters": [["w", [2], "yes"]]}], [{**lut, "buffers": [["b", [1]]] * 1000}], [lut] * 9):
        with pytest.raises(ValueError):
            parse_structures({"builds": bad})
    with pytest.raises(ValueError):
        parse_structures({"builds": [lut], "more": 1})


def test_every_module_exercise_gets_structure_and_training_mode_cases():
    """Registry-driven: ``has_dropout`` is set exactly when the reference module takes a ``dropout`` argument
    and holds an ``nn.Dropout`` (then its training-mode cases use another rate); every module exercise (and
    every factory of one) has training-mode cases that compare the reference's parameters' gradients, and
    one structure line built with every distinct argument tuple."""
    for exercise in (e for e in REGISTRY if e.kind in ("module", "factory")):
        cases = CASES[exercise.id](3)
        constructs = [c.construct for c in cases if c.construct is not None and c.measure is None]
        reference = resolve(exercise.reference)
        module = reference(*built(constructs[0]))
        takes_dropout = "dropout" in inspect.signature(reference).parameters
        assert exercise.has_dropout == (takes_dropout and any(isinstance(m, torch.nn.Dropout)
                                                              for m in module.modules())), exercise.id
        assert sum(c.structure for c in cases) == 1 and cases[-1].structure
        assert [repr(a) for a in cases[-1].args] == list(dict.fromkeys(repr(c) for c in constructs))[:procedure.MAX_BUILDS]
        train = [c for c in cases if c.train]
        assert train and all(c.title.endswith("in training mode") for c in train)
        assert all(c.gradients == tuple(n for n, _ in reference(*built(c.construct)).named_parameters())
                   for c in train)
        if exercise.kind == "module":
            assert (train[0].construct != constructs[0]) == exercise.has_dropout
    for exercise in (e for e in REGISTRY if e.kind not in ("module", "factory") and not e.runner):
        cases = CASES[exercise.id](3)
        assert not exercise.has_dropout and not any(c.structure for c in cases)
        # a function trains only in the gradient copies its contract asks for
        assert all(c.title.endswith(", with gradients") for c in cases if c.train)
        assert any(c.train for c in cases) == bool(exercise.contract.gradients), exercise.id


@pytest.mark.parametrize("forward,fails", [
    ("self.lut(x) * math.sqrt(self.d_model)", False),
    ("self.lut(x).detach() * math.sqrt(self.d_model)", True),
    ("F.embedding(x, self.lut.weight.detach()) * math.sqrt(self.d_model)", True),
])
def test_training_mode_cases_compare_the_gradients_of_the_parameters(forward, fails):
    """Embeddings has no dropout, yet a lookup cut off from autograd would never train: its
    training-mode cases fail on the gradient of `lut.weight` (and only they do)."""
    source = ("import math\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n"
              "class Embeddings(nn.Module):\n    def __init__(self, d_model, vocab):\n        super().__init__()\n"
              "        self.lut = nn.Embedding(vocab, d_model)\n        self.d_model = d_model\n\n"
              f"    def forward(self, x):\n        return {forward}\n")
    judged = _grade_in_process(by_id("ch01.embeddings"), source)
    failed = [(name, text) for name, ok, text in judged if not ok]
    assert [n for n, _ in failed] == ([n for n, _, _ in judged if n.endswith("in training mode")] if fails else [])
    assert all("gradient of `lut.weight`" in text for _, text in failed)


def test_module_descriptions_are_built_alike_on_both_sides_and_only_from_known_names():
    """A case may describe a sublayer: the harness builds it from the reference package, the worker from
    the prerequisites it received; a name outside those, or a description nested without end, is refused."""
    from tfm_solution import MultiHeadedAttention, PositionwiseFeedForward

    description = {"module": "DecoderLayer", "size": 8, "self_attn": {"module": "MultiHeadedAttention", "h": 2,
                   "d_model": 8, "dropout": 0.0}, "src_attn": {"module": "MultiHeadedAttention", "h": 4,
                   "d_model": 8, "dropout": 0.2}, "feed_forward": {"module": "PositionwiseFeedForward", "d_model": 8,
                   "d_ff": 16, "dropout": 0.0}, "dropout": 0.1}
    layer = built(description)
    assert isinstance(layer.self_attn, MultiHeadedAttention) and (layer.self_attn.h, layer.src_attn.h) == (2, 4)
    assert layer.src_attn.dropout.p == 0.2 and layer.feed_forward.w_1.weight.shape == (16, 8)
    worker_side = {"MultiHeadedAttention": MultiHeadedAttention}
    assert isinstance(procedure.build_module_arg(description["self_attn"], worker_side), MultiHeadedAttention)
    with pytest.raises(ValueError, match="unknown module argument 'PositionwiseFeedForward'"):
        procedure.build_module_arg(description["feed_forward"], worker_side)
    with pytest.raises(ValueError, match="unknown module argument"):
        procedure.build_module_arg({"module": "eval", "source": "1"}, {})
    deep: dict = {"module": "PositionwiseFeedForward", "d_model": 4, "d_ff": 4}
    for _ in range(procedure.MAX_DESCRIPTION_DEPTH + 1):
        deep = {"module": "PositionwiseFeedForward", "d_model": deep, "d_ff": 4}
    with pytest.raises(ValueError, match="too deep"):
        procedure.build_module_arg(deep, {"PositionwiseFeedForward": PositionwiseFeedForward})
    assert procedure.build_module_arg(({"module": "scale", "factor": 2.0},))[0](torch.ones(2)).tolist() == [2.0, 2.0]


def test_xavier_counts_accept_xavier_uniform_and_name_every_other_initialization():
    """Judged on matrices drawn here by PyTorch's own initializers, with and without Xavier."""
    from autograder.compare import compare_xavier, xavier_counts

    torch.manual_seed(0)
    shapes = [(16, 16), (64, 16), (16, 64), (40, 16), (16, 16)]
    xavier = tuple(torch.nn.init.xavier_uniform_(torch.empty(s)) for s in shapes)
    assert xavier_counts(xavier) == (0, 0, 0, 0)
    defaults = tuple(torch.nn.Linear(s[1], s[0]).weight.detach() for s in shapes)   # kaiming_uniform(a=sqrt(5))
    assert xavier_counts(defaults) == (0, len(shapes), 0, 0)
    normal = tuple(torch.nn.init.xavier_normal_(torch.empty(s)) for s in shapes)
    assert xavier_counts(normal)[0] == len(shapes)
    embedding = (torch.nn.Embedding(40, 16).weight.detach(),)                       # N(0, 1)
    assert xavier_counts(embedding)[:2] == (1, 1)
    copied = (*xavier, xavier[0].clone())
    assert xavier_counts(copied) == (0, 0, 2, 0)
    poisoned = tuple(m.clone() for m in xavier)
    for m in poisoned:
        m[0, 0] = float("nan")       # NaN compares false: it must not pass the bound and the spread
    assert xavier_counts(poisoned) == (0, 0, 0, len(shapes))
    verdict = compare_xavier((defaults, False), (xavier, False))
    assert not verdict.ok and verdict.lines == [f"{len(shapes)} of {len(shapes)} matrices do not have the spread of "
                                                "Xavier-uniform values, std = bound / sqrt(3) (another initialization, "
                                                "or none: PyTorch's defaults differ)"]
    fresh = tuple(torch.nn.init.xavier_uniform_(torch.empty(s)) for s in shapes)
    assert compare_xavier((fresh, False), (xavier, False)).ok
    reseeded = compare_xavier((fresh, True), (xavier, False))
    assert not reseeded.ok and "**Contract: random numbers**" in reseeded.lines[0]
    assert not compare_xavier(((torch.zeros(3),), False), (xavier, False)).ok
    assert not compare_xavier(None, (xavier, False)).ok and not compare_xavier((poisoned, False), (xavier, False)).ok


def test_distinct_weights_separate_copies_and_leave_buffers_alone():
    """``Case.distinct``: clones of one prototype start equal; the state sent to the answer no longer is."""
    from autograder.exercises.shared import Case

    construct = (8, {"module": "MultiHeadedAttention", "h": 2, "d_model": 8, "dropout": 0.0},
                 {"module": "PositionwiseFeedForward", "d_model": 8, "d_ff": 16, "dropout": 0.0}, 0.1)
    reference = resolve("tfm_solution.encoder_decoder:EncoderLayer")
    plain = _reference_state(reference, Case("t", "c", True, (), construct=construct), 5)
    distinct = _reference_state(reference, Case("t", "c", True, (), construct=construct, distinct=True), 5)
    assert torch.equal(plain["sublayer.0.norm.a_2"], plain["sublayer.1.norm.a_2"])
    assert not torch.equal(distinct["sublayer.0.norm.a_2"], distinct["sublayer.1.norm.a_2"])
    assert all(not torch.equal(plain[k], distinct[k]) for k in plain)
    model = _reference_state(resolve("tfm_solution.encoder_decoder:make_model"),
                             Case("t", "c", True, (), construct=(7, 9, 1, 8, 16, 2, 0.1), distinct=True), 5)
    assert torch.equal(model["src_embed.1.pe"], resolve("tfm_solution:PositionalEncoding")(8, 0.1).pe)


def test_accumulation_driver_equals_training_on_the_merged_batches():
    """The ``"accumulation"`` driver run with the reference leaves the parameters that plain training on the
    merged groups leaves (each group's sentences padded into one batch, its mean token loss, one SGD step
    each): the quantity graded is equation (9.5)'s, computed here without the code under test."""
    from torch.nn.functional import nll_loss, pad as padded

    from tfm_solution import Batch
    from tfm_solution.training import train_with_accumulation

    case = next(c for c in CASES["ch09.train_with_accumulation"](5) if "unequal" in c.title)
    description, micro, accum_iter, lr = case.args
    got = _expected(train_with_accumulation, case, None, 3)
    torch.manual_seed(3)
    model = built(description).double().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    for start in range(0, len(micro), accum_iter):
        group = micro[start:start + accum_iter]
        widths = [max(pair[k].size(1) for pair in group) for k in (0, 1)]
        src, tgt = (torch.cat([padded(pair[k], (0, widths[k] - pair[k].size(1)), value=2) for pair in group])
                    for k in (0, 1))
        merged = Batch(src, tgt, 2)
        log_probs = model.generator(model(merged.src, merged.tgt, merged.src_mask, merged.tgt_mask))
        loss = nll_loss(log_probs.reshape(-1, log_probs.size(-1)), merged.tgt_y.reshape(-1), ignore_index=2,
                        reduction="sum") / merged.ntokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    steps = -(-len(micro) // accum_iter)
    torch.testing.assert_close(got[0], torch.cat([p.detach().flatten() for p in model.parameters()]),
                               rtol=1e-9, atol=1e-12)
    assert abs(got[1].item() - lr / (1 + steps)) < 1e-15 and got[2] == steps
    assert len({int(Batch(s, t, 2).ntokens) for s, t in micro}) > 1, "the micro-batches must differ in tokens"
