"""Chapter 6: the reference feed-forward network, its convolution form and GELU against
independent oracles (``nn.Conv1d``, per-position loops, the normal CDF, PyTorch's GELU)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tfm_solution import PositionwiseFeedForward, make_model
from tfm_solution.feed_forward import conv1d_feed_forward, gelu

pytestmark = pytest.mark.fast


def _params(ffn: PositionwiseFeedForward) -> tuple[torch.Tensor, ...]:
    return ffn.w_1.weight, ffn.w_1.bias, ffn.w_2.weight, ffn.w_2.bias


@pytest.mark.parametrize("b,n,d_model,d_ff", [(1, 1, 3, 5), (2, 7, 8, 32), (3, 4, 16, 16)])
def test_conv1d_feed_forward_equals_nn_conv1d_with_copied_weights(b, n, d_model, d_ff):
    ffn = PositionwiseFeedForward(d_model, d_ff, dropout=0.0).double().eval()
    conv_1 = nn.Conv1d(d_model, d_ff, kernel_size=1, dtype=torch.float64)
    conv_2 = nn.Conv1d(d_ff, d_model, kernel_size=1, dtype=torch.float64)
    with torch.no_grad():
        for conv, lin in ((conv_1, ffn.w_1), (conv_2, ffn.w_2)):
            conv.weight.copy_(lin.weight[:, :, None])
            conv.bias.copy_(lin.bias)
    x = torch.randn(b, n, d_model, dtype=torch.float64)
    expected = conv_2(conv_1(x.permute(0, 2, 1)).clamp_min(0)).permute(0, 2, 1)
    got = conv1d_feed_forward(x, *_params(ffn))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, ffn(x), rtol=1e-12, atol=1e-12)


def test_feed_forward_is_the_same_network_at_every_position():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(6, 24, dropout=0.0).double().eval()
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    one_at_a_time = torch.stack([torch.stack([ffn(x[i, j]) for j in range(9)]) for i in range(2)])
    torch.testing.assert_close(ffn(x), one_at_a_time, rtol=1e-12, atol=1e-12)
    perm = torch.randperm(9)
    torch.testing.assert_close(ffn(x[:, perm]), ffn(x)[:, perm], rtol=1e-12, atol=1e-12)


class _DropAll(nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(t)


def test_feed_forward_formula_and_dropout_after_the_relu():
    torch.manual_seed(1)
    ffn = PositionwiseFeedForward(4, 8, dropout=0.5).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    w1, b1, w2, b2 = _params(ffn)
    torch.testing.assert_close(ffn.eval()(x), torch.maximum(x @ w1.T + b1, torch.zeros(1, dtype=torch.float64)) @ w2.T + b2)
    ffn.dropout = _DropAll()  # drops every hidden unit: only b_2 is left
    torch.testing.assert_close(ffn(x), b2.expand(3, 4))


def test_gelu_is_x_times_the_normal_cdf():
    x = torch.linspace(-8, 8, 1001, dtype=torch.float64)
    normal_cdf = torch.distributions.Normal(0.0, 1.0).cdf(x)
    torch.testing.assert_close(gelu(x), x * normal_cdf, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gelu(x), F.gelu(x), rtol=1e-12, atol=1e-12)
    assert gelu(torch.zeros(2, 3, dtype=torch.bfloat16)).dtype == torch.bfloat16
    # Unlike the ReLU, GELU lets small negative values through: its minimum is about -0.17.
    assert -0.18 < gelu(x).min().item() < -0.16
    assert math.isclose(gelu(torch.tensor(1.0, dtype=torch.float64)).item(), 0.5 * (1 + math.erf(1 / math.sqrt(2))))


def test_the_ffn_holds_about_two_thirds_of_an_encoder_layer():
    model = make_model(11, 11, N=1, d_model=512, d_ff=2048, h=8)
    layer = model.encoder.layers[0]
    total = sum(p.numel() for p in layer.parameters())
    ffn = sum(p.numel() for p in layer.feed_forward.parameters())
    attn = sum(p.numel() for p in layer.self_attn.parameters())
    assert ffn == 2 * 512 * 2048 + 2048 + 512 and attn == 4 * 512**2 + 4 * 512
    assert 0.66 < ffn / total < 0.67
