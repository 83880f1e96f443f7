"""Scaled dot-product attention against PyTorch's own kernel and its defining properties."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tfm_solution import attention, subsequent_mask

pytestmark = pytest.mark.fast


def _padding_mask(lengths, len_k):
    """(b, 1, 1, len_k): True at the first ``length`` keys of each sequence."""
    return (torch.arange(len_k)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


@pytest.mark.parametrize("kind", ["none", "padding", "causal", "both"])
def test_matches_scaled_dot_product_attention(kind):
    b, h, n, d_k = 3, 4, 7, 16
    q, k, v = (torch.randn(b, h, n, d_k, dtype=torch.float64) for _ in range(3))
    mask = None
    if kind in ("padding", "both"):
        mask = _padding_mask([7, 4, 1], n)
    if kind in ("causal", "both"):
        causal = subsequent_mask(n)[:, None]
        mask = causal if mask is None else mask & causal
    out, p_attn = attention(q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert p_attn.shape == (b, h, n, n)


def test_weights_are_distributions_and_masked_keys_get_zero():
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = _padding_mask([5, 2], 5) & subsequent_mask(5)[:, None]
    _, p_attn = attention(q, k, v, mask=mask)
    torch.testing.assert_close(p_attn.sum(-1), torch.ones(2, 3, 5))
    hidden = ~mask.expand_as(p_attn)
    assert torch.all(p_attn[hidden] == 0)
    assert torch.all(p_attn[~hidden] > 0)


def test_hand_computed_two_by_two():
    # q·k scores: [[1, 0], [0, 1]] scaled by 1/sqrt(2); softmax by hand.
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    k = q.clone()
    v = torch.tensor([[10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    out, p = attention(q, k, v)
    a = math.exp(1 / math.sqrt(2))
    w_same, w_other = a / (a + 1), 1 / (a + 1)
    torch.testing.assert_close(p, torch.tensor([[w_same, w_other], [w_other, w_same]], dtype=torch.float64))
    torch.testing.assert_close(out, 10 * p)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fully_masked_rows_are_finite_in_low_precision(dtype):
    q, k, v = (torch.randn(2, 2, 4, 8, dtype=dtype) for _ in range(3))
    mask = _padding_mask([4, 0], 4)  # the second sequence is all padding
    out, p_attn = attention(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(p_attn).all()
    # A partially masked row still gives exactly zero weight to masked keys.
    mask = _padding_mask([3, 1], 4)
    _, p_attn = attention(q, k, v, mask=mask)
    assert torch.all(p_attn[0, :, :, 3] == 0) and torch.all(p_attn[1, :, :, 1:] == 0)


def test_dropout_acts_on_the_weights():
    q, k, v = (torch.randn(1, 1, 6, 4) for _ in range(3))
    drop = nn.Dropout(0.5).train()
    _, p_attn = attention(q, k, v, dropout=drop)
    assert (p_attn == 0).any(), "dropout should zero some attention weights"
    _, p_eval = attention(q, k, v, dropout=drop.eval())
    torch.testing.assert_close(p_eval.sum(-1), torch.ones(1, 1, 6))
