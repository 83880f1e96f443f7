"""The reference answers of chapter 3's second exercise, ``softmax_saturation``, against float64 formulas."""

import math

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
