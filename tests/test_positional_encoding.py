"""Sinusoidal positional encodings against the closed form, and the relative-position rotation."""

import math

import pytest
import torch

from tfm_solution import PositionalEncoding, positional_encoding, rotation_matrix

pytestmark = pytest.mark.fast


def test_matches_closed_form_in_float64():
    seq_len, d_model = 60, 16
    pe = positional_encoding(seq_len, d_model, dtype=torch.float64)
    for pos in range(seq_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_float32_table_stays_accurate_at_long_positions():
    pe32 = positional_encoding(5000, 512)
    pe64 = positional_encoding(5000, 512, dtype=torch.float64)
    assert pe32.dtype == torch.float32
    assert (pe32.double() - pe64).abs().max() < 1e-6


@pytest.mark.parametrize("k", [1, 3, 17])
def test_one_rotation_per_offset_for_every_position(k):
    # Enough positions that even the slowest pair turns through a radian: the fit is then unique.
    d_model, n = 16, 6000
    pe = positional_encoding(n + k, d_model, dtype=torch.float64)
    here, there = pe[:n], pe[k : n + k]
    # Fit the single linear map R with there = here @ R^T by least squares over all positions:
    fitted = torch.linalg.lstsq(here, there).solution.T
    torch.testing.assert_close(here @ fitted.T, there, rtol=0, atol=1e-9)
    # ... and it is block-diagonal with one 2x2 rotation per dimension pair.
    torch.testing.assert_close(fitted, rotation_matrix(k, d_model), rtol=0, atol=1e-6)
    for i in range(0, d_model, 2):
        block = fitted[i : i + 2, i : i + 2]
        torch.testing.assert_close(block @ block.T, torch.eye(2, dtype=torch.float64), rtol=0, atol=1e-6)
        assert torch.det(block).item() == pytest.approx(1.0, abs=1e-6)
    off_blocks = fitted.clone()
    for i in range(0, d_model, 2):
        off_blocks[i : i + 2, i : i + 2] = 0
    assert off_blocks.abs().max() < 1e-6


def test_module_adds_the_table_slice_and_keeps_it_out_of_training():
    module = PositionalEncoding(8, dropout=0.0, max_len=50)
    x = torch.randn(2, 10, 8)
    torch.testing.assert_close(module(x), x + positional_encoding(10, 8))
    assert "pe" in module.state_dict() and not list(module.parameters())
    with pytest.raises(ValueError, match="max_len"):
        module(torch.randn(1, 51, 8))


def test_odd_width_is_rejected():
    with pytest.raises(ValueError, match="even"):
        positional_encoding(4, 7)
