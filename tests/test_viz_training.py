"""Chapter 9's widgets: nested frames linked to every control, the student's code or the reference,
and what each frame says."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import ipywidgets as widgets
import pytest
import torch

from tfm_solution import LabelSmoothing, rate
from tfm_solution.training import train_with_accumulation
from tfm_solution.viz import training as ch9

pytestmark = pytest.mark.fast


def _stub(*args, **kwargs):
    raise NotImplementedError


def _frames(stack: widgets.Stack) -> list[str]:
    """The leaf frames of nested stacks, depth first (the order of the controls' positions)."""
    out = []
    for child in stack.children:
        out += _frames(child) if isinstance(child, widgets.Stack) else [child.value]
    return out


def test_frame_cube_links_each_control_to_every_stack_of_its_level():
    a = widgets.SelectionSlider(options=["x", "y"], index=1)
    b = widgets.ToggleButtons(options=["p", "q", "r"], index=2)
    c = widgets.Dropdown(options=["u", "v"], index=0)
    cube = ch9.FrameCube([a, b, c], lambda i, j, k: f"<p>{i}{j}{k}</p>", header=[widgets.HTML("h")])
    assert _frames(cube.stack) == [f"<p>{i}{j}{k}</p>" for i in range(2) for j in range(3) for k in range(2)]
    assert [link.source[0] for link in cube.links] == [a] + [b] * 2 + [c] * 6
    assert all(link.target[1] == "selected_index" for link in cube.links)
    assert cube.stack.selected_index == 1 and cube.stack.children[1].selected_index == 2
    assert cube.stack.children[0].children[0].selected_index == 0
    assert cube.children == (cube.children[0], a, b, c, cube.stack)
    with pytest.raises(ValueError):
        ch9.FrameCube([], lambda: "")


def test_svg_chart_is_well_formed_and_clips_to_the_axes():
    svg = ch9.svg_chart([{"x": [0, 1, 2], "y": [0.0, 5.0, float("nan")], "colour": "#000", "label": "a & b"}],
                        (0, 2), (0, 1), x_label="step", y_label="lr", marks=[(1, 0.5, "peak <1>")])
    root = ET.fromstring(svg)
    line = root.find("{http://www.w3.org/2000/svg}polyline")
    points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
    assert len(points) == 2  # the NaN point is left out
    assert points[1][1] == 10.0  # y = 5 is clipped to the top of the plot (y_range max 1)
    assert "a &amp; b" in svg and "peak &lt;1&gt;" in svg


def test_a_mark_label_stays_inside_the_chart_at_either_edge():
    """A mark's label reads away from the nearer edge: at the last step of a run it ends left of its dot."""
    svg = ch9.svg_chart([{"x": [0, 400], "y": [1.0, 0.1], "colour": "#000", "label": "loss"}], (0, 400), (0, 1),
                        marks=[(0, 1.0, "first"), (400, 0.1, "0.123")], width=460)
    texts = {t.text: t for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")}
    dots = [float(c.get("cx")) for c in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}circle")]
    assert texts["first"].get("text-anchor") == "start" and float(texts["first"].get("x")) > dots[0]
    assert texts["0.123"].get("text-anchor") == "end" and float(texts["0.123"].get("x")) < dots[1] <= 460


@pytest.mark.parametrize("low,high", [(0, 40_000), (0, 7.2e-4), (0.5, 3.2)])
def test_ticks_are_round_and_cover_the_range(low, high):
    ticks = ch9._ticks(low, high)
    assert 3 <= len(ticks) <= 11 and low <= ticks[0] and ticks[-1] <= high + 1e-12
    steps = {round(b - a, 12) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1


def test_schedule_curve_hits_the_peak_at_the_warmup_step():
    steps, values = ch9.schedule_curve(rate, 512, 1.0, 4000)
    assert 4000 in steps and steps[0] == 1 and steps[-1] == ch9.SCHEDULE_STEPS
    assert steps[values.index(max(values))] == 4000
    assert max(values) == pytest.approx((512 * 4000) ** -0.5)


def test_schedule_explorer_has_a_frame_per_setting_and_uses_the_students_rate():
    cube = ch9.schedule_explorer(lambda s, d, f, w: rate(s, d, f, w))
    frames = _frames(cube.stack)
    assert len(frames) == len(ch9.D_MODELS) * len(ch9.WARMUPS) * len(ch9.FACTORS)
    paper = frames[(ch9.D_MODELS.index(512) * len(ch9.WARMUPS) + ch9.WARMUPS.index(4000)) * len(ch9.FACTORS)
                   + ch9.FACTORS.index(1.0)]
    assert "the paper’s setting" in paper and f"{(512 * 4000) ** -0.5:.3e}" in paper
    assert sum("the paper’s setting" in f for f in frames) == 1
    assert "your own" in cube.children[0].value
    # The controls start on the paper's setting.
    assert [c.value for c in cube.controls] == [512, 4000, 1.0]
    stub = ch9.schedule_explorer(_stub)
    assert "stub" in stub.children[0].value and _frames(stub.stack) == _frames(ch9.schedule_explorer().stack)
    wrong = ch9.schedule_explorer(lambda s, d, f, w: f * d ** -0.5 * max(max(s, 1) ** -0.5, s * w ** -1.5))
    assert "differ" in wrong.children[0].value and _frames(wrong.stack) != _frames(stub.stack)


def test_smoothed_targets_and_their_frames():
    loss, dist = ch9.smoothed_targets(LabelSmoothing, 8, 0.1)
    assert dist[0, ch9.TRUE_CLASS] == pytest.approx(0.9) and dist[0, 2] == 0 and dist[1].abs().sum() == 0
    uniform = -math.log(1 / 8)
    q = dist[0].double()
    assert float(loss) == pytest.approx(float((q[q > 0] * q[q > 0].log()).sum()) + uniform, rel=1e-5)
    cube = ch9.smoothing_explorer(LabelSmoothing)
    frames = _frames(cube.stack)
    assert len(frames) == len(ch9.EPSILONS) * len(ch9.VOCAB_SIZES)
    frame = frames[ch9.EPSILONS.index(0.1) * len(ch9.VOCAB_SIZES) + ch9.VOCAB_SIZES.index(8)]
    assert "ε / (size − 2) = 0.0167" in frame and "Row sum: 1.0000" in frame and "the whole row is zero" in frame
    assert f"{-math.log(0.9):.3f} nats" in frame
    assert [c.value for c in cube.controls] == [0.1, 8]
    assert "stub" in ch9.smoothing_explorer(_stub).children[0].value


def test_smoothing_explorer_draws_a_wrong_answer_and_says_so():
    from autograder.mistakes import mistake_function

    cube = ch9.smoothing_explorer(mistake_function("ch09.label_smoothing", "share_over_size_minus_1", "LabelSmoothing"))
    assert "differ" in cube.children[0].value
    frame = _frames(cube.stack)[ch9.EPSILONS.index(0.1) * len(ch9.VOCAB_SIZES) + ch9.VOCAB_SIZES.index(8)]
    assert "Row sum: 0.9857" in frame


def _padding_oracle(lengths, batches):
    padded = sum(max(lengths[i][side] for i in b) * len(b) for b in batches for side in (0, 1))
    real = sum(lengths[i][0] + lengths[i][1] for b in batches for i in b)
    return 1 - real / padded


def test_batching_helpers_keep_the_budget_and_count_padding():
    g = torch.Generator().manual_seed(0)
    # Correlated lengths, as in a translation corpus: a target about as long as its source.
    source = torch.randint(3, 40, (500,), generator=g)
    lengths = [(int(s), int(s) + int(d)) for s, d in zip(source, torch.randint(-2, 4, (500,), generator=g))]
    for make in (ch9.random_batches, ch9.sorted_batches):
        batches = make(lengths, 300, torch.Generator().manual_seed(1))
        assert sorted(i for b in batches for i in b) == list(range(500))
        assert all(max(max(lengths[i]) for i in b) * len(b) <= 300 for b in batches)
        assert ch9.padding_share(lengths, batches) == pytest.approx(_padding_oracle(lengths, batches))
    shuffled = ch9.padding_share(lengths, ch9.random_batches(lengths, 300, torch.Generator().manual_seed(1)))
    by_length = ch9.padding_share(lengths, ch9.sorted_batches(lengths, 300, torch.Generator().manual_seed(1)))
    assert by_length < shuffled / 3
    assert ch9.expand_lengths({"2,3": 2, "10,1": 1}) == [(2, 3), (2, 3), (10, 1)]


def test_padding_explorer_shows_less_padding_sorted_at_every_budget():
    histogram = {f"{s},{s + d}": 40 for s in range(4, 31) for d in (-1, 0, 1, 2)}
    cube = ch9.padding_explorer(histogram)
    frames = _frames(cube.stack)
    assert len(frames) == len(ch9.BUDGETS)
    for frame in frames:
        shares = [float(x) for x in re.findall(r"([\d.]+)% padding", frame)]
        assert len(shares) == 2 and shares[1] < shares[0]


def _log(epochs: int) -> list[dict]:
    return [dict(epoch=e, step=10 * (e + 1), train_loss=5.0 / (e + 1), val_loss=4.0 / (e + 1) + 0.5, lr=1e-3,
                 seconds=30.0 * (e + 1), tokens_per_s=1234.0,
                 samples=[{"source": "Ein Hund.", "reference": "A dog.", "output": f"output of epoch {e} <b>"}])
            for e in range(epochs)]


def test_learning_replay_has_one_frame_per_epoch_with_that_epochs_translations():
    cube = ch9.learning_replay(_log(4))
    frames = _frames(cube.stack)
    assert len(frames) == 4 and cube.controls[0].options[3] == "epoch 3"
    for e, frame in enumerate(frames):
        assert f"output of epoch {e} &lt;b&gt;" in frame and f"optimizer step {10 * (e + 1)}" in frame
        assert f"validation loss {4.0 / (e + 1) + 0.5:.3f}" in frame
    assert "1,234 tokens/s" in frames[0]
    with pytest.raises(ValueError, match="empty"):
        ch9.learning_replay([])


def test_pick_trainer_uses_a_correct_answer_and_flags_a_mean_of_means():
    assert ch9.pick_trainer(lambda *a: train_with_accumulation(*a)).status == "ok"
    assert ch9.pick_trainer(_stub).status == "stub"

    def mean_of_means(model, batches, loss_compute, optimizer, scheduler, accum_iter):
        model.train()
        batches, steps = list(batches), 0
        for start in range(0, len(batches), accum_iter):
            for batch in batches[start:start + accum_iter]:
                out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                (loss_compute(out, batch.tgt_y, batch.ntokens)[1] / accum_iter).backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            steps += 1
        return steps

    assert ch9.pick_trainer(mean_of_means).status == "differs"
