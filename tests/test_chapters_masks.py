"""Chapter 4: the reference masks against independent oracles, the notebook's visible tests
against the mistakes the chapter names (the grader's verdicts on every chapter are in ``test_grader_submissions.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.registry import by_id
from tfm_solution import Batch, attention, masked_softmax, subsequent_mask


REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "04_masks" / "masks.ipynb"
CHAPTER = "04_masks"
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ----------------------------------------------------------------------------- the reference


def _masked_softmax_oracle(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Equation (4.1) in float64: M e^(S - max) / sum M e^(S - max); a row with no visible entry is uniform."""
    s = scores.double()
    m = (mask != 0).expand_as(s).double()
    e = torch.exp(s - s.amax(-1, keepdim=True)) * m
    total = e.sum(-1, keepdim=True)
    uniform = torch.full_like(s, 1.0 / s.size(-1))
    return torch.where(total > 0, e / total.clamp_min(1e-300), uniform)


@pytest.mark.fast
@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_subsequent_mask_is_j_le_i(n):
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    got = subsequent_mask(n)
    assert got.dtype == torch.bool and got.shape == (1, n, n)
    assert torch.equal(got[0], j <= i)


@pytest.mark.fast
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_softmax_matches_the_float64_formula_in_every_dtype(dtype):
    scores = (3 * torch.randn(3, 2, 6, 7)).to(dtype)
    mask = torch.rand(3, 1, 6, 7) > 0.4
    mask[0, 0, 2] = False  # a fully hidden row
    got = masked_softmax(scores, mask)
    assert got.dtype == dtype and torch.isfinite(got).all()
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    torch.testing.assert_close(got.double(), _masked_softmax_oracle(scores, mask), rtol=tol, atol=tol)
    assert torch.all(got[~mask.expand_as(got) & mask.any(-1, keepdim=True).expand_as(got)] == 0)


@pytest.mark.fast
def test_masked_softmax_is_attentions_rule_and_a_plain_softmax_without_mask():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    mask = (torch.arange(5) < torch.tensor([[5], [2]]))[:, None, None, :] & subsequent_mask(5)[:, None]
    _, p_attn = attention(q, k, v, mask=mask)
    torch.testing.assert_close(masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(8), mask), p_attn)
    s = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(masked_softmax(s), torch.softmax(s, -1))
    int_mask = torch.tensor([[1, 0, 1, 0, 1, 0]])
    torch.testing.assert_close(masked_softmax(s, int_mask), masked_softmax(s, int_mask.bool()))


@pytest.mark.fast
def test_masked_softmax_rejects_integer_scores():
    with pytest.raises(TypeError, match="floating point"):
        masked_softmax(torch.ones(2, 3, dtype=torch.int64), torch.ones(2, 3))


@pytest.mark.fast
@pytest.mark.parametrize("pad", [0, 2])
def test_batch_against_a_loop_oracle(pad):
    g = torch.Generator().manual_seed(pad)
    lengths_src, lengths_tgt = [6, 3, 1], [7, 2, 5]
    src = torch.full((3, 6), pad)
    tgt = torch.full((3, 7), pad)
    for row, (ls, lt) in enumerate(zip(lengths_src, lengths_tgt, strict=True)):
        src[row, :ls] = torch.randint(3, 20, (ls,), generator=g)
        tgt[row, :lt] = torch.randint(3, 20, (lt,), generator=g)
    b = Batch(src, tgt, pad=pad)
    assert torch.equal(b.src, src)
    for row in range(3):
        assert b.src_mask[row, 0].tolist() == [c < lengths_src[row] for c in range(6)]
        n = 6
        assert b.tgt[row].tolist() == tgt[row, :n].tolist() and b.tgt_y[row].tolist() == tgt[row, 1:].tolist()
        for i in range(n):
            for j in range(n):
                visible = j <= i and j < lengths_tgt[row]  # tgt[:, :-1] keeps the first n ids
                assert bool(b.tgt_mask[row, i, j]) == visible, (row, i, j)
    assert b.tgt_mask.shape == (3, 6, 6) and b.tgt_mask.dtype == torch.bool
    assert b.ntokens.dim() == 0 and int(b.ntokens) == sum(lt - 1 for lt in lengths_tgt)
    assert torch.equal(b.tgt_mask, Batch.make_std_mask(b.tgt, pad))


# ----------------------------------------------------------------------------- visible tests vs mutants


def _visible_tests(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    return [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]


def _run_visible(prefix: str, names: dict) -> None:
    sources = _visible_tests(prefix)
    assert sources, f"no visible tests for {prefix}"
    for source in sources:
        exec(source, {"math": math, "torch": torch, "subsequent_mask": subsequent_mask, **names,  # noqa: S102
                      "print": lambda *a, **k: None})


def _mistake(exercise_id: str, name: str):
    from autograder.mistakes import mistake_function

    return mistake_function(exercise_id, name, by_id(exercise_id).name)


@pytest.mark.fast
@pytest.mark.parametrize("exercise_id,prefix,name", [
    ("ch04.subsequent_mask", "ch04-subsequent-mask", "subsequent_mask"),
    ("ch04.batch", "ch04-batch", "Batch"),
    ("ch04.masked_softmax", "ch04-masked-softmax", "masked_softmax"),
])
def test_visible_tests_pass_on_the_reference_and_fail_on_every_declared_mistake(exercise_id, prefix, name):
    reference = {"subsequent_mask": subsequent_mask, "Batch": Batch, "masked_softmax": masked_softmax}[name]
    _run_visible(prefix, {name: reference})
    for mistake in by_id(exercise_id).mistakes:
        with pytest.raises((AssertionError, RuntimeError)):
            _run_visible(prefix, {name: _mistake(exercise_id, mistake)})


@pytest.mark.fast
def test_a_class_exercise_answers_with_the_attributes_its_case_names():
    """The wire carries 0-dim tensors (``ntokens``), and a case's ``attributes`` turn an instance into data."""
    from autograder.sandboxed import wire
    from autograder.cases import CASES
    from autograder.grade import _expected

    buffers: list[bytes] = []
    tree = wire.pack_value(torch.tensor(7), buffers, 1 << 20)
    assert torch.equal(wire.unpack_value(tree, buffers), torch.tensor(7))
    case = CASES["ch04.batch"](0)[0]
    got = _expected(Batch, case)
    b = Batch(*case.args, **case.kwargs)
    assert case.attributes == ("src_mask", "tgt", "tgt_y", "tgt_mask", "ntokens")
    assert all(torch.equal(g, getattr(b, a)) for g, a in zip(got, case.attributes, strict=True))
