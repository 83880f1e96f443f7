"""Chapter 6's widgets: what each feed-forward layer of the course model receives and computes,
through the student's module, and ReLU against GELU on the same pre-activations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfm_solution import PositionwiseFeedForward
from tfm_solution.course_model import load_course_model
from tfm_solution.viz import feed_forward as ch6
from tfm_solution.viz.masks import FrameGrid

pytestmark = pytest.mark.fast


class _StudentFFN(PositionwiseFeedForward):
    """A correct module that is not the reference class."""


class _NoReLU(PositionwiseFeedForward):
    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x)))


class _StubFFN(PositionwiseFeedForward):
    def forward(self, x):
        raise NotImplementedError()


def _stub(x):
    raise NotImplementedError()


@pytest.fixture(scope="module")
def course():
    return load_course_model()


def test_ffn_inputs_record_every_layer_on_the_sentence_and_its_translation(course):
    model, tok = course
    entries = ch6.ffn_inputs(model, tok, "Ein Mann fährt Fahrrad.")
    n_layers = len(model.encoder.layers)
    assert [e.layer for e in entries] == [f"encoder {i + 1}" for i in range(n_layers)] + \
        [f"decoder {i + 1}" for i in range(n_layers)]
    src = entries[0].tokens
    assert src[-1] == "</s>" and entries[-1].tokens[0] == "<s>"
    for e in entries:
        assert e.x.shape == (len(e.tokens), model.encoder.layers[0].size)
        assert e.ffn is not None
    # The recorded input is what the layer's FFN gets: its output on it is the model's own computation.
    assert all(not m._forward_pre_hooks for m in model.modules()), "hooks are removed afterwards"


def test_encoder_inputs_of_a_padded_batch_are_each_sentences_own(course):
    model, tok = course
    sentences = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee auf einer Wiese."]
    batch = ch6.encoder_ffn_inputs(model, tok, sentences)
    alone = [ch6.ffn_inputs(model, tok, s)[: len(model.encoder.layers)] for s in sentences]
    assert [e.layer for e in batch] == [e.layer for e in alone[0]]
    for j, entry in enumerate(batch):
        assert entry.tokens == alone[0][j].tokens + alone[1][j].tokens   # no padding positions
        torch.testing.assert_close(entry.x, torch.cat([alone[0][j].x, alone[1][j].x]), atol=1e-5, rtol=1e-5)
    assert all(not m._forward_pre_hooks for m in model.modules()), "hooks are removed afterwards"


def test_hidden_activations_are_what_the_students_forward_feeds_into_w_2(course):
    model, tok = course
    entry = ch6.ffn_inputs(model, tok, "Zwei Hunde spielen.")[1]
    expected = F.relu(entry.x @ entry.ffn.w_1.weight.T + entry.ffn.w_1.bias)
    torch.testing.assert_close(ch6.hidden_activations(PositionwiseFeedForward, entry.ffn, entry.x), expected)
    torch.testing.assert_close(ch6.hidden_activations(_StudentFFN, entry.ffn, entry.x), expected)
    assert (ch6.hidden_activations(_NoReLU, entry.ffn, entry.x) < 0).any()


def test_top_units_are_the_strongest_ordered_by_their_peak_position():
    hidden = torch.zeros(4, 10)
    hidden[3, 7] = 5.0   # unit 7 peaks at position 3
    hidden[0, 2] = 4.0   # unit 2 at position 0
    hidden[1, 9] = 3.0   # unit 9 at position 1
    hidden[2, 4] = 0.5   # unit 4, weak
    assert ch6.top_units(hidden, 3).tolist() == [2, 9, 7]
    assert len(ch6.top_units(hidden, 50)) == 10


def test_activation_stats_count_zeros_and_negative_outputs():
    z = torch.tensor([[-3.0, -0.5, 0.0, 0.2, 2.0], [-0.001, -1.0, 1.0, 3.0, -4.0]], dtype=torch.float64)
    relu = ch6.activation_stats(z, torch.relu)
    assert relu.zero == pytest.approx(6 / 10) and relu.negative.tolist() == [0.0, 0.0]
    assert relu.positive.tolist() == pytest.approx([0.4, 0.4])
    gelu = ch6.activation_stats(z, ch6.reference_gelu)
    # Below -0.01: GELU(-0.5) = -0.15 and GELU(-1) = -0.16; GELU(-3) = -0.004, GELU(-4) and GELU(-0.001) are closer to 0.
    assert gelu.negative.tolist() == pytest.approx([0.2, 0.2])
    assert gelu.zero == pytest.approx(1 / 10)  # only z = 0 itself


def test_unit_activation_map_is_a_sentence_by_layer_grid(course):
    model, tok = course
    grid = ch6.unit_activation_map(["Ein Hund läuft."], _StudentFFN, n_units=8, model=model, tok=tok)
    n_layers = 2 * len(model.encoder.layers)
    assert isinstance(grid, FrameGrid) and len(grid.stack.children) == 1
    assert len(grid.stack.children[0].children) == n_layers
    assert "your own" in grid.children[0].value
    assert len(grid.hidden[0]) == n_layers and all((h >= 0).all() for h in grid.hidden[0])
    stub = ch6.unit_activation_map(["Ein Hund läuft."], _StubFFN, n_units=8, model=model, tok=tok)
    assert "stub" in stub.children[0].value
    wrong = ch6.unit_activation_map(["Ein Hund läuft."], _NoReLU, n_units=8, model=model, tok=tok)
    assert "differ" in wrong.children[0].value and any((h < 0).any() for h in wrong.hidden[0])


def test_activation_explorer_compares_relu_and_the_students_gelu(course):
    model, tok = course
    grid = ch6.activation_explorer("Ein Hund läuft.", ch6.reference_gelu, model=model, tok=tok)
    n_layers = 2 * len(model.encoder.layers)
    assert len(grid.stack.children) == n_layers and all(len(r.children) == 2 for r in grid.stack.children)
    for relu_stats, gelu_stats in grid.stats:
        assert relu_stats.zero == pytest.approx((relu_stats.z <= 0).double().mean().item())
        assert gelu_stats.negative.mean() > 0 and relu_stats.negative.sum() == 0
        torch.testing.assert_close(relu_stats.positive, gelu_stats.positive)  # both positive exactly where z > 0
    assert "stub" in ch6.activation_explorer("Ein Hund.", _stub, model=model, tok=tok).children[0].value
