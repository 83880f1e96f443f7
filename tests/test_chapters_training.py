"""Chapter 9: the reference's loss, schedule and accumulation against independent oracles, the notebook's
visible tests against the mistakes the chapter names, and the measurements the notebook loads (the
grader's verdicts on every chapter are in ``test_grader_submissions.py``)."""

from __future__ import annotations

import copy
import importlib.util
import math
import os
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.lr_scheduler import LambdaLR

from autograder.mistakes import mistake_function
from autograder.registry import by_id
from tfm_solution import Batch, LabelSmoothing, SimpleLossCompute, make_model, rate
from tfm_solution.data import BOS, EOS, PAD, collate
from tfm_solution.training import train_with_accumulation
from tfm_solution.viz.training import expand_lengths, load_measurement

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "09_training" / "training.ipynb"

pytestmark = pytest.mark.fast


# ----------------------------------------------------------------------------- the reference, against oracles


def _smoothed_kl_oracle(x: torch.Tensor, target: torch.Tensor, size: int, pad: int, eps: float) -> float:
    """Equation (9.2)-(9.3) written out row by row and class by class, in float64."""
    total = 0.0
    for row, label in enumerate(target.tolist()):
        if label == pad:
            continue
        for k in range(size):
            q = 1 - eps if k == label else 0.0 if k == pad else eps / (size - 2)
            if q > 0:
                total += q * (math.log(q) - float(x[row, k]))
    return total


@pytest.mark.parametrize("size,pad,eps", [(6, 2, 0.4), (13, 0, 0.1), (9, 2, 0.0), (40, 3, 0.25)])
def test_label_smoothing_equals_the_written_out_formula(size, pad, eps):
    g = torch.Generator().manual_seed(size)
    x = torch.randn(11, size, generator=g, dtype=torch.float64).log_softmax(-1)
    target = torch.randint(0, size, (11,), generator=g)
    target[[1, 4]] = pad
    got = LabelSmoothing(size, pad, eps)(x.float(), target)
    assert float(got) == pytest.approx(_smoothed_kl_oracle(x, target, size, pad, eps), rel=1e-5, abs=1e-5)


def test_label_smoothing_with_no_smoothing_is_cross_entropy_and_its_floor_is_the_entropy():
    logits, labels = torch.randn(8, 10), torch.tensor([3, 1, 2, 7, 2, 0, 9, 4])
    nll = F.cross_entropy(logits, labels, ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(LabelSmoothing(10, PAD, 0.0)(logits.log_softmax(-1), labels), nll)
    # At p = q the KL divergence is 0 and the correct token keeps 1 - eps: the chapter's floor.
    criterion = LabelSmoothing(10, PAD, 0.1)
    criterion(torch.zeros(1, 10).log_softmax(-1), torch.tensor([5]))
    q = criterion.true_dist
    assert float(criterion(q.clamp_min(1e-30).log(), torch.tensor([5]))) == pytest.approx(0.0, abs=1e-6)
    assert float(q[0, 5]) == pytest.approx(0.9)


def test_rate_against_the_piecewise_formula():
    for d, factor, warmup in ((512, 1.0, 4000), (64, 2.0, 50), (1024, 0.5, 8000)):
        for step in (0, 1, 2, warmup // 2, warmup - 1, warmup, warmup + 1, 10 * warmup):
            s = max(step, 1)
            expected = factor * d ** -0.5 * (s * warmup ** -1.5 if s <= warmup else s ** -0.5)
            assert rate(step, d, factor, warmup) == pytest.approx(expected, rel=1e-12)


def _pairs(lengths: list[int], seed: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(4, 12, (n,), generator=g).tolist() + [EOS],
             [BOS] + torch.randint(4, 12, (n,), generator=g).tolist() + [EOS]) for n in lengths]


def _nll(log_probs, labels):
    return F.nll_loss(log_probs, labels, ignore_index=PAD, reduction="sum")


def _merged_gradient(model: nn.Module, pairs) -> list[torch.Tensor]:
    """The gradient of one batch of all ``pairs``: float64, mean over its real target tokens."""
    b = collate(pairs, range(len(pairs)))
    log_probs = model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask))
    loss = _nll(log_probs.reshape(-1, log_probs.size(-1)), b.tgt_y.reshape(-1)) / b.ntokens
    return torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)


def test_accumulated_gradient_equals_the_merged_batch_for_unequal_micro_batches():
    """Equation (9.5): the reference's step, seen through a recording SGD with lr 1, is the merged batch's."""
    torch.manual_seed(0)
    model = make_model(12, 12, N=1, d_model=16, d_ff=32, h=2, dropout=0.0).double()
    pairs = _pairs([1, 9, 3, 6, 2], 3)
    # lr 0: the weights stay put, so both groups' gradients are taken at the starting point.
    expected, last = _merged_gradient(copy.deepcopy(model), pairs[:3]), _merged_gradient(copy.deepcopy(model), pairs[3:])
    seen = []

    class Recording(torch.optim.SGD):
        def step(self, closure=None):
            seen.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
            return super().step(closure)

    optimizer = Recording(model.parameters(), lr=0.0)
    steps = train_with_accumulation(model, [collate(pairs, [i]) for i in range(5)],
                                    SimpleLossCompute(model.generator, _nll), optimizer,
                                    LambdaLR(optimizer, lambda s: 1.0), 3)
    assert steps == 2 and len(seen) == 2
    worst = max((a - (torch.zeros_like(a) if b is None else b)).abs().max().item()
                for a, b in zip(seen[0], expected) if a is not None)
    assert worst < 1e-12
    # The shorter last group is normalised by its own tokens.
    worst = max((a - b).abs().max().item() for a, b in zip(seen[1], last) if a is not None and b is not None)
    assert worst < 1e-12


# ----------------------------------------------------------------------------- visible tests vs mistakes


def _visible_sources(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    return [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]


def _run_visible(prefix: str, names: dict) -> None:
    sources = _visible_sources(prefix)
    assert sources, f"no visible tests for {prefix}"
    for source in sources:
        exec(source, {"math": math, "torch": torch, "nn": nn, "F": F, "copy": copy, "LambdaLR": LambdaLR,  # noqa: S102
                      "Batch": Batch, "SimpleLossCompute": SimpleLossCompute, "make_model": make_model,
                      "BOS": BOS, "EOS": EOS, "PAD": PAD, **names, "print": lambda *a, **k: None})


@pytest.mark.filterwarnings("ignore:reduction. .mean. divides")
@pytest.mark.parametrize("exercise_id,prefix,name,reference", [
    ("ch09.label_smoothing", "ch09-label-smoothing", "LabelSmoothing", LabelSmoothing),
    ("ch09.rate", "ch09-rate", "rate", rate),
])
def test_visible_tests_pass_on_the_reference_and_fail_on_every_declared_mistake(exercise_id, prefix, name, reference):
    _run_visible(prefix, {name: reference})
    mistakes = by_id(exercise_id).mistakes
    assert len(mistakes) >= 4
    for mistake in mistakes:
        with pytest.raises((AssertionError, ZeroDivisionError)):
            _run_visible(prefix, {name: mistake_function(exercise_id, mistake, name)})


def _accumulation(*, divide_by: str = "group", first_step_at_zero: bool = False, scheduler_per_batch: bool = False,
                  last_group: bool = True, zero_grad: bool = True):
    """``train_with_accumulation`` with one of the mistakes chapter 9 names."""

    def train(model, batches, loss_compute, optimizer, scheduler, accum_iter):
        model.train()
        batches, steps = list(batches), 0
        starts = range(0, len(batches), accum_iter)
        if not last_group:
            starts = [s for s in starts if s + accum_iter <= len(batches)]
        if first_step_at_zero:   # the notes: step when i % accum_iter == 0
            groups = [batches[:1]] + [batches[s:s + accum_iter] for s in range(1, len(batches), accum_iter)]
        else:
            groups = [batches[s:s + accum_iter] for s in starts]
        for group in groups:
            total = sum(int(b.ntokens) for b in group)
            for batch in group:
                out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                norm = {"group": total, "own": batch.ntokens, "own_by_k": batch.ntokens * accum_iter}[divide_by]
                loss_compute(out, batch.tgt_y, norm)[1].backward()
                if scheduler_per_batch:
                    scheduler.step()
            optimizer.step()
            if zero_grad:
                optimizer.zero_grad()
            if not scheduler_per_batch:
                scheduler.step()
            steps += 1
        return steps

    return train


ACCUMULATION_MISTAKES = {
    "not divided (sum of batch means)": _accumulation(divide_by="own"),
    "divided by accum_iter (mean of batch means)": _accumulation(divide_by="own_by_k"),
    "first step at i = 0": _accumulation(first_step_at_zero=True),
    "scheduler per micro-batch": _accumulation(scheduler_per_batch=True),
    "last partial group dropped": _accumulation(last_group=False),
    "gradients never cleared": _accumulation(zero_grad=False),
}


def test_accumulation_visible_tests_pass_on_the_reference_and_a_rewrite():
    _run_visible("ch09-train-with-accumulation", {"train_with_accumulation": train_with_accumulation})
    _run_visible("ch09-train-with-accumulation", {"train_with_accumulation": _accumulation()})


@pytest.mark.parametrize("name", sorted(ACCUMULATION_MISTAKES))
def test_accumulation_visible_tests_fail_on_each_mistake_the_chapter_names(name):
    with pytest.raises(AssertionError):
        _run_visible("ch09-train-with-accumulation", {"train_with_accumulation": ACCUMULATION_MISTAKES[name]})


# ----------------------------------------------------------------------------- the measurements the notebook loads


def _lengths_script():
    spec = importlib.util.spec_from_file_location("multi30k_lengths", REPO / "scripts" / "multi30k_lengths.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_multi30k_lengths_counts_what_the_data_pipeline_encodes():
    measured = load_measurement("multi30k_lengths.json")
    assert (REPO / measured["command"].split()[1]).is_file()
    assert len(expand_lengths(measured["histogram"])) == measured["pairs"] == 29_000
    from tfm_solution.course_model import load_course_model

    _, tok = load_course_model()
    pairs = [("Ein Hund läuft.", "A dog runs."), ("Zwei Männer.", "Two men."), ("Ein Hund läuft.", "A dog runs.")]
    examples, _ = tok.encode_pairs(pairs, max_len=100)   # the course's own encoding: ids + </s>, <s> + ids + </s>
    expected: dict[str, int] = {}
    for src, tgt in examples:
        expected[f"{len(src)},{len(tgt)}"] = expected.get(f"{len(src)},{len(tgt)}", 0) + 1
    assert _lengths_script().length_histogram(pairs, tok) == expected


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k mirror (CI sets MULTI30K_DIR)")
def test_multi30k_lengths_measurement_is_not_stale():
    """When the course model (and its tokenizer) is replaced, ``scripts/multi30k_lengths.py`` must be rerun."""
    from tfm_solution.course_model import load_course_model
    from tfm_solution.data import load_multi30k, multi30k_dir

    _, tok = load_course_model()
    recomputed = _lengths_script().length_histogram(load_multi30k("train", multi30k_dir()), tok)
    assert recomputed == load_measurement("multi30k_lengths.json")["histogram"], \
        "rerun python scripts/multi30k_lengths.py: the course tokenizer changed"


def test_label_smoothing_measurement_has_both_settings_for_every_seed():
    measured = load_measurement("label_smoothing_effect.json")
    assert measured["command"].startswith("python scripts/label_smoothing_effect.py")
    runs = measured["runs"]
    seeds = {r["seed"] for r in runs}
    assert {(r["smoothing"], r["seed"]) for r in runs} == {(e, s) for e in (0.0, 0.1) for s in seeds}
    for r in runs:
        assert r["perplexity"] == pytest.approx(math.exp(r["nll_per_token"]), rel=1e-3)
        assert 0 <= r["token_accuracy"] <= 1 and 0 < r["confidence"] <= 1 and 0 <= r["bleu"] <= 100


def test_label_smoothing_script_measures_perplexity_and_accuracy_of_the_reference_tokens():
    spec = importlib.util.spec_from_file_location("label_smoothing_effect", REPO / "scripts" / "label_smoothing_effect.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    torch.manual_seed(0)
    model = make_model(12, 12, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    examples = _pairs([3, 5, 2, 6], 7)
    got = script.validation_metrics(model, examples, max_tokens=100)
    b = collate(examples, range(len(examples)))
    with torch.no_grad():
        logits = model.generator.proj(model(b.src, b.tgt, b.src_mask, b.tgt_mask)).reshape(-1, 12)
    labels = b.tgt_y.reshape(-1)
    real = labels != PAD
    nll = F.cross_entropy(logits, labels, ignore_index=PAD).item()
    assert got["nll_per_token"] == pytest.approx(nll, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(nll), rel=1e-5)
    assert got["token_accuracy"] == pytest.approx((logits.argmax(-1) == labels)[real].float().mean().item())
    assert got["confidence"] == pytest.approx(logits.softmax(-1).amax(-1)[real].mean().item(), rel=1e-5)
