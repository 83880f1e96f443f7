"""Chapter 10's widgets: nested frames linked in the browser, the student's code or the reference, and
what each frame shows."""

from __future__ import annotations

import ipywidgets as widgets
import pytest
import torch

from tfm_solution import make_model
from tfm_solution.data import BOS, EOS, PAD
import struct

from tfm_solution.decoding import beam_step, sample, top_k_top_p_filter
from tfm_solution.viz.decoding import (FrameNest, _entropy, beam_tree, distinct_ngrams, draw_samples, sampling_explorer,
                                       shaping_explorer)

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
    samples = {(1.0, None): ["a dog runs", "a dog runs"], (1.0, 0.9): ["a dog runs", "a dog ran"],
               (2.0, None): ["a cat sits", "one dog ran"], (2.0, 0.9): ["a cat", "a cat"]}
    player = sampling_explorer(samples, "a dog runs", "A dog is running")
    frames = [leaf.value for leaf in _leaves(player.stack)]
    assert len(frames) == 4 and "<b>0.50</b>" in frames[0] and "<b>1.00</b>" in frames[2]
    assert "a cat sits" in frames[2] and "a dog ran" in frames[1] and "reference" in player.children[0].value


def _tiny():
    torch.manual_seed(0)
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2).eval()
    src = torch.tensor([[5, 6, 7, 8]] * 3)
    return model, src, (src != PAD).unsqueeze(-2)


def test_samples_drawn_with_the_reference_filter_are_the_reference_samplers():
    model, src, mask = _tiny()
    text = lambda ids: " ".join(map(str, ids))  # noqa: E731
    drawn, used = draw_samples(model, src, mask, 8, BOS, EOS, PAD, text, None, temperatures=(0.7, 2.0),
                               top_ps=(None, 0.5), seed=3)
    assert used.status == "reference" and set(drawn) == {(0.7, None), (0.7, 0.5), (2.0, None), (2.0, 0.5)}
    for (t, p), texts in drawn.items():
        rows = sample(model, src, mask, 8, BOS, EOS, PAD, temperature=t, top_p=p,
                      generator=torch.Generator().manual_seed(3)).tolist()
        assert texts == [text(r[1:]) for r in rows]


def test_samples_use_the_students_filter_and_fall_back_while_it_is_a_stub():
    model, src, mask = _tiny()
    text = lambda ids: " ".join(map(str, ids))  # noqa: E731
    _, ok = draw_samples(model, src, mask, 6, BOS, EOS, PAD, text, _student_filter, temperatures=(1.0,))
    assert ok.status == "ok"
    greedy_like, wrong = draw_samples(model, src, mask, 6, BOS, EOS, PAD, text, _always_top1, temperatures=(1.0,))
    assert wrong.status == "differs"
    top1 = model.generator(model.decode(model.encode(src, mask), mask, torch.full((3, 1), BOS),
                                        torch.ones(1, 1, 1, dtype=torch.bool))[:, -1]).argmax(-1)
    assert [t.split()[0] for t in greedy_like[1.0, 0.9]] == [str(i) for i in top1.tolist()]  # the filter drew
    _, stub = draw_samples(model, src, mask, 6, BOS, EOS, PAD, text, _stub, temperatures=(1.0,))
    assert stub.status == "stub"


def test_entropy_is_never_negative_zero():
    one_left = torch.tensor([1.0, 0.0, 0.0])
    assert _entropy(one_left) == 0.0 and f"{_entropy(one_left):.2f}" == "0.00"
    assert _entropy(torch.full((4,), 0.25)) == pytest.approx(torch.log(torch.tensor(4.0)).item())


def test_the_beam_tree_fits_the_column_at_its_own_size():
    model, src, mask = _tiny()
    player = beam_tree(model, src[:1], mask[:1], BOS, EOS, lambda ids: " ".join(map(str, ids)), str, None,
                       widths=(5,), max_len=6)
    png = player.stack.children[0].value
    width, height = struct.unpack(">II", png[16:24])   # the PNG header's image size
    assert 600 <= width <= 688, width   # the book's text column is 688 pixels wide
