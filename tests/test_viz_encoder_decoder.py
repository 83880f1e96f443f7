"""Chapter 8's widgets: the hand-built alignment, the tracer's points against the model's own outputs,
the diagram boxes against the drawn pixels, the student's make_model or the reference, and the course model."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from tfm_solution import attention, make_model, subsequent_mask
from tfm_solution.viz import encoder_decoder as ch8
from tfm_solution.viz.diagram import _BLOCKS


def _stub(*args, **kwargs):
    raise NotImplementedError()


def _student_make_model(*args, **kwargs):
    """A correct make_model that is not the reference function (as a student's would be)."""
    return make_model(*args, **kwargs)


def _shared_attention_make_model(*args, **kwargs):
    """A wrong make_model: each decoder layer's cross-attention is its self-attention (one module)."""
    model = make_model(*args, **kwargs)
    for layer in model.decoder.layers:
        layer.src_attn = layer.self_attn
    return model


@pytest.mark.fast
@pytest.mark.parametrize("step", range(len(ch8.HAND_STEPS)))
def test_the_hand_built_query_gives_exactly_the_chosen_weights(step):
    weights = ch8.HAND_STEPS[step][2]
    t = ch8.hand_cross_attention(weights)
    out, p_attn = attention(t["query"], t["keys"], t["values"])
    expected = torch.tensor([weights], dtype=torch.float64)
    torch.testing.assert_close(p_attn, expected / expected.sum())
    torch.testing.assert_close(out, p_attn)  # one-hot values: the output is the weights
    assert ch8.HAND_STEPS[-1][2] == ch8.NOTES_WEIGHTS == (0.03, 0.02, 0.95)


@pytest.mark.fast
def test_cross_attention_by_hand_frames_and_fallback():
    player = ch8.cross_attention_by_hand()
    frames = [f.value for f in player.stack.children]
    assert len(frames) == 3 and "95%" in frames[2] and "苹果" in frames[2] and player.link is not None
    assert player.control.index == 0  # a slider that can move right
    assert "stub" in ch8.cross_attention_by_hand(_stub).children[0].value


@pytest.mark.fast
def test_readable_marks_word_starts_and_continuations():
    assert [ch8.readable(t) for t in ("\u2581Hund", "en", "</s>", "\u2581")] == ["Hund", "-en", "</s>", "\u2581"]


@pytest.mark.fast
def test_heat_png_has_one_square_per_value_and_the_colour_map():
    values = torch.tensor([[0.0, 1.0], [0.5, 0.25], [1.0, 0.0]])
    png = ch8.heat_png(values, "Greys", 0.0, 1.0, (3, 2))
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (6, 6)
    white, black = image.getpixel((0, 0)), image.getpixel((4, 0))
    assert sum(white) > 700 and sum(black) < 60 and image.getpixel((5, 1)) == black
    assert ch8.heat_png(values, "Greys", 0.0, 1.0, (3, 2)) == png


@pytest.mark.fast
def test_diagram_boxes_sit_on_their_blocks():
    png, boxes = ch8.diagram_with_boxes()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert set(boxes) == set(_BLOCKS)
    for name in ("cross_attn", "masked_attn", "enc_ffn", "src_embedding"):
        left, top, width, height = boxes[name]
        fill = _BLOCKS[name][5].lstrip("#")
        expected = tuple(int(fill[i:i + 2], 16) for i in (0, 2, 4))
        # Just inside the box's left edge, away from the centred label: the block's fill colour.
        pixel = image.getpixel((left + 6, top + height // 2 + height // 4))
        assert max(abs(a - b) for a, b in zip(pixel, expected, strict=True)) < 40, (name, pixel, expected)
        assert 0 <= left and left + width <= image.size[0] and top + height <= image.size[1]


def _small_pair() -> ch8.Pair:
    return ch8.Pair(src=torch.tensor([[5, 6, 7, 1]]), tgt=torch.tensor([[0, 8, 9]]),
                    src_tokens=["\u2581a", "b", "\u2581c", "</s>"], tgt_tokens=["<s>", "\u2581x", "y"],
                    predicted=["\u2581x", "y", "</s>"])


@pytest.mark.fast
def test_trace_records_every_block_and_agrees_with_the_model():
    torch.manual_seed(0)
    model = make_model(12, 12, N=2, d_model=16, d_ff=32, h=4, dropout=0.0).eval()
    pair = _small_pair()
    points = ch8.trace(model, pair)
    assert len(points) == 1 + 2 * 2 + 1 + 1 + 3 * 2 + 1 + 2
    by_label = {p.label: p for p in points}
    src_mask = torch.ones(1, 1, 4, dtype=torch.bool)
    with torch.no_grad():
        memory = model.encode(pair.src, src_mask)
        states = model.decode(memory, src_mask, pair.tgt, subsequent_mask(3))
        torch.testing.assert_close(by_label["memory: the encoder's output after its final LayerNorm"].value, memory[0])
        torch.testing.assert_close(by_label["decoder output after its final LayerNorm"].value, states[0])
        torch.testing.assert_close(by_label["generator: log_softmax"].value, model.generator(states)[0])
        first = model.encoder.layers[0].sublayer[0](model.src_embed(pair.src),
                                                    lambda y: model.encoder.layers[0].self_attn(y, y, y, src_mask))
    torch.testing.assert_close(points[1].value, first[0])
    assert all(p.rows in (pair.src_tokens, pair.tgt_tokens) for p in points)
    assert all(set(p.blocks) <= set(_BLOCKS) for p in points)
    assert not model.encoder.layers[0].sublayer[0]._forward_hooks  # the hooks are removed


@pytest.mark.fast
def test_cross_attention_maps_are_each_layers_weights_with_rows_summing_to_one():
    torch.manual_seed(1)
    model = make_model(12, 12, N=3, d_model=16, d_ff=32, h=4, dropout=0.0).eval()
    pair = _small_pair()
    maps = ch8.cross_attention_maps(model, pair)
    assert maps.shape == (3, 4, 3, 4)
    torch.testing.assert_close(maps.sum(-1), torch.ones(3, 4, 3))
    torch.testing.assert_close(maps[-1], model.decoder.layers[-1].src_attn.attn[0])


@pytest.mark.fast
def test_alignment_agreement_reads_the_last_layer_mean():
    pair = _small_pair()
    maps = torch.zeros(2, 2, 3, 4)
    maps[-1, :, 0, 2] = 1.0    # the row producing "x" looks at "c"
    maps[-1, :, 1, 0] = 1.0    # the row producing "y" looks at "a"
    found = ch8.alignment_agreement(maps, pair, [("\u2581c", "\u2581x"), ("\u2581a", "y"), ("\u2581q", "y")])
    assert found == [{"de": "\u2581c", "en": "\u2581x", "argmax": "\u2581c", "weight": 1.0},
                     {"de": "\u2581a", "en": "y", "argmax": "\u2581a", "weight": 1.0}]
    assert [f["argmax"] for f in ch8.alignment_agreement(maps, pair, [("\u2581c", "\u2581x")], layer=0)] == ["\u2581a"]


# ----------------------------------------------------------------------------- on the course model


@pytest.fixture(scope="module")
def course_widgets():
    return ch8.data_flow_tracer(_student_make_model), ch8.cross_attention_explorer(_student_make_model)


def test_the_tracer_runs_the_course_weights_in_the_students_model(course_widgets):
    tracer, _ = course_widgets
    assert "your own" in tracer.children[0].value
    model, _, _ = ch8.course_model_built_with(None)
    n = len(model.encoder.layers)
    assert len(tracer.stack.children) == 1 + 2 * n + 1 + 1 + 3 * len(model.decoder.layers) + 1 + 2
    assert tracer.control.index == 0 and tracer.link is not None
    assert "top 3" in tracer.stack.children[-1].value


def test_the_alignment_explorer_frames_and_maps(course_widgets):
    _, grid = course_widgets
    model, _, _ = ch8.course_model_built_with(None)
    n_layers, heads = len(model.decoder.layers), model.decoder.layers[0].src_attn.h
    assert len(grid.stack.children) == len(grid.maps) == len(grid.pairs) == 4
    assert all(len(row.children) == n_layers for row in grid.stack.children)
    for maps, pair in zip(grid.maps, grid.pairs, strict=True):
        assert maps.shape == (n_layers, heads, len(pair.predicted), len(pair.src_tokens))
        torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    assert grid.second.index == 0


def test_a_wrong_or_unfinished_make_model_is_named(course_widgets):
    assert ch8.course_model_built_with(_stub)[1].status == "stub"
    wrong_model, used, _ = ch8.course_model_built_with(_shared_attention_make_model)
    assert used.status == "differs" and wrong_model is not ch8.course_model_built_with(None)[0]
