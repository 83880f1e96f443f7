"""Chapter 3: the reference ``softmax_saturation`` against float64 formulas, and the notebook's
visible tests against the mistakes the chapter warns about."""

import math
from pathlib import Path

import nbformat
import pytest
import torch

from tfm_solution import attention, softmax_saturation

pytestmark = pytest.mark.fast


def _largest_weight_oracle(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """max_j softmax(s)_j = 1 / sum_j exp(s_j - max s), from einsum scores in float64."""
    s = torch.einsum("...qd,...kd->...qk", q.double(), k.double()) * scale
    return 1.0 / torch.exp(s - s.amax(-1, keepdim=True)).sum(-1)


@pytest.mark.parametrize("shape_q,shape_k", [((5, 8), (7, 8)), ((2, 3, 4, 16), (2, 3, 6, 16)), ((2, 1, 4, 32), (1, 3, 5, 32))])
@pytest.mark.parametrize("scaled", [True, False])
def test_matches_float64_formula(shape_q, shape_k, scaled):
    q, k = torch.randn(shape_q), torch.randn(shape_k)
    got = softmax_saturation(q, k, scaled=scaled)
    scale = 1 / math.sqrt(q.size(-1)) if scaled else 1.0
    expected = _largest_weight_oracle(q, k, scale).float()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert got.shape == expected.shape == torch.broadcast_shapes(shape_q[:-2], shape_k[:-2]) + (shape_q[-2],)


def test_agrees_with_the_weights_of_attention():
    q, k, v = torch.randn(3, 6, 64), torch.randn(3, 9, 64), torch.randn(3, 9, 5)
    _, p_attn = attention(q, k, v)
    torch.testing.assert_close(softmax_saturation(q, k), p_attn.amax(-1))


def test_hand_computed_case():
    q = torch.tensor([[1.0, 1.0]])
    k = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    e2, e_root2 = math.exp(2.0), math.exp(math.sqrt(2.0))
    assert softmax_saturation(q, k, scaled=False).item() == pytest.approx(e2 / (e2 + 1))
    assert softmax_saturation(q, k, scaled=True).item() == pytest.approx(e_root2 / (e_root2 + 1))


def test_bounds_and_the_saturation_the_chapter_teaches():
    q, k = torch.randn(512, 256), torch.randn(16, 256)
    scaled, unscaled = softmax_saturation(q, k), softmax_saturation(q, k, scaled=False)
    for values in (scaled, unscaled):
        assert bool(((values >= 1 / 16 - 1e-7) & (values <= 1 + 1e-7)).all())
    # Unscaled scores have standard deviation 16 here: nearly one-hot rows. Scaled ones stay spread.
    assert unscaled.mean() > 0.9 > 0.5 > scaled.mean()
    assert softmax_saturation(torch.zeros(4, 8), torch.randn(5, 8)).tolist() == pytest.approx([0.2] * 4)


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="share d_k"):
        softmax_saturation(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        softmax_saturation(torch.randn(4), torch.randn(3, 4))


# The chapter's visible tests must catch the mistakes the chapter warns about.

_NOTEBOOK = Path(__file__).resolve().parents[1] / "solutions" / "03_attention" / "attention.ipynb"


def _visible_tests(prefix: str) -> list[str]:
    cells = nbformat.read(_NOTEBOOK, as_version=4).cells
    return [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]


def _run_visible(prefix: str, name: str, fn) -> None:
    for source in _visible_tests(prefix):
        exec(source, {"math": math, "torch": torch, name: fn, "print": lambda *a, **k: None})


def _scores(q, k, scale=True):
    s = torch.matmul(q, k.transpose(-2, -1))
    return s / math.sqrt(q.size(-1)) if scale else s


def _missing_scale(q, k, v, mask=None, dropout=None):
    s = _scores(q, k, scale=False)
    p = (s if mask is None else s.masked_fill(mask == 0, -1e9)).softmax(-1)
    return p @ v, p


def _wrong_axis(q, k, v, mask=None, dropout=None):
    s = _scores(q, k)
    p = (s if mask is None else s.masked_fill(mask == 0, -1e9)).softmax(-2)
    return p @ v, p


def _mask_after_softmax(q, k, v, mask=None, dropout=None):
    p = _scores(q, k).softmax(-1)
    p = p if mask is None else p.masked_fill(mask == 0, 0.0)
    return p @ v, p


def _neg_inf(q, k, v, mask=None, dropout=None):
    s = _scores(q, k)
    p = (s if mask is None else s.masked_fill(mask == 0, float("-inf"))).softmax(-1)
    p = p if dropout is None else dropout(p)
    return p @ v, p


def _ignores_dropout(q, k, v, mask=None, dropout=None):
    return attention(q, k, v, mask=mask)


def _returns_weights_before_dropout(q, k, v, mask=None, dropout=None):
    out, _ = attention(q, k, v, mask=mask, dropout=dropout)
    return out, attention(q, k, v, mask=mask)[1]


@pytest.mark.parametrize("mutant", [_missing_scale, _wrong_axis, _mask_after_softmax, _neg_inf, _ignores_dropout,
                                    _returns_weights_before_dropout])
def test_visible_attention_tests_fail_on_known_mistakes(mutant):
    _run_visible("ch03-attention", "attention", attention)  # the reference passes them
    with pytest.raises(AssertionError):
        _run_visible("ch03-attention", "attention", mutant)


@pytest.mark.parametrize(
    "mutant",
    [
        lambda q, k, scaled=True: softmax_saturation(q, k, scaled=True),  # ignores the flag
        lambda q, k, scaled=True: (_scores(q, k, scaled).softmax(-1)).amin(-1),  # min instead of max
        lambda q, k, scaled=True: _scores(q, k, scaled).softmax(-2).amax(-1),  # softmax over the queries
    ],
)
def test_visible_saturation_tests_fail_on_known_mistakes(mutant):
    _run_visible("ch03-softmax-saturation", "softmax_saturation", softmax_saturation)
    with pytest.raises(AssertionError):
        _run_visible("ch03-softmax-saturation", "softmax_saturation", mutant)
