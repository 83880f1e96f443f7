"""Training runs lose nothing: a kill at any moment (inside a checkpoint save too) leaves a folder
that loads, ``--resume`` continues exactly (weights, optimizer, schedule, data order, dropout's RNG,
epoch counter, best loss, tokenizer, settings), and the metrics log neither loses nor repeats an epoch."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tfm_solution.checkpoint import load_checkpoint
from tfm_solution.cli import main

CRASH = Path(__file__).with_name("_crash_train.py")
# a small copy-task run with dropout on, so a resume that lost the RNG state would diverge
RUN = ["train", "--task", "copy", "--config", "tiny", "--device", "cpu", "--epochs", "3", "--max-tokens", "800",
       "--dropout", "0.1", "--save-every", "10", "--quiet"]


def crash_run(out: Path, fault: str) -> int:
    env_args = [sys.executable, str(CRASH), fault, *RUN, "--out", str(out), "--resume"]
    # one thread: small models gain nothing from two, and spinning threads suffer most on a busy machine
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(env_args, capture_output=True, timeout=600, env=env).returncode


def last_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / (out / "last").read_text() / "model.safetensors"))


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_killed_at_random_moments_and_resumed_equals_the_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    assert crash_run(reference, "none") == 0
    out = tmp_path / "crashed"
    rng = random.Random(0)
    # a checkpoint every 10 steps and at each epoch's end (31 steps): eleven saves to die in, most midway
    # deaths inside a save first (each process saves at least twice more before the run can end), then at
    # random moments: during start-up, a step or a save
    faults = ["call:save_model:1", "call:torch.save:2", "call:atomic_write_text:3", "call:replace:4",
              *(f"after:{rng.uniform(2, 6):.1f}" for _ in range(3))]
    kills = 0
    for fault in faults:
        code = crash_run(out, fault)
        assert code in (0, -9), code
        kills += code == -9
        if (out / "last").is_file():  # at every instant the folder holds a complete checkpoint
            load_checkpoint(out)
            epochs = [m["epoch"] for m in metrics(out)]
            assert epochs == list(range(len(epochs))), epochs  # no epoch lost or repeated
    assert kills >= 4
    assert crash_run(out, "none") == 0  # resume to the end
    ref, got = last_weights(reference), last_weights(out)
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=1e-6, msg=name)
    assert [(m["epoch"], m["step"]) for m in metrics(out)] == [(m["epoch"], m["step"]) for m in metrics(reference)]
    for a, b in zip(metrics(out), metrics(reference)):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k mirror (CI sets MULTI30K_DIR)")
def test_resume_keeps_the_best_weights_the_epoch_counter_and_the_tokenizer(tmp_path, capsys):
    out = tmp_path / "m"
    data = ["--task", "multi30k", "--config", "tiny", "--device", "cpu", "--out", str(out), "--quiet",
            "--train-subset", "300", "--val-subset", "30", "--vocab-size", "300", "--max-tokens", "600"]
    assert main(["train", *data, "--epochs", "2"]) == 0
    tokenizer = (out / "tokenizer.json").read_bytes()
    run_json = (out / "run.json").read_text()
    assert main(["train", *data, "--epochs", "3", "--resume"]) == 0
    assert [m["epoch"] for m in metrics(out)] == [0, 1, 2]  # counting on, not 0, 1, 0
    steps = [m["step"] for m in metrics(out)]
    assert steps == sorted(steps) and steps[0] > 0
    # a contradicting setting is refused with a clear message, and nothing is overwritten
    capsys.readouterr()
    assert main(["train", *data, "--train-subset", "200", "--epochs", "4", "--resume"]) == 2
    assert "train_subset=200 (the run has 300)" in capsys.readouterr().err
    assert (out / "tokenizer.json").read_bytes() == tokenizer and (out / "run.json").read_text() == run_json
    assert [m["epoch"] for m in metrics(out)] == [0, 1, 2]
    # a fresh run into an existing run folder is refused too
    assert main(["train", *data, "--epochs", "1"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    # best names the lowest validation loss; a worse later epoch never replaces it
    best_epoch = min(metrics(out), key=lambda m: m["val_loss"])
    _, _, _, state = load_checkpoint(out)
    assert state.accum_step == best_epoch["step"]
