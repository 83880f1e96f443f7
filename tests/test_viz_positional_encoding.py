"""Chapter 2's widgets, in-process: frames linked for the static site, the live path, the student's
function or the fallback, and the numbers the pictures show against float64 formulas."""

import math

import ipywidgets as widgets
import pytest
import torch

from tfm_solution import positional_encoding
from tfm_solution.viz import positional_encoding as ch2

pytestmark = pytest.mark.fast


def _stub(seq_len, d_model):
    raise NotImplementedError


def _swapped(seq_len, d_model):
    return positional_encoding(seq_len, d_model).flip(-1)


def _frames(player) -> list[bytes]:
    return [bytes(child.value) for child in player.stack.children]


def test_wave_explorer_has_one_linked_frame_per_pair():
    player = ch2.wave_explorer(lambda n, d: positional_encoding(n, d), seq_len=8, d_model=6)
    assert player.control.max == 2 and len(player.stack.children) == 3
    assert player.link.source == (player.control, "value")
    assert player.link.target == (player.stack, "selected_index")
    frames = _frames(player)
    assert all(f.startswith(b"\x89PNG") for f in frames) and len(set(frames)) == 3
    assert "your own" in player.children[0].value


@pytest.mark.parametrize("candidate,word", [(_stub, "stub"), (_swapped, "differ"), (None, "reference")])
def test_widgets_say_which_function_they_draw_with(candidate, word):
    player = ch2.distance_explorer(candidate, seq_len=6, d_model=4, anchors=(0,))
    assert word in player.children[0].value


def test_a_buggy_table_is_drawn_not_replaced():
    good = _frames(ch2.wave_explorer(positional_encoding, seq_len=8, d_model=2))
    buggy = _frames(ch2.wave_explorer(_swapped, seq_len=8, d_model=2))
    assert good != buggy


def test_circle_explorer_one_frame_per_position_and_checks_its_pairs():
    player = ch2.circle_explorer(positional_encoding, n_positions=3, d_model=6, pairs=(0, 2))
    assert len(set(_frames(player))) == 3 and player.control.max == 2
    with pytest.raises(ValueError, match="do not all exist"):
        ch2.circle_explorer(n_positions=2, d_model=4, pairs=(2,))


def test_distance_profile_is_a_sum_of_cosines_of_the_distance():
    seq_len, d_model = 40, 16
    pe = positional_encoding(seq_len, d_model).double()
    omega = [10000 ** (-2 * i / d_model) for i in range(d_model // 2)]
    for anchor in (0, 7, 39):
        want = torch.tensor([sum(math.cos((q - anchor) * w) for w in omega) for q in range(seq_len)],
                            dtype=torch.float64)
        torch.testing.assert_close(ch2.distance_profile(pe, anchor), want, rtol=0, atol=1e-5)


def test_distance_explorer_frames_and_bad_anchors():
    player = ch2.distance_explorer(seq_len=10, d_model=8, anchors=(0, 5))
    assert player.control.options == (0, 5) and len(set(_frames(player))) == 2
    with pytest.raises(ValueError, match="below seq_len"):
        ch2.distance_explorer(seq_len=10, d_model=8, anchors=(10,))


def test_live_path_draws_on_demand():
    player = ch2.circle_explorer(n_positions=3, d_model=4, pairs=(0,), live=True)
    assert player.link is None and player.stack.children[2].value == ""
    player.control.value = 2
    assert isinstance(player.stack.children[2], widgets.Image) and player.stack.selected_index == 2
