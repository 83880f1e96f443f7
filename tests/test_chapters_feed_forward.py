"""Chapter 6: the reference feed-forward network, its convolution form and GELU against
independent oracles (``nn.Conv1d``, per-position loops, the normal CDF, PyTorch's GELU), and the
notebook's visible tests against the mistakes the chapter names."""

import math
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.registry import by_id
from tfm_solution import PositionwiseFeedForward, make_model
from tfm_solution.feed_forward import conv1d_feed_forward, gelu



def _params(ffn: PositionwiseFeedForward) -> tuple[torch.Tensor, ...]:
    return ffn.w_1.weight, ffn.w_1.bias, ffn.w_2.weight, ffn.w_2.bias


@pytest.mark.fast
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


@pytest.mark.fast
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


@pytest.mark.fast
def test_feed_forward_formula_and_dropout_after_the_relu():
    torch.manual_seed(1)
    ffn = PositionwiseFeedForward(4, 8, dropout=0.5).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    w1, b1, w2, b2 = _params(ffn)
    torch.testing.assert_close(ffn.eval()(x), torch.maximum(x @ w1.T + b1, torch.zeros(1, dtype=torch.float64)) @ w2.T + b2)
    ffn.dropout = _DropAll()  # drops every hidden unit: only b_2 is left
    torch.testing.assert_close(ffn(x), b2.expand(3, 4))


@pytest.mark.fast
def test_gelu_is_x_times_the_normal_cdf():
    x = torch.linspace(-8, 8, 1001, dtype=torch.float64)
    normal_cdf = torch.distributions.Normal(0.0, 1.0).cdf(x)
    torch.testing.assert_close(gelu(x), x * normal_cdf, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gelu(x), F.gelu(x), rtol=1e-12, atol=1e-12)
    assert gelu(torch.zeros(2, 3, dtype=torch.bfloat16)).dtype == torch.bfloat16
    # Unlike the ReLU, GELU lets small negative values through: its minimum is about -0.17.
    assert -0.18 < gelu(x).min().item() < -0.16
    assert math.isclose(gelu(torch.tensor(1.0, dtype=torch.float64)).item(), 0.5 * (1 + math.erf(1 / math.sqrt(2))))


@pytest.mark.fast
def test_the_ffn_holds_about_two_thirds_of_an_encoder_layer():
    model = make_model(11, 11, N=1, d_model=512, d_ff=2048, h=8)
    layer = model.encoder.layers[0]
    total = sum(p.numel() for p in layer.parameters())
    ffn = sum(p.numel() for p in layer.feed_forward.parameters())
    attn = sum(p.numel() for p in layer.self_attn.parameters())
    assert ffn == 2 * 512 * 2048 + 2048 + 512 and attn == 4 * 512**2 + 4 * 512
    assert 0.66 < ffn / total < 0.67


# ----------------------------------------------------------------------------- visible tests vs mutants

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "06_feed_forward" / "feed_forward.ipynb"
RELEASE = REPO / "chapters" / "06_feed_forward" / "feed_forward.ipynb"


def _visible_tests(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    return [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]


def _run_visible(prefix: str, names: dict) -> None:
    sources = _visible_tests(prefix)
    assert sources, f"no visible tests for {prefix}"
    for source in sources:
        exec(source, {"math": math, "torch": torch, "nn": nn, **names, "print": lambda *a, **k: None})  # noqa: S102


def _mistake(exercise_id: str, name: str):
    from autograder.mistakes import mistake_function

    return mistake_function(exercise_id, name, by_id(exercise_id).name)


@pytest.mark.parametrize("exercise_id,prefix,name,reference", [
    ("ch06.positionwise_feed_forward", "ch06-positionwise-feed-forward", "PositionwiseFeedForward",
     PositionwiseFeedForward),
    ("ch06.conv1d_feed_forward", "ch06-conv1d-feed-forward", "conv1d_feed_forward", conv1d_feed_forward),
    ("ch06.gelu", "ch06-gelu", "gelu", gelu),
])
@pytest.mark.fast
def test_visible_tests_pass_on_the_reference_and_fail_on_every_declared_mistake(exercise_id, prefix, name, reference):
    _run_visible(prefix, {name: reference})
    for mistake in by_id(exercise_id).mistakes:
        with pytest.raises((AssertionError, RuntimeError)):
            _run_visible(prefix, {name: _mistake(exercise_id, mistake)})


class _DropoutBeforeReLU(PositionwiseFeedForward):
    """Dropout just before the ReLU: the same function as the notes' order (ReLU(c z) = c ReLU(z), c >= 0)."""

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x)).relu())


@pytest.mark.fast
def test_dropout_just_before_the_relu_is_not_a_mistake():
    _run_visible("ch06-positionwise-feed-forward", {"PositionwiseFeedForward": _DropoutBeforeReLU})
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(6, 24, dropout=0.3).train()
    other = _DropoutBeforeReLU(6, 24, dropout=0.3).train()
    other.load_state_dict(ffn.state_dict())
    x = torch.randn(2, 5, 6)
    torch.manual_seed(1)
    a = ffn(x)
    torch.manual_seed(1)
    torch.testing.assert_close(other(x), a)  # the same dropout mask gives the same output


@pytest.mark.slow
def test_the_grader_gives_dropout_before_the_relu_full_marks(tmp_path):
    from autograder.grade import grade_path
    from tests.notebook_answers import release_with, solution_answers

    answers = solution_answers(SOLUTION)
    answers["ch06.positionwise_feed_forward"] = answers["ch06.positionwise_feed_forward"].replace(
        "self.w_2(self.dropout(self.w_1(x).relu()))", "self.w_2(self.dropout(self.w_1(x)).relu())")
    assert "self.dropout(self.w_1(x)).relu()" in answers["ch06.positionwise_feed_forward"]
    report = grade_path(release_with(RELEASE, tmp_path, answers), chapter="06")
    assert report.exercise_score("ch06.positionwise_feed_forward") == 4, report.tests
