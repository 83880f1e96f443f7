"""Chapter 4's widgets: linked frames, the student's code or the reference, and what they show."""

from __future__ import annotations

import ipywidgets as widgets
import pytest
import torch

from tfm_solution import Batch, masked_softmax, subsequent_mask
from tfm_solution.viz import FrameGrid, batch_builder, fill_value_explorer, peek_demo
from tfm_solution.viz import masks as ch4

pytestmark = pytest.mark.fast


def _stub(*args, **kwargs):
    raise NotImplementedError()


class _StudentBatch(Batch):
    """A correct Batch that is not the reference object (as a student's would be)."""


class _CausalOnlyBatch(Batch):
    """A wrong Batch: tgt_mask forgets the padding."""

    def __init__(self, src, tgt=None, pad=2):
        super().__init__(src, tgt, pad)
        if tgt is not None:
            self.tgt_mask = subsequent_mask(self.tgt.size(-1)).expand(self.tgt.size(0), -1, -1)


def test_frame_grid_links_both_controls_to_every_frame():
    first = widgets.IntSlider(value=1, min=0, max=2)
    second = widgets.ToggleButtons(options=["a", "b"], index=1)
    grid = FrameGrid(first, second, (3, 2), lambda i, j: f"<p>{i}-{j}</p>", header=[widgets.HTML("h")])
    assert grid.stack.selected_index == 1 and len(grid.stack.children) == 3
    assert [row.selected_index for row in grid.stack.children] == [1, 1, 1]
    assert [[f.value for f in row.children] for row in grid.stack.children][2] == ["<p>2-0</p>", "<p>2-1</p>"]
    assert len(grid.links) == 4  # one per row for the second control, one for the first
    assert {link.source[0] for link in grid.links} == {first, second}
    assert grid.children[:3] == (grid.children[0], first, second)


def test_toy_batch_pads_the_shorter_sentence():
    src, tgt, vocab = ch4.toy_batch((4, 2))
    assert src.shape == (2, 4) and tgt.shape == (2, 6)
    assert [vocab[i] for i in tgt[1]] == ["<s>", "the", "cat", "</s>", "<blank>", "<blank>"]
    assert vocab[:4] == ["<s>", "</s>", "<blank>", "<unk>"] and ch4.PAD_ID == 2, "the notes' numbering"
    assert (src[1, 2:] == ch4.PAD_ID).all() and (src[0] != ch4.PAD_ID).all()


def test_batch_builder_draws_every_length_pair_and_uses_the_students_class():
    grid = batch_builder(_StudentBatch, max_words=3)
    frames = [f.value for row in grid.stack.children for f in row.children]
    assert len(frames) == 9 and len(set(frames)) == 9
    assert "your own" in grid.children[0].value
    # Sentence 1 with 3 words, sentence 2 with 1: the second is padded, ntokens counts 4 + 2 labels.
    assert "ntokens = 6" in grid.stack.children[2].children[0].value
    stub = batch_builder(_stub, max_words=2)
    assert "stub" in stub.children[0].value
    wrong = batch_builder(_CausalOnlyBatch, max_words=3)
    assert "differ" in wrong.children[0].value
    assert wrong.stack.children[2].children[0].value != grid.stack.children[2].children[0].value  # padding shown
    assert wrong.stack.children[2].children[2].value == grid.stack.children[2].children[2].value  # no padding


def test_peek_forward_with_the_mask_ignores_later_tokens():
    weights = ch4.peek_model()
    _, full = ch4.peek_forward(4, subsequent_mask(4)[0], weights)
    for n in range(1, 4):
        _, prefix = ch4.peek_forward(n, subsequent_mask(n)[0], weights)
        torch.testing.assert_close(prefix, full[:n])
    _, unmasked = ch4.peek_forward(4, None, weights)
    assert not torch.allclose(unmasked[:3], full[:3])


def test_peek_demo_predictions_change_only_without_the_mask():
    grid = peek_demo(subsequent_mask)
    masked = [row.children[0].value for row in grid.stack.children]
    unmasked = [row.children[1].value for row in grid.stack.children]
    assert not any("with the mask:" in text for text in masked)
    assert "with the mask:" not in unmasked[0] and all("with the mask:" in text for text in unmasked[1:])
    assert grid.stack.selected_index == 2 and "爱" in masked[2]
    assert "stub" in peek_demo(_stub).children[0].value


def _newest_and_earlier_change(n_layers: int, n: int = 3) -> tuple[float, float]:
    weights = ch4.peek_model(n_layers=n_layers)
    _, masked = ch4.peek_forward(n, subsequent_mask(n)[0], weights)
    _, peeking = ch4.peek_forward(n, None, weights)
    return (peeking[-1] - masked[-1]).abs().max().item(), (peeking[:-1] - masked[:-1]).abs().max().item()


def test_one_layer_would_hide_what_peeking_does_to_the_newest_token():
    newest, earlier = _newest_and_earlier_change(1)
    assert newest == 0.0 < earlier, "one layer: the newest token sees everything either way"
    newest, earlier = _newest_and_earlier_change(2)
    assert newest > 0.1 and earlier > 0.1, "two layers: layer 2 reads the earlier positions' changed vectors"
    assert ch4.PEEK_LAYERS == 2


def test_peeking_flips_the_newest_prediction_of_the_notes_example():
    """The widget's weights are chosen so that, at <开始> 我 爱, the token generation would use changes."""
    weights = ch4.peek_model()
    _, masked = ch4.peek_forward(3, subsequent_mask(3)[0], weights)
    _, peeking = ch4.peek_forward(3, None, weights)
    assert masked[-1].argmax() != peeking[-1].argmax()
    frame = peek_demo(subsequent_mask).stack.children[2].children[1].value
    assert frame.count("with the mask:") == 3 and "Weights of layer 2 of 2" in frame


def test_fill_value_explorer_shows_each_failure_in_its_dtype():
    player = fill_value_explorer(lambda scores, mask=None: masked_softmax(scores, mask))
    frames = dict(zip(player.control.options, (c.value for c in player.stack.children), strict=True))
    assert set(frames) == {"float32", "float16", "bfloat16", "float64"}
    assert "overflow" in frames["float16"] and "became float32" in frames["float16"]
    assert all("NaN" in text for text in frames.values())  # -inf, in every dtype
    assert "overflow" not in frames["float32"] and "your masked_softmax" in frames["float32"]
    assert "(the reference)" in fill_value_explorer().stack.children[0].value


def test_fill_outcome_reports_numbers_errors_and_dtype_changes():
    assert ch4.fill_outcome(masked_softmax, torch.float64).count("0.250") == 4
    assert ch4.fill_outcome(ch4._fill_minus_1e9, torch.float16).startswith("error:")
    assert "NaN" in ch4.fill_outcome(ch4._fill_neg_inf, torch.float32)
    assert "0.250" not in ch4.fill_outcome(ch4._add_minus_1e9, torch.float64).split("<br>")[1]
