"""Grading right both ways, for every exercise of the registry: its contract, its declared alternatives
(correct answers the text allows: full marks on several seeds), its wrong answers (declared mistakes and
mutants: below 90% with a named reason), the contract stated in its text and exercised by its visible
tests, and the machinery the universal checks rest on (the wire, the module walk, the comparisons)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from autograder.sandboxed import procedure, wire
from autograder.cases import graded_cases, initial_names
from autograder.compare import compare
from autograder.contract import START, clauses, marked, markdown, statement_index, visible_cells
from autograder.exercises.shared import CHECKS, MUTANT_CEILING, resolve
from autograder.registry import REGISTRY, by_id
from autograder.sandbox import REPO_ROOT, _check_value, _Malformed

from .grader_fixtures.inprocess import PRELUDE, grade_source

ALTERNATIVE_SEEDS = (1, 2, 3)
#: The exercises the harness grades case by case against the reference; chapter 12's are judged by rules
#: on a model trained from the student's whole course (``Exercise.runner``), where no contract applies.
HARNESS = [e for e in REGISTRY if not e.runner]
UNIVERSAL = {"dtype", "gradients", "modes", "inputs", "random", "attributes", "init"}


def _ids(exercises) -> list[str]:
    return [e.id for e in exercises]


# ----------------------------------------------------------------------------- the registry's contracts

@pytest.mark.fast
def test_every_exercise_declares_a_contract_that_fits_its_kind():
    """Every exercise has a contract, three alternatives or more, and contract fields the harness can honour:
    modes exactly for modules, gradients naming real arguments of functions, a float64 case wherever the dtype
    is kept, an init clause exactly where the reference builds a value the text fixes, rule keys of its own."""
    for exercise in HARNESS:
        contract = exercise.contract
        assert contract is not None, exercise.id
        assert len(exercise.alternatives) >= 3, exercise.id
        module = exercise.kind in ("module", "factory")
        assert contract.modes == (("eval", "train") if module else ()), exercise.id
        if contract.gradients:
            reference = resolve(exercise.reference)
            assert exercise.kind == "function", exercise.id
            assert set(contract.gradients) <= set(__import__("inspect").signature(reference).parameters)
        cases = graded_cases(exercise, 11)
        floating = [t for c in cases for t in (*c.args, *c.kwargs.values()) if isinstance(t, torch.Tensor)]
        if contract.keeps_dtype:
            assert any(t.dtype == torch.float64 for t in floating) or any(c.double for c in cases), exercise.id
        if module:
            structure = next(c for c in cases if c.structure)
            fixed = any(initial_names(exercise.reference, repr(b), b) for b in structure.args)
            assert bool(contract.init) == fixed, exercise.id
        keys = [key for key, _ in clauses(exercise)]
        assert len(keys) == len(set(keys)) and all(k not in UNIVERSAL for k, _ in contract.rules), exercise.id
        assert contract.pure or contract.pure_text, exercise.id
        assert not contract.draws or contract.draws_text, exercise.id
        assert set(contract.may_widen) <= set(exercise.return_names), exercise.id


@pytest.mark.fast
@pytest.mark.parametrize("exercise_id", _ids(HARNESS))
def test_statement_states_the_contract_and_visible_tests_exercise_each_clause(exercise_id):
    """The solution notebook's statement of the exercise ends with its contract as ``make chapters`` writes it
    (so the text states every clause the grader checks), the student's notebook shows the same, and a visible
    test marks each clause with ``# contract: <key>``."""
    exercise = by_id(exercise_id)
    for folder in ("solutions", "chapters"):
        cells = nbformat.read(REPO_ROOT / folder / exercise.chapter / exercise.notebook, as_version=4).cells
        index = statement_index(cells, exercise)
        assert index is not None and cells[index].source.count(START) == 1, (folder, exercise.id)
        assert cells[index].source.rstrip().endswith(markdown(exercise)), (folder, exercise.id)
    missing = {key for key, _ in clauses(exercise)} - marked(visible_cells(cells, exercise))
    assert not missing, f"{exercise.id}: no visible test marks the clauses {sorted(missing)}"


# ----------------------------------------------------------------------------- hidden cases: other inputs only

#: What a case holds that is its inputs: a hidden case may differ from its public counterpart here only.
#: (``double`` and ``distinct`` are inputs too: the module's dtype, the weights loaded into it.)
CASE_INPUTS = {"title", "checks", "public", "args", "kwargs", "construct", "double", "distinct", "rtol", "atol",
               "attributes", "rule"}


def _judged_as(case) -> tuple:
    """How a case is judged, everything but its inputs: what is called, how and in which mode, which
    gradients and attributes come back, what is marked, what the contract checks on it, its weight."""
    from dataclasses import fields

    from autograder.cases import watched

    return (*((f.name, getattr(case, f.name)) for f in fields(case) if f.name not in CASE_INPUTS),
            ("rule", case.rule is not None), ("watched", watched(case)))


def _floating_dtypes(case) -> tuple:
    tensors = [t for t in (*case.args, *case.kwargs.values()) if isinstance(t, torch.Tensor)]
    return case.double, tuple(sorted({str(t.dtype) for t in tensors if t.is_floating_point()}))


def hidden_without_counterpart(cases) -> list[str]:
    """The titles of the hidden cases that no public case checks the same way, with what differs.

    A hidden case's counterpart is a public case judged alike (``_judged_as``), reading the same attributes
    or more; where it has the same floating-point dtypes its tolerances are no looser than the hidden case's
    (a tolerance follows the dtype: float64 cases are held to float64's). The structure line has one case
    for all builds: it must build a public case's arguments too."""
    public = [c for c in cases if c.public]
    found = []
    for case in cases:
        if case.public:
            continue
        if case.structure:
            if not any(p.construct is not None and p.construct in case.args for p in public):
                found.append(f"{case.title}: builds no public case's arguments")
            continue
        alike = [p for p in public if _judged_as(p) == _judged_as(case) and set(case.attributes) <= set(p.attributes)]
        if not alike:
            found.append(f"{case.title}: judged unlike every public case")
            continue
        same_dtype = [p for p in alike if _floating_dtypes(p) == _floating_dtypes(case)]
        if same_dtype and not any(case.rtol >= p.rtol and case.atol >= p.atol for p in same_dtype):
            found.append(f"{case.title}: tolerances tighter than its public counterpart's")
    return found


@pytest.mark.fast
def test_hidden_cases_differ_from_the_public_ones_in_their_inputs_only():
    """Every hidden case of every case-graded exercise, on two seeds, has a public counterpart judged the same
    way (``hidden_without_counterpart``): no requirement is checked only where the student cannot see it.
    The cases are built, never run (no worker)."""
    found = sorted({f"{e.id} {line}" for e in HARNESS for seed in (5, 11)
                    for line in hidden_without_counterpart(graded_cases(e, seed))})
    assert not found, found


@pytest.mark.fast
def test_a_hidden_case_judged_otherwise_has_no_counterpart():
    """The check above fails on hidden cases that differ in more than their inputs: marked, trained, another
    method, a tighter tolerance for the same dtype, one more attribute; and passes other inputs, another dtype
    with its own tolerance, fewer attributes."""
    import dataclasses

    from autograder.exercises.shared import Case

    x = torch.ones(2, 3)
    public = Case("public", "(public)", True, (x,), attributes=("a", "b"))
    hidden = dataclasses.replace(public, title="hidden", checks="other words", public=False, args=(2 * x, x))
    assert hidden_without_counterpart([public, hidden]) == []
    fine = [dataclasses.replace(hidden, args=(x.double(),), rtol=1e-9, atol=1e-12),
            dataclasses.replace(hidden, attributes=("a",)), dataclasses.replace(hidden, rtol=1e-3)]
    assert hidden_without_counterpart([public, *fine]) == []
    for change in ({"marked": ("conv1d",)}, {"train": True}, {"method": "decode"}, {"atol": 1e-8},
                   {"attributes": ("a", "b", "c")}, {"judge": "nucleus"}, {"weight": 2}):
        assert hidden_without_counterpart([public, dataclasses.replace(hidden, **change)]), change
    structure = Case("parameters", "", False, ((4,), (5,)), structure=True)
    built = dataclasses.replace(public, construct=(4,))
    assert hidden_without_counterpart([built, structure]) == []
    assert hidden_without_counterpart([dataclasses.replace(built, construct=(3,)), structure])


# ----------------------------------------------------------------------------- right both ways

@pytest.mark.parametrize("exercise_id", _ids(HARNESS))
def test_declared_alternatives_get_full_marks(exercise_id):
    """Each correct answer the text allows gets every point, on several seeds (fresh hidden inputs each)."""
    exercise = by_id(exercise_id)
    for name, source in exercise.alternatives.items():
        for seed in ALTERNATIVE_SEEDS:
            graded = grade_source(exercise, source, seed, diagnose=())
            failed = [(t.name, t.output[-800:]) for t in graded.failed()]
            assert graded.score == exercise.points and not failed, (name, seed, failed)


@pytest.mark.parametrize("exercise_id", _ids(HARNESS))
def test_wrong_answers_lose_points_with_a_named_reason(exercise_id):
    """Each declared mistake, and each mutant (a breach of the contract), scores below 90% of the exercise's
    points, and a failed line names it: the mistake's diagnosis, or the universal check that caught the mutant.
    A library shortcut is the exception by design: it costs nothing and is named on the policy line."""
    exercise = by_id(exercise_id)
    for name, mistake in exercise.mistakes.items():
        graded = grade_source(exercise, mistake.source, 5, diagnose=(name,))
        assert graded.share < MUTANT_CEILING, (name, graded.score)
        assert graded.says(f"**Diagnosis: {name}**"), (name, [t.output for t in graded.failed()])
    for name, mutant in exercise.mutants.items():
        declared = mutant.caught_by in exercise.mistakes
        graded = grade_source(exercise, mutant.source, 5, diagnose=(mutant.caught_by,) if declared else ())
        reason = f"**Diagnosis: {mutant.caught_by}**" if declared else CHECKS.get(mutant.caught_by, mutant.caught_by)
        assert graded.says(reason), (name, reason, [(t.name, t.output) for t in graded.failed()])
        if mutant.caught_by == "policy":
            assert graded.score == exercise.points
        else:
            assert graded.share < MUTANT_CEILING, (name, graded.score)


def test_the_correct_answers_that_used_to_lose_points_get_full_marks():
    """An nn.Conv1d filled with copy_ (float32 throughout, as the contract states), the schedule typed as the
    stub's docstring writes it and as step / warmup ** 1.5 (scalars compared with a tolerance), beam search
    scored in float64 (the contract accepts float64 scores): full marks, on more seeds than the others."""
    chosen = {"ch06.conv1d_feed_forward": ("conv1d_modules",), "ch09.rate": ("docstring_expression",
              "over_warmup_power"), "ch10.beam_step": ("float64_scoring",)}
    for exercise_id, names in chosen.items():
        exercise = by_id(exercise_id)
        for name in names:
            for seed in range(4, 12):
                graded = grade_source(exercise, exercise.alternatives[name], seed, diagnose=())
                assert graded.score == exercise.points, (exercise_id, name, seed,
                                                        [t.output for t in graded.failed()])


# ----------------------------------------------------------------------------- the machinery

@pytest.mark.fast
def test_strings_and_dtypes_cross_the_wire_and_nothing_else_new():
    buffers: list[bytes] = []
    value = ("post", torch.float16, torch.int8, (torch.ones(2), "pre"))
    tree = wire.pack_value(value, buffers, 1 << 20)
    _check_value(json.loads(json.dumps(tree)), [len(b) for b in buffers], set(), 0, [0])
    assert wire.unpack_value(tree, buffers)[:3] == ("post", torch.float16, torch.int8)
    assert "characters" in wire.pack_value("x" * (wire.MAX_STRING_CHARS + 1), [], 1 << 20)["unsupported"]
    assert "dtype complex64" in wire.pack_value(torch.complex64, [], 1 << 20)["unsupported"]
    for bad in ({"str": 3}, {"str": "x" * (wire.MAX_STRING_CHARS + 1)}, {"torch_dtype": "complex64"}):
        with pytest.raises(_Malformed):
            _check_value(bad, [], set(), 0, [0])
        with pytest.raises(ValueError):
            wire.unpack_value(bad, [])


class _Liar(torch.nn.Module):
    """A module whose methods describe something else than what it holds."""

    def __init__(self):
        super().__init__()
        self.kept = torch.nn.Linear(3, 2)
        self.hidden = torch.nn.Linear(2, 2)

    def named_parameters(self, *args, **kwargs):
        return iter([("kept.weight", self.kept.weight)])

    def parameters(self, recurse=True):
        return iter([torch.nn.init.xavier_uniform_(torch.empty(2, 3))])

    def state_dict(self, *args, **kwargs):
        return {}


@pytest.mark.fast
def test_the_module_walk_lists_what_pytorch_lists_and_ignores_what_a_module_says_of_itself():
    """Oracle: PyTorch's own named_parameters, named_buffers and state_dict on plain modules (shared
    submodules, tied tensors, a non-persistent buffer, a whole model); then a module that overrides them."""
    from tfm_solution import make_model

    shared = torch.nn.Linear(4, 4)
    plain = torch.nn.Sequential(shared, torch.nn.ReLU(), shared, torch.nn.BatchNorm1d(4))
    plain.register_buffer("scratch", torch.zeros(2), persistent=False)
    tied = torch.nn.Module()
    tied.a, tied.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    tied.b.weight = tied.a.weight
    for module in (plain, tied, make_model(7, 9, N=1, d_model=8, d_ff=16, h=2)):
        found = procedure.walk_module(module)
        assert [n for n, _ in found["parameters"]] == [n for n, _ in module.named_parameters()]
        assert [n for n, _ in found["buffers"]] == [n for n, _ in module.named_buffers()]
        assert [n for n, _ in found["state_dict"]] == list(module.state_dict())
        assert all(t is dict(module.named_parameters())[n] for n, t in found["parameters"])
    liar = _Liar()
    described = procedure.describe_structure(liar)
    assert [n for n, _, _ in described["parameters"]] == ["kept.weight", "kept.bias", "hidden.weight", "hidden.bias"]
    assert [k for k, _ in described["state_dict"]] == ["kept.weight", "kept.bias", "hidden.weight", "hidden.bias"]
    assert [tuple(m.shape) for m in procedure.matrices(liar)] == [(2, 3), (2, 2)]
    assert torch.equal(procedure.matrices(liar)[0], liar.kept.weight)
    loop = torch.nn.Module()
    loop.me = torch.nn.Linear(1, 1)
    object.__getattribute__(loop, "__dict__")["_modules"]["again"] = loop
    with pytest.raises(ValueError, match="nested too deep"):
        procedure.walk_module(loop)


@pytest.mark.fast
def test_scalars_compare_with_a_tolerance_and_say_by_how_much_without_the_value():
    assert compare(0.1 + 0.2, 0.3, 1e-4, 1e-5).ok  # the last bit differs: within 1e-12
    far = compare(1.001 * 7e-4, 7e-4, 1e-4, 1e-5)
    assert not far.ok and "larger than the expected value by a relative error of 0.001" in far.lines[0]
    assert "0.0007" not in far.lines[0] and "expected a float, got a float" not in far.lines[0]
    assert compare(3, 3.0, 1e-4, 1e-5).lines == ["result: expected a float, got a int"]
    assert compare(96, 12, 0, 0).lines == ["result: your int is 8 times the expected value"]
    assert not compare(float("nan"), 1.0, 0, 0).ok and not compare(float("nan"), float("nan"), 0, 0).ok
    assert compare("post", "post", 0, 0).ok and not compare("pre", "post", 0, 0).ok
    assert compare(torch.float16, torch.float16, 0, 0).ok and not compare(torch.float32, torch.float16, 0, 0).ok


@pytest.mark.fast
def test_infinities_where_finite_values_belong_are_named():
    expected = torch.zeros(40)
    got = expected.clone()
    got[:2] = -torch.inf
    lines = compare(got, expected, 1e-4, 1e-5).lines
    assert "result: 2 value(s) are -inf where the expected value is not" in lines
    assert "max absolute error 0" in lines[-1] and "among the finite values" in lines[-1]
    lines = compare(expected, got, 1e-4, 1e-5).lines
    assert "result: 2 value(s) should be -inf and are not" in lines


@pytest.mark.fast
def test_the_policy_line_sees_the_matrix_product_operator():
    """``a @ b`` and ``a @= b`` call matmul: a shortcut where matmul is banned (chapter 6's convolutions)."""
    from autograder.extract import Extraction, shortcut_uses

    def uses(source: str) -> list[str]:
        return shortcut_uses(Extraction(chunks=[{"source": source, "label": "a"}], answer_source=source), ("matmul",))

    assert uses("def f(x, w):\n    return x @ w") == ["matmul"]
    assert uses("def f(x, w):\n    x @= w\n    return x") == ["matmul"]
    assert uses("def f(x, w):\n    return x * w") == []


@pytest.mark.fast
def test_generators_are_seeded_watched_and_put_back():
    """``worker.Generators``: inside, the three generators start from the seed; after, what a call did to them
    is kept and they are as they were before; the harness compares with the seed's states."""
    from autograder.compare import moved_generators

    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    with procedure.Generators(17) as quiet:
        pass
    with procedure.Generators(17) as noisy:
        torch.rand(1)
        random.random()
    assert moved_generators(quiet.after, 17) == []
    assert "torch's and Python's (`random`)" in moved_generators(noisy.after, 17)[0]
    assert moved_generators(quiet.after, 18) != []
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2])


# ----------------------------------------------------------------------------- through real workers

@pytest.mark.slow
def test_the_contract_holds_through_the_sandboxed_worker(tmp_path):
    """The universal checks on the real path: chapter 7 graded from its student notebook with LayerNorm's
    gain and bias swapped (the initial values, read in the worker) and its input shifted in place (which the
    norm cancels: its values stay right, the caller's x does not), and a
    SublayerConnection alternative whose Post-LN cases get the string "post" over the wire; chapter 11's
    kv_cache_bytes given torch dtypes over the wire."""
    from autograder.grade import grade_path

    from .notebook_answers import release_with, solution_answers

    layer_norm, sublayer = by_id("ch07.LayerNorm"), by_id("ch07.SublayerConnection")
    folder = REPO_ROOT / "solutions" / layer_norm.chapter
    answers = solution_answers(folder / layer_norm.notebook)
    answers[layer_norm.id] = PRELUDE + layer_norm.mutants["gain_and_bias_swapped"].source.replace(
        "        mean = x.mean(-1, keepdim=True)",
        "        x += 1  # a shift the norm cancels: only the caller sees it\n        mean = x.mean(-1, keepdim=True)")
    answers[sublayer.id] = PRELUDE + sublayer.alternatives["flag_and_add"]
    path = release_with(REPO_ROOT / "chapters" / layer_norm.chapter / layer_norm.notebook, tmp_path / "ch07", answers)
    report = grade_path(path, chapter="07")
    lost = [t.output for t in report.tests if t.score < t.max_score]
    assert report.exercise_score(sublayer.id) == sublayer.points, lost
    lines = [t for t in report.tests if t.name.startswith(layer_norm.id + " ") and t.score < t.max_score]
    assert report.exercise_score(layer_norm.id) < MUTANT_CEILING * layer_norm.points
    assert any(CHECKS["init"] in t.output and "`a_2`" in t.output for t in lines)
    assert any(CHECKS["inputs"] in t.output for t in lines)
    assert any("Post-LN" in t.name for t in report.tests if t.name.startswith(sublayer.id + " "))

    kv = by_id("ch11.kv_cache_bytes")
    answers = {kv.id: PRELUDE + kv.alternatives["itemsize"]}
    path = release_with(REPO_ROOT / "chapters" / kv.chapter / kv.notebook, tmp_path / "ch11", answers)
    report = grade_path(path, only=kv.id)
    assert report.exercise_score(kv.id) == kv.points, [t.output for t in report.tests if t.score < t.max_score]
    assert sum("a torch dtype" in t.name for t in report.tests) == 3


@pytest.mark.fast
def test_the_chinese_course_states_the_contract_in_chinese_and_translators_never_see_it():
    """On every translated page (not pending) each statement in ``zh/`` ends with the contract rendered in
    Chinese from the grading module, and no English clause is left; the unit a translator translates (and
    whose hash a translation records) is the statement's hand-written part only, so a change of the
    contract leaves every translation valid; a declared sentence without Chinese is named as a problem."""
    import dataclasses

    from autograder.contract import hand_written, localized
    from scripts import translations as tr

    pending = set(tr.settings(REPO_ROOT).get("pending") or [])
    translated = [e for e in HARNESS if f"chapters/{e.chapter}/{Path(e.notebook).stem}" not in pending]
    assert {e.chapter[:2] for e in translated} >= {"01", "02", "03", "04"}
    for exercise in translated:
        cells = nbformat.read(REPO_ROOT / "zh" / "chapters" / exercise.chapter / exercise.notebook, as_version=4).cells
        statement = cells[statement_index(cells, exercise)].source
        assert statement.rstrip().endswith(markdown(exercise, "zh")), exercise.id
        assert "**Contract.**" not in statement and "a call draws no random numbers" not in statement, exercise.id
        assert hand_written(statement).strip() and START not in hand_written(statement), exercise.id

    exercise = by_id("ch03.attention")
    docname = f"chapters/{exercise.chapter}/{Path(exercise.notebook).stem}"
    nb = nbformat.read(REPO_ROOT / "chapters" / exercise.chapter / exercise.notebook, as_version=4)
    index = statement_index(nb.cells, exercise)
    units = tr.notebook_page(docname, nb).units()
    changed = dataclasses.replace(exercise, contract=dataclasses.replace(exercise.contract, dtype="float16 only"))
    nb.cells[index].source = hand_written(nb.cells[index].source) + "\n\n" + markdown(changed)
    assert tr.notebook_page(docname, nb).units() == units  # the stamps stay valid
    assert localized(markdown(changed), "zh") is None  # no exercise has that contract (nor Chinese for it)
    assert [p for p in tr.contract_problems(docname, nb) if nb.cells[index].id in p]
    shown = tr.translate_notebook(nb, units).cells[index].source
    assert shown.endswith(markdown(changed))  # without Chinese, the English contract is shown, not dropped
