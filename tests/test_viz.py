"""The widget toolkit and chapter 3's widgets, in-process: frames, jslink wiring, live path, fallback."""

import io

import ipywidgets as widgets
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from tfm_solution import attention, softmax_saturation
from tfm_solution.viz import FramePlayer, architecture_diagram, as_widget, figure_png, resolve
from tfm_solution.viz import attention as ch3
from tfm_solution.viz.frames import control_index_trait

pytestmark = pytest.mark.fast


def _square(side: int) -> bytes:
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, side], [0, side])
    return figure_png(fig, dpi=20)


def test_figure_png_is_a_deterministic_png():
    first, second = _square(2), _square(2)
    assert first == second
    assert Image.open(io.BytesIO(first)).size == (20, 20)
    assert b"Software" not in first


def test_as_widget_wraps_each_kind_of_frame():
    assert isinstance(as_widget(_square(1)), widgets.Image)
    assert as_widget("<b>x</b>").value == "<b>x</b>"
    label = widgets.Label("x")
    assert as_widget(label) is label
    with pytest.raises(TypeError, match="PNG bytes, an HTML string or a widget"):
        as_widget(3)


def test_control_index_trait():
    assert control_index_trait(widgets.SelectionSlider(options=[1, 2])) == "index"
    assert control_index_trait(widgets.ToggleButtons(options=["a", "b"])) == "index"
    assert control_index_trait(widgets.IntSlider(min=0, max=3)) == "value"
    with pytest.raises(TypeError, match="no integer position"):
        control_index_trait(widgets.FloatSlider())


def test_precomputed_player_links_the_control_to_the_stack_in_the_browser():
    control = widgets.ToggleButtons(options=["a", "b", "c"], index=1)
    calls = []
    player = FramePlayer(control, lambda i: calls.append(i) or f"<p>frame {i}</p>", 3, header=[widgets.Label("t")])
    assert calls == [0, 1, 2], "every frame is rendered up front"
    assert [c.value for c in player.stack.children] == ["<p>frame 0</p>", "<p>frame 1</p>", "<p>frame 2</p>"]
    assert player.stack.selected_index == 1
    assert player.link.source == (control, "index")
    assert player.link.target == (player.stack, "selected_index")
    assert list(player.children) == [player.children[0], control, player.stack]
    with pytest.raises(ValueError, match="at least one frame"):
        FramePlayer(widgets.IntSlider(), str, 0)


def test_live_player_renders_on_demand_with_the_current_function():
    control = widgets.IntSlider(min=0, max=3, value=0)
    calls = []
    player = FramePlayer(control, lambda i: calls.append(i) or f"frame {i}", 4, live=True)
    assert calls == [0] and player.link is None
    control.value = 2
    assert calls == [0, 2]
    assert player.stack.selected_index == 2 and player.stack.children[2].value == "frame 2"
    control.value = 0
    control.value = 2
    assert calls == [0, 2], "a frame once drawn is kept"


def _stub(*args, **kwargs):
    raise NotImplementedError()


def _crashes(*args, **kwargs):
    raise IndexError("dimension out of range")


def _missing_scale(query, key, value, mask=None, dropout=None):
    p_attn = torch.matmul(query, key.transpose(-2, -1)).softmax(-1)
    return p_attn @ value, p_attn


def _probe(fn):
    return ch3._probe_attention(fn)


@pytest.mark.parametrize(
    "candidate,source,status",
    [
        (None, "reference", "reference"),
        (attention, "reference", "reference"),
        (_stub, "reference", "stub"),
        (_crashes, "reference", "error"),
        (_missing_scale, "student", "differs"),
        (lambda q, k, v, mask=None, dropout=None: attention(q, k, v, mask, dropout), "student", "ok"),
    ],
)
def test_resolve_uses_the_students_function_when_it_runs(candidate, source, status):
    used = resolve(candidate, attention, _probe, "attention")
    assert (used.source, used.status) == (source, status)
    assert (used.fn is attention) == (source == "reference")
    assert "attention" in used.banner().value


def test_resolve_reports_a_student_result_of_the_wrong_kind_as_different():
    used = resolve(lambda *a, **k: "not tensors", attention, _probe, "attention")
    assert used.status == "differs"


def test_library_lookup_shows_it_attending_to_the_animal():
    player = ch3.library_lookup(attention)
    assert player.control.index == ch3.TOKENS.index("它")
    assert len(player.stack.children) == len(ch3.TOKENS)
    q, k, v = ch3.library_tensors()
    _, weights = attention(q, k, v)
    it, animal, road = (ch3.TOKENS.index(t) for t in ("它", "动物", "马路"))
    assert weights[it].argmax() == animal and weights[it, animal] > 0.75 > 0.05 > weights[it, road]
    frame = player.stack.children[it].value
    assert f"{100 * weights[it, animal].item():.1f}%" in frame and "动物" in frame
    assert "reference" in player.children[0].value


def test_library_lookup_draws_the_students_bug():
    player = ch3.library_lookup(_missing_scale)
    assert "differ" in player.children[0].value
    q, k, v = ch3.library_tensors()
    _, wrong = _missing_scale(q, k, v)
    it = ch3.TOKENS.index("它")
    assert f"{100 * wrong[it].max().item():.1f}%" in player.stack.children[it].value


def test_saturation_curves_and_the_scale_explorer():
    scaled, unscaled = ch3.saturation_curves(softmax_saturation, d_ks=(4, 256), n_queries=64)
    assert scaled[1].mean() < 0.5 < 0.9 < unscaled[1].mean()
    player = ch3.scale_explorer(softmax_saturation, d_ks=(2, 64, 512))
    assert player.control.options == (2, 64, 512) and player.stack.selected_index == 1
    frames = [child.value for child in player.stack.children]
    assert len(set(frames)) == len(frames), "every d_k has its own picture"
    stub_player = ch3.scale_explorer(_stub, d_ks=(8,))
    assert "stub" in stub_player.children[0].value and stub_player.control.value == 8


def test_chapter_widgets_have_a_live_path():
    player = ch3.mask_explorer(attention, live=True)
    assert player.link is None and player.stack.children[1].value == ""
    player.control.index = 1
    assert isinstance(player.stack.children[1], widgets.Image) and player.stack.selected_index == 1
    assert ch3.library_lookup(live=True).link is None
    assert ch3.scale_explorer(d_ks=(4, 64), live=True).stack.children[0].value == ""


def test_masks_and_the_mask_explorer():
    none, padding, causal, both = ch3.example_masks()
    assert none is None
    assert padding[:, 4:].sum() == 0 and padding[:, :4].all()
    assert torch.equal(causal, torch.tril(torch.ones(6, 6, dtype=torch.bool)))
    assert torch.equal(both, padding & causal)
    player = ch3.mask_explorer(attention)
    assert [b for b in player.control.options] == list(ch3.MASK_KINDS)
    assert len({child.value for child in player.stack.children}) == 4


def test_architecture_diagram_highlights_groups_and_rejects_unknown_blocks():
    plain = figure_png(architecture_diagram(), dpi=30)
    highlighted = figure_png(architecture_diagram(["attention", "linear"], title="t"), dpi=30)
    assert plain != highlighted
    with pytest.raises(ValueError, match="unknown block"):
        architecture_diagram(["decoder_of_doom"])
