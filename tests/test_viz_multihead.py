"""Chapter 5's widgets: the shape tracer's steps, one head against two, and the head patterns of
attention maps, against hand-built maps and the course model."""

from __future__ import annotations

import pytest
import torch

from tfm_solution import MultiHeadedAttention
from tfm_solution.multihead import merge_heads, split_heads
from tfm_solution.viz import multihead as ch5
from tfm_solution.viz.masks import FrameGrid

pytestmark = pytest.mark.fast


def _stub(*args, **kwargs):
    raise NotImplementedError()


def _split_without_transpose(x, h):
    return x.view(x.size(0), h, -1, x.size(-1) // h)


class _StudentMHA(MultiHeadedAttention):
    """A correct class that is not the reference object (as a student's would be)."""


class _NoOutputProjection(MultiHeadedAttention):
    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        q, k, v = (split_heads(lin(x), self.h) for lin, x in zip(self.linears, (query, key, value)))
        x, self.attn = ch5.attention(q, k, v, mask=mask)
        return merge_heads(x)


class _StubMHA(MultiHeadedAttention):
    def forward(self, query, key, value, mask=None):
        raise NotImplementedError()


# ----------------------------------------------------------------------------- the shape tracer


def test_trace_steps_follow_the_notes_shapes_and_memory():
    steps = ch5.trace_steps(n=3, d_model=6, h=2)
    assert [s.shape for s in steps] == [(1, 3, 6), (1, 3, 2, 3), (1, 2, 3, 3), (1, 2, 3, 3), (1, 3, 2, 3),
                                        (1, 3, 6), (1, 3, 6)]
    assert [s.contiguous for s in steps] == [True, True, False, True, False, True, True]
    # The first three steps are views of one tensor: memory is 0..17 throughout, reading order changes.
    for s in steps[:3]:
        assert s.memory_values == list(range(18))
    assert steps[2].values[:6] == [0, 1, 2, 6, 7, 8]  # head 0's block: features 0-2 of positions 0 and 1
    # Colours: every entry of head i's block belongs to head i; after the merge, head 0 fills features 0-2.
    assert steps[2].heads == [0.0] * 9 + [1.0] * 9
    assert steps[5].heads == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0] * 3
    assert set(steps[6].heads) == {-1.0}
    # The merged attention output is the transposed-back output, in reading order.
    assert steps[5].values == steps[4].values


def test_a_wrong_split_scrambles_the_heads():
    steps = ch5.trace_steps(_split_without_transpose, merge_heads)
    head_0 = steps[2].heads[:9]
    assert set(head_0) == {0.0, 1.0}, "a split without the transpose puts both heads' features in one block"


def test_shape_tracer_links_seven_frames_and_says_who_drew():
    player = ch5.shape_tracer(split_heads, merge_heads)
    assert len(player.stack.children) == 7 and player.link is not None
    assert len({f.value for f in player.stack.children}) == 7
    assert "reference" in player.children[0].value
    stub = ch5.shape_tracer(_stub, _stub)
    assert all("stub" in banner.value for banner in stub.children[:2])
    wrong = ch5.shape_tracer(_split_without_transpose, merge_heads)
    assert "differ" in wrong.children[0].value and "reference" in wrong.children[1].value
    assert wrong.stack.children[2].value != player.stack.children[2].value
    assert wrong.stack.children[0].value == player.stack.children[0].value


# ----------------------------------------------------------------------------- one head or two


def test_two_heads_learn_both_positions_and_one_head_cannot():
    one, two = (ch5.train_two_position(MultiHeadedAttention, h) for h in (1, 2))
    assert one.weights.shape == (1, ch5.TASK_LEN, ch5.TASK_LEN) and two.weights.shape == (2, ch5.TASK_LEN, ch5.TASK_LEN)
    assert (two.accuracy > 0.99).all(), two.accuracy
    assert one.accuracy.max() > 0.9 and one.accuracy.min() < 0.6, one.accuracy  # one answer, not both
    # The two heads split the work: one looks 1 back, the other 2 back.
    back = torch.stack([two.weights.diagonal(offset=-k, dim1=-2, dim2=-1)[:, 2 - k:].mean(-1) for k in (1, 2)])
    assert sorted(back.argmax(0).tolist()) == [0, 1] and (back.amax(0) > 0.7).all(), back


def test_task_batch_is_a_token_code_next_to_a_position_code():
    x, tokens = ch5.two_position_batch(torch.Generator().manual_seed(0), 3)
    assert x.shape == (3, ch5.TASK_LEN, ch5.TASK_VOCAB + ch5.TASK_LEN)
    assert torch.equal(x[..., : ch5.TASK_VOCAB].argmax(-1), tokens)
    assert torch.equal(x[0, :, ch5.TASK_VOCAB:], torch.eye(ch5.TASK_LEN))


def test_head_count_demo_trains_the_students_class_and_keeps_the_results():
    demo = ch5.head_count_demo(_StudentMHA, steps=40)
    assert len(demo.stack.children) == 2 and [r.h for r in demo.results] == [1, 2]
    assert "your own" in demo.children[0].value
    assert "stub" in ch5.head_count_demo(_StubMHA, steps=5).children[0].value
    assert "differ" in ch5.head_count_demo(_NoOutputProjection, steps=5).children[0].value


# ----------------------------------------------------------------------------- head patterns


def _maps(n: int) -> torch.Tensor:
    """Four hand-made heads over n positions: same token, previous token, last column, uniform."""
    same = torch.eye(n)
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1
    last = torch.zeros(n, n)
    last[:, -1] = 1
    uniform = torch.full((n, n), 1 / n)
    return torch.stack([same, previous, last, uniform])[None]  # (1 layer, 4 heads, n, n)


def test_pattern_scores_name_hand_made_heads():
    scores = ch5._pattern_weights("encoder self-attention", _maps(6).double())
    assert scores["same token"][0].tolist() == pytest.approx([1, 1 / 6, 1 / 6, 1 / 6])
    assert scores["previous token"][0].tolist() == pytest.approx([0, 1, 0, 1 / 6])
    assert scores["</s>"][0].tolist() == pytest.approx([0, 0, 1, 1 / 6])
    labels = ch5.head_labels({"encoder self-attention": scores})["encoder self-attention"]
    assert labels == [["same token", "previous token", "</s>", "broad"]]


def test_source_order_is_high_for_a_diagonal_and_zero_for_a_fixed_look():
    rows, cols = 5, 7
    diagonal = torch.zeros(rows, cols)
    diagonal[torch.arange(rows), torch.arange(rows)] = 1  # row i looks at source word i
    fixed = torch.zeros(rows, cols)
    fixed[:, 2] = 1
    reverse = diagonal.flip(0)
    p = torch.stack([diagonal, fixed, reverse])[None].double()
    scores = ch5._pattern_weights("cross-attention", p)["source order"][0]
    assert scores[0] > 0.6 and abs(scores[1]) < 1e-9 and scores[2] < -0.6


def test_course_model_maps_are_distributions_in_the_right_shapes():
    used, (s,) = ch5.course_model_attention(["Ein Hund läuft."])
    assert used.status == "reference"
    enc, dec, cross = s.maps
    n_src, n_tgt = len(s.src_tokens), len(s.tgt_tokens)
    assert s.src_tokens[-1] == "</s>" and s.tgt_tokens[0] == "<s>" and s.produced[-1] == "</s>"
    assert len(s.produced) == n_tgt
    assert enc.shape[2:] == (n_src, n_src) and dec.shape[2:] == (n_tgt, n_tgt) and cross.shape[2:] == (n_tgt, n_src)
    for m in s.maps:
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]))
    assert (dec.triu(1) == 0).all(), "decoder self-attention is causal"


def test_the_students_class_computes_the_same_maps_inside_the_course_model():
    _, (ref,) = ch5.course_model_attention(["Zwei Männer spielen Fußball."])
    used, (mine,) = ch5.course_model_attention(["Zwei Männer spielen Fußball."], _StudentMHA)
    assert used.status == "ok" and mine.translation == ref.translation
    for a, b in zip(ref.maps, mine.maps, strict=True):
        torch.testing.assert_close(a, b)
    fallback, _ = ch5.course_model_attention(["Ein Hund."], _StubMHA)
    assert fallback.status == "stub"


def test_course_model_heads_is_a_sentence_by_kind_grid():
    sentences = ["Ein Hund läuft.", "Eine Frau liest ein Buch."]
    grid = ch5.course_model_heads(sentences)
    assert isinstance(grid, FrameGrid) and len(grid.stack.children) == 2
    assert all(len(row.children) == 3 for row in grid.stack.children)
    frames = [bytes(f.value) for row in grid.stack.children for f in row.children]
    assert len(set(frames)) == 6 and all(f.startswith(b"\x89PNG") for f in frames)
    assert set(grid.scores) == set(ch5.ATTENTION_KINDS) and len(grid.computed) == 2
    n_layers, n_heads = grid.computed[0].maps[0].shape[:2]
    assert all(len(grid.labels[k]) == n_layers and len(grid.labels[k][0]) == n_heads for k in ch5.ATTENTION_KINDS)
