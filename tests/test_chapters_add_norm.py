"""Chapter 7: the reference's Add & Norm against independent oracles, and the notebook's visible tests
against the mistakes the grader declares (its verdicts on every chapter are in ``test_grader_submissions.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from autograder.mistakes import mistake_function
from autograder.registry import by_id
from tfm_solution import LayerNorm, SublayerConnection, make_model

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "07_add_norm" / "add_norm.ipynb"

pytestmark = pytest.mark.fast


def _hand_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The notes' LayerNorm at initialization, from sums (float64)."""
    d = x.size(-1)
    mean = x.sum(-1, keepdim=True) / d
    std = (((x - mean) ** 2).sum(-1, keepdim=True) / (d - 1)).sqrt()
    return (x - mean) / (std + eps)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_sublayer_connection_is_the_hand_formula_with_a_linear_sublayer(position):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 12, generator=g, dtype=torch.float64) * 2 + 1
    w = torch.randn(12, 12, generator=g, dtype=torch.float64)
    module = SublayerConnection(12, 0.0, position).double().eval()
    got = module(x, lambda y: y @ w)
    expected = x + _hand_norm(x) @ w if position == "pre" else _hand_norm(x + x @ w)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("position", ["pre", "post"])
def test_dropout_acts_once_on_the_sublayer_output_only(position):
    """A recording stand-in for the dropout: it must see exactly the sublayer's output, once."""
    seen = []

    class Half(nn.Module):
        def forward(self, t):
            seen.append(t.clone())
            return 0.5 * t

    x = torch.randn(2, 4, 8, dtype=torch.float64)
    module = SublayerConnection(8, 0.3, position).double()
    module.dropout = Half()
    sub_out = []
    out = module(x, lambda y: sub_out.append(3 * y) or 3 * y)
    assert len(seen) == 1 and torch.equal(seen[0], sub_out[0])
    expected = x + 0.5 * sub_out[0] if position == "pre" else _hand_norm(x + 0.5 * sub_out[0])
    torch.testing.assert_close(out, expected)


def test_make_model_builds_both_layer_norm_flavours_and_placements_with_the_notes_keys():
    notes = make_model(11, 11, N=2, d_model=16, d_ff=32, h=4)
    torch_kind = make_model(11, 11, N=2, d_model=16, d_ff=32, h=4, layer_norm="torch")
    post = make_model(11, 11, N=2, d_model=16, d_ff=32, h=4, norm_position="post")
    kinds = {m.kind for m in torch_kind.modules() if isinstance(m, LayerNorm)}
    assert kinds == {"torch"} and {m.kind for m in notes.modules() if isinstance(m, LayerNorm)} == {"notes"}
    assert notes.state_dict().keys() == torch_kind.state_dict().keys()
    final_norms = {"encoder.norm.a_2", "encoder.norm.b_2", "decoder.norm.a_2", "decoder.norm.b_2"}
    assert set(notes.state_dict()) - set(post.state_dict()) == final_norms


def test_layer_norm_of_a_single_feature_is_nan_as_the_chapter_says():
    assert LayerNorm(1)(torch.tensor([[3.0]])).isnan().all()


# ----------------------------------------------------------------------------- visible tests vs mutants


def _visible_tests(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    return [c.source for c in cells
            if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]


def _run_visible(prefix: str, names: dict) -> None:
    sources = _visible_tests(prefix)
    assert sources, f"no visible tests for {prefix}"
    for source in sources:
        exec(source, {"math": math, "torch": torch, "nn": nn, **names, "print": lambda *a, **k: None})  # noqa: S102


CASES = [
    ("ch07.LayerNorm", "ch07-layer-norm", {}),
    ("ch07.SublayerConnection", "ch07-sublayer-connection", {"LayerNorm": LayerNorm}),
]


@pytest.mark.parametrize("exercise_id,prefix,context", CASES)
def test_visible_tests_pass_on_the_reference_and_fail_on_every_declared_mistake(exercise_id, prefix, context):
    exercise = by_id(exercise_id)
    reference = {"LayerNorm": LayerNorm, "SublayerConnection": SublayerConnection}[exercise.name]
    _run_visible(prefix, {**context, exercise.name: reference})
    assert exercise.mistakes, exercise_id
    for name in exercise.mistakes:
        wrong = mistake_function(exercise_id, name, exercise.name)
        # A mistake's cell may define its own helpers (its LayerNorm): run the tests with those.
        own = {k: v for k, v in wrong.__init__.__globals__.items() if k in context}
        with pytest.raises((AssertionError, RuntimeError)):
            _run_visible(prefix, {**context, **own, exercise.name: wrong})
