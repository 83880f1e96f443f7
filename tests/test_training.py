"""Training pieces against oracles: label smoothing vs the notes' KLDivLoss construction, gradient
accumulation vs one large batch, the optimizer and schedule, checkpoints, and the copy task."""

import copy
import json

import pytest
import torch
from torch import nn

from tfm_solution import make_model, masks, schedule
from tfm_solution.checkpoint import (Progress, export_model, load_checkpoint, resume_checkpoint, save_checkpoint,
                                     start_run)
from tfm_solution.data import PAD, TokenizerPair, collate, copy_examples, copy_tokenizer
from tfm_solution.training import (Batch, LabelSmoothing, SimpleLossCompute, TrainState, autocast,
                                   distributed_context, make_optimizer, rate, run_epoch, select_device,
                                   train_with_accumulation)


def notes_label_smoothing(x, target, size, padding_idx, smoothing):
    """Oracle: the notes' construction, fed to nn.KLDivLoss (valid while x is finite)."""
    true_dist = torch.full_like(x, smoothing / (size - 2))
    true_dist.scatter_(1, target.unsqueeze(1), 1.0 - smoothing)
    true_dist[:, padding_idx] = 0
    rows = torch.nonzero(target == padding_idx)
    if rows.numel():
        true_dist.index_fill_(0, rows.squeeze(1), 0.0)
    return nn.KLDivLoss(reduction="sum")(x, true_dist), true_dist


@pytest.mark.fast
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.4])
def test_label_smoothing_matches_the_notes_on_finite_inputs(smoothing):
    x = torch.randn(12, 7).log_softmax(-1).requires_grad_()
    target = torch.tensor([1, 0, 3, 6, 0, 2, 5, 4, 1, 0, 6, 3])
    crit = LabelSmoothing(7, padding_idx=0, smoothing=smoothing)
    expected, dist = notes_label_smoothing(x.detach(), target, 7, 0, smoothing)
    loss = crit(x, target)
    torch.testing.assert_close(loss, expected)
    assert torch.equal(crit.true_dist, dist)
    assert (crit.true_dist[target == 0] == 0).all() and (crit.true_dist[:, 0] == 0).all()
    torch.testing.assert_close(crit.true_dist[target != 0].sum(-1), torch.ones(9))  # mass over size - 2 + 1 classes


@pytest.mark.fast
def test_label_smoothing_is_finite_with_minus_inf_log_probs():
    x = torch.randn(4, 6).log_softmax(-1)
    x[:, 0] = -torch.inf  # the padding column
    x[3] = -torch.inf  # a padding row with every log-probability -inf
    x.requires_grad_()
    target = torch.tensor([2, 5, 1, 0])
    loss = LabelSmoothing(6, 0, 0.2)(x, target)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    assert (x.grad[3] == 0).all() and (x.grad[:, 0] == 0).all()


@pytest.mark.fast
def test_label_smoothing_rejects_bad_shapes_and_values():
    with pytest.raises(ValueError, match="size"):
        LabelSmoothing(2, 0)
    with pytest.raises(ValueError, match="smoothing"):
        LabelSmoothing(5, 0, 1.0)
    with pytest.raises(ValueError, match="expected x"):
        LabelSmoothing(5, 0)(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long))


@pytest.mark.fast
def test_reexports_and_simple_loss_compute():
    assert Batch is masks.Batch and rate is schedule.rate
    gen = nn.Sequential(nn.Linear(8, 5), nn.LogSoftmax(-1))
    x, y = torch.randn(2, 3, 8), torch.tensor([[1, 2, 0], [3, 4, 1]])
    total, node = SimpleLossCompute(gen, nn.NLLLoss(reduction="sum", ignore_index=0))(x, y, 5)
    expected = nn.functional.nll_loss(gen(x).view(-1, 5), y.view(-1), reduction="sum", ignore_index=0)
    torch.testing.assert_close(total, expected)
    torch.testing.assert_close(node, expected / 5)
    assert node.requires_grad and not total.requires_grad


def copy_batches(n_batches, batch_size, seed=0):
    examples = copy_examples(n_batches * batch_size, 6, 11, torch.Generator().manual_seed(seed))
    return [collate(examples, range(i * batch_size, (i + 1) * batch_size)) for i in range(n_batches)]


def small_model():
    return make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)


def ragged_examples(lengths, seed=0):
    """Copy-task examples of the given lengths (so micro-batches hold unequal numbers of tokens)."""
    gen = torch.Generator().manual_seed(seed)
    return [copy_examples(1, n, 11, gen)[0] for n in lengths]


def stepped_gradients(model, data, accum):
    """The gradients each optimizer step of ``run_epoch`` used, and the final state."""
    grads = []

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            grads.append([p.grad.clone() for p in self.param_groups[0]["params"]])
            return super().step(closure)

    opt = Capture(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    _, state = run_epoch(data, model, SimpleLossCompute(model.generator, LabelSmoothing(11, PAD, 0.1)), opt, sched,
                         "train", accum)
    return grads, state, sched.last_epoch


@pytest.mark.fast
@pytest.mark.parametrize("groups", [
    [[[2], [5, 5, 3, 5]]],  # the shape: 4 and 22 target tokens in one step
    [[[1, 1, 2], [6]], [[4]]],  # a final partial group normalised by its own tokens
    [[[3, 3], [3, 3]]],  # equal micro-batches (the notes' division by accum_iter agrees here)
])
def test_accumulated_gradients_equal_the_merged_batch(groups):
    """k micro-batches of unequal size give exactly the gradient of one batch holding all their tokens."""
    accum = len(groups[0])
    examples = [ragged_examples(sizes, seed=i) for i, group in enumerate(groups) for sizes in group]
    micro = [collate(ex, range(len(ex))) for ex in examples]
    merged, at = [], 0
    for group in groups:
        joined = [e for ex in examples[at: at + len(group)] for e in ex]
        merged.append(collate(joined, range(len(joined))))
        at += len(group)
    assert len({int(b.ntokens) for b in micro}) > 1 or groups[0] == [[3, 3], [3, 3]]
    model_a = small_model()
    model_b = copy.deepcopy(model_a)
    ga, state_a, sched_a = stepped_gradients(model_a, micro, accum)
    gb, state_b, sched_b = stepped_gradients(model_b, merged, 1)
    assert len(ga) == len(gb) == len(groups) == sched_a == sched_b == state_a.accum_step
    for step_a, step_b in zip(ga, gb):
        for a, b in zip(step_a, step_b):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert state_a.step == len(micro) and state_a.tokens == state_b.tokens
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5)


@pytest.mark.fast
def test_train_with_accumulation_counts_steps_and_matches_run_epoch():
    micro = copy_batches(5, 2)
    model_a = small_model()
    model_b = copy.deepcopy(model_a)
    opt_a, sched_a = make_optimizer(model_a, 16, 1.0, 10)
    opt_b, sched_b = make_optimizer(model_b, 16, 1.0, 10)
    crit = LabelSmoothing(11, PAD, 0.1)
    assert train_with_accumulation(model_a, micro, SimpleLossCompute(model_a.generator, crit), opt_a, sched_a, 2) == 3
    run_epoch(micro, model_b, SimpleLossCompute(model_b.generator, crit), opt_b, sched_b, "train", 2)
    assert sched_a.last_epoch == sched_b.last_epoch == 3
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.fast
def test_partial_accumulation_group_still_steps_and_eval_mode_does_not():
    model = small_model()
    opt, sched = make_optimizer(model, 16, 1.0, 10)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(11, PAD))
    _, state = run_epoch(copy_batches(5, 2), model, loss_compute, opt, sched, "train", accum_iter=2)
    assert state.accum_step == 3 and sched.last_epoch == 3
    before = [p.clone() for p in model.parameters()]
    loss, state2 = run_epoch(copy_batches(2, 2), model, loss_compute, mode="eval")
    assert state2 is not state and state2.step == 0 and loss > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="mode"):
        run_epoch([], model, loss_compute, mode="predict")
    with pytest.raises(ValueError, match="accum_iter"):
        run_epoch([], model, loss_compute, opt, sched, accum_iter=0)


@pytest.mark.fast
def test_on_step_can_stop_early():
    model = small_model()
    opt, sched = make_optimizer(model, 16)
    _, state = run_epoch(copy_batches(6, 2), model, SimpleLossCompute(model.generator, LabelSmoothing(11, PAD)),
                         opt, sched, on_step=lambda st, loss: st.accum_step >= 2)
    assert state.accum_step == 2 and state.step == 2


@pytest.mark.fast
def test_train_state_has_no_shared_default():
    a, b = TrainState(), TrainState()
    a.step += 1
    assert b.step == 0


@pytest.mark.fast
def test_optimizer_is_the_papers_adam_and_lr_follows_rate():
    model = small_model()
    opt, sched = make_optimizer(model, d_model=16, factor=2.0, warmup=5)
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # independent formula: 2 * 16^-0.5 * min(s^-0.5, s * 5^-1.5), step 0 counted as 1
    expected = [2 * 16 ** -0.5 * min(max(s, 1) ** -0.5, max(s, 1) * 5 ** -1.5) for s in range(12)]
    assert lrs == pytest.approx(expected)


@pytest.mark.fast
def test_device_selection_and_autocast_on_cpu():
    assert select_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available() and torch.backends.mps.is_available():
        expected = "mps"
    assert select_device().type == expected
    with autocast(torch.device("cpu")):
        assert torch.ones(2, 2) @ torch.ones(2, 2) is not None and not torch.is_autocast_enabled("cpu")


@pytest.mark.fast
def test_distributed_context_outside_torchrun_and_with_one_gloo_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with distributed_context() as (rank, world):
        assert (rank, world) == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with distributed_context() as ctx:
        assert ctx == (0, 1)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    # a "group" of two whose second member never comes would hang: pretend the group is already up
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        with distributed_context() as ctx:
            assert ctx == (0, 1)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.fast
def test_checkpoint_round_trip_restores_everything_a_resume_needs(tmp_path):
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, tie_embeddings=True)
    cfg = dict(src_vocab=11, tgt_vocab=11, N=1, d_model=16, d_ff=32, h=2, tie_embeddings=True)
    opt, sched = make_optimizer(model, 16)
    run_epoch(copy_batches(2, 2), model, SimpleLossCompute(model.generator, LabelSmoothing(11, PAD)), opt, sched)
    tok = copy_tokenizer(11)
    start_run(tmp_path, cfg, {"task": "copy"}, TokenizerPair(tok, tok))
    assert {p.name for p in tmp_path.iterdir()} == {"run.json", "tokenizer.json"}  # a shared tokenizer, once
    progress = Progress(TrainState(5, 2, 4, 40), epoch=3, batches_done=7, best=1.25,
                        metrics=[{"epoch": 0, "val_loss": 1.5}, {"epoch": 1, "val_loss": 1.25}])
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    save_checkpoint(tmp_path, model, opt, sched, progress, is_best=True)
    torch.rand(5)  # move the RNG on: the resume must put it back

    fresh = make_model(**cfg)
    opt2, sched2 = make_optimizer(fresh, 16)
    restored = resume_checkpoint(tmp_path, fresh, opt2, sched2)
    assert restored == progress
    assert torch.equal(torch.rand(3), expected_draw)
    assert sched2.last_epoch == sched.last_epoch
    torch.testing.assert_close(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name

    loaded, meta, tokenizers, state = load_checkpoint(tmp_path)
    assert state == TrainState(5, 2, 4, 40) and meta["run"] == {"task": "copy"} and not loaded.training
    assert loaded.src_embed[0].lut.weight is loaded.generator.proj.weight  # tying survives
    assert tokenizers.src.encode("5 7").ids == [5, 7] and tokenizers.src is tokenizers.tgt
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == progress.metrics
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        load_checkpoint(tmp_path / "missing")


@pytest.mark.fast
def test_best_and_last_are_kept_apart_and_unnamed_checkpoints_removed(tmp_path):
    model = small_model()
    opt, sched = make_optimizer(model, 16)
    tok = copy_tokenizer(11)
    start_run(tmp_path, dict(src_vocab=11, tgt_vocab=11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0),
              {"task": "copy"}, TokenizerPair(tok, tok))
    at = Progress()
    for step, (val, is_best) in enumerate([(2.0, True), (1.0, True), (1.5, False), (1.7, False)], 1):
        at.state.accum_step = step
        with torch.no_grad():
            model.generator.proj.bias.fill_(step)
        save_checkpoint(tmp_path, model, opt, sched, at, is_best)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == [(tmp_path / "best").read_text(), (tmp_path / "last").read_text()]
    assert names[0].startswith("step-0000002") and names[1].startswith("step-0000004")
    best, _, _, state = load_checkpoint(tmp_path)  # translate and evaluate read the best weights
    assert state.accum_step == 2 and torch.all(best.generator.proj.bias == 2)


@pytest.mark.fast
def test_a_save_that_dies_midway_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    from tfm_solution import checkpoint

    model = small_model()
    opt, sched = make_optimizer(model, 16)
    tok = copy_tokenizer(11)
    start_run(tmp_path, dict(src_vocab=11, tgt_vocab=11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0),
              {"task": "copy"}, TokenizerPair(tok, tok))
    first = save_checkpoint(tmp_path, model, opt, sched, Progress(TrainState(accum_step=1)), True)

    def dies(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", dies)  # after the weights, before the trainer state
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, model, opt, sched, Progress(TrainState(accum_step=2)), True)
    assert (tmp_path / "last").read_text() == first.name
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [first.name]  # the half-written one is gone
    assert resume_checkpoint(tmp_path, small_model(), *make_optimizer(small_model(), 16)).state.accum_step == 1


@pytest.mark.fast
def test_export_writes_float16_weights_that_load_back_as_float32(tmp_path):
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, tie_embeddings=True)
    cfg = dict(src_vocab=11, tgt_vocab=11, N=1, d_model=16, d_ff=32, h=2, tie_embeddings=True)
    tok = copy_tokenizer(11)
    export_model(tmp_path / "m", model, {"model": cfg, "run": {"task": "copy"}}, TokenizerPair(tok, tok),
                 torch.float16, [{"epoch": 0}])
    assert next(model.parameters()).dtype == torch.float32  # the exported model itself is untouched
    loaded, meta, _, _ = load_checkpoint(tmp_path / "m")
    assert meta["dtype"] == "float16" and next(loaded.parameters()).dtype == torch.float32
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(b, a.half().float(), rtol=0, atol=0, msg=name)
    assert (tmp_path / "m" / "metrics.jsonl").read_text() == '{"epoch": 0}\n'
