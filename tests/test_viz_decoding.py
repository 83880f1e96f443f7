"""Chapter 10's widgets: nested frames linked in the browser, the student's code or the reference, and
what each frame shows."""

from __future__ import annotations

import ipywidgets as widgets
import pytest
import torch

from tfm_solution import make_model
from tfm_solution.data import BOS, EOS, PAD
from tfm_solution.decoding import beam_step, top_k_top_p_filter
from tfm_solution.viz.decoding import FrameNest, beam_tree, distinct_ngrams, sampling_explorer, shaping_explorer

pytestmark = pytest.mark.fast


def _stub(*args, **kwargs):
    raise NotImplementedError()


def _student_filter(logits, top_k=None, top_p=None):
    return top_k_top_p_filter(logits, top_k, top_p)


def _always_top1(logits, top_k=None, top_p=None):  # wrong: ignores k and p
    return top_k_top_p_filter(logits, 1, None)


def _leaves(widget):
    if isinstance(widget, widgets.Stack):
        return [leaf for child in widget.children for leaf in _leaves(child)]
    return [widget]


def test_frame_nest_links_every_level_and_orders_the_frames():
    a = widgets.IntSlider(value=1, min=0, max=1)
    b = widgets.ToggleButtons(options=["x", "y", "z"], index=2)
    c = widgets.Dropdown(options=["p", "q"], index=0)
    nest = FrameNest([a, b, c], (2, 3, 2), lambda at: f"<p>{at}</p>")
    assert [leaf.value for leaf in _leaves(nest.stack)] == [f"<p>{(i, j, k)}</p>" for i in range(2)
                                                            for j in range(3) for k in range(2)]
    assert len(nest.links) == 1 + 2 + 6  # one per stack
    assert {link.source[0] for link in nest.links} == {a, b, c}
    assert nest.stack.selected_index == 1 and nest.stack.children[0].selected_index == 2
    with pytest.raises(ValueError):
        FrameNest([a], (2, 3), lambda at: "")


def test_shaping_explorer_draws_every_setting_with_the_students_filter():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    labels = ["a", "b", "c", "d", "e", "f"]
    nest = shaping_explorer(logits, labels, _student_filter, temperatures=(1.0, 2.0), ks=(None, 2), ps=(1.0, 0.5))
    assert "your own" in nest.children[0].value
    frames = [leaf.value for leaf in _leaves(nest.stack)]
    assert len(frames) == 8 and len(set(frames)) == 8
    assert "<b>6</b> of 6 tokens survive" in frames[0]            # T = 1, no filter
    assert "<b>2</b> of 6 tokens survive" in frames[2]            # top-k 2
    # p = 0.5 at T = 1: the first token holds 0.64 >= 0.5, so it survives alone
    assert "<b>1</b> of 6 tokens survive" in frames[1]
    assert "removed" in frames[1] and "removed" not in frames[0]
    wrong = shaping_explorer(logits, labels, _always_top1, temperatures=(1.0,), ks=(None,), ps=(1.0,))
    assert "differ" in wrong.children[0].value and "<b>1</b> of 6" in _leaves(wrong.stack)[0].value
    stub = shaping_explorer(logits, labels, _stub, temperatures=(1.0,), ks=(None,), ps=(1.0,))
    assert "stub" in stub.children[0].value and "<b>6</b> of 6" in _leaves(stub.stack)[0].value


def test_beam_tree_has_one_frame_per_width_and_searches_with_the_students_step():
    torch.manual_seed(0)
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2).eval()
    src = torch.tensor([[5, 6, 7, 8]])
    mask = (src != PAD).unsqueeze(-2)
    calls = []

    def counting_step(scores, log_probs, size):
        calls.append(size)
        return beam_step(scores, log_probs, size)

    player = beam_tree(model, src, mask, BOS, EOS, lambda ids: " ".join(map(str, ids)), str, counting_step,
                       widths=(1, 3), max_len=6)
    frames = player.stack.children
    assert len(frames) == 2 and all(f.value[:8] == b"\x89PNG\r\n\x1a\n" for f in frames)
    assert frames[0].value != frames[1].value
    assert "your own" in player.children[0].value
    assert set(calls) >= {2, 6}  # the search asked the student's step for 2k candidates at each width


def test_distinct_ngrams_by_hand_and_the_sampling_frames():
    assert distinct_ngrams([["a", "b", "c"], ["a", "b", "d"]], 2) == pytest.approx(3 / 4)
    assert distinct_ngrams([["a"]], 2) == 0.0
    player = sampling_explorer({1.0: ["a dog runs", "a dog runs"], 2.0: ["a cat sits", "one dog ran"]},
                               "a dog runs", "A dog is running")
    frames = [f.value for f in player.stack.children]
    assert len(frames) == 2 and "<b>0.50</b>" in frames[0] and "<b>1.00</b>" in frames[1]
    assert "reference" in player.children[0].value
