"""DistributedDataParallel through torchrun: two CPU processes (gloo) follow the same loss curve
as one process with a batch twice as large; each rank takes its own GPU (checked with CUDA mocked);
a time limit stops every rank at the same step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tfm_solution import training
from tfm_solution.training import data_parallel, rank_device

HELPER = Path(__file__).with_name("_train_ddp.py")


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_twice_the_batch(tmp_path):
    env_cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    subprocess.run([*env_cmd, str(HELPER), str(tmp_path / "ddp.json")], check=True, timeout=300)
    subprocess.run([sys.executable, str(HELPER), str(tmp_path / "single.json")], check=True, timeout=300)
    ddp = json.loads((tmp_path / "ddp.json").read_text())
    single = json.loads((tmp_path / "single.json").read_text())
    assert (ddp["world"], single["world"]) == (2, 1)
    assert len(ddp["losses"]) == len(single["losses"]) == 8
    assert ddp["losses"][0] > ddp["losses"][-1]  # it learns
    assert ddp["losses"] == pytest.approx(single["losses"], rel=1e-4, abs=1e-5)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four CUDA devices as far as the device choice can tell; records set_device."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(torch.device(d)))
    return chosen


@pytest.mark.fast
@pytest.mark.parametrize("local_rank", [0, 3])
def test_each_torchrun_rank_takes_its_own_gpu(monkeypatch, fake_gpus, local_rank):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    for name in ("auto", "cuda", f"cuda:{local_rank}"):
        assert rank_device(name) == torch.device("cuda", local_rank)
    assert fake_gpus == [torch.device("cuda", local_rank)] * 3  # made current before the group starts
    assert rank_device("cpu") == torch.device("cpu")  # CPU ranks stay on the CPU (gloo)
    other = (local_rank + 1) % 4
    with pytest.raises(ValueError, match=f"cuda:{other} contradicts LOCAL_RANK={local_rank}"):
        rank_device(f"cuda:{other}")
    monkeypatch.setenv("LOCAL_RANK", "7")
    with pytest.raises(ValueError, match="only 4 CUDA device"):
        rank_device("auto")


@pytest.mark.fast
def test_one_process_keeps_the_plain_device_choice(monkeypatch, fake_gpus):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert rank_device("auto") == torch.device("cuda") and rank_device("cuda:2") == torch.device("cuda:2")
    assert fake_gpus == []


@pytest.mark.fast
def test_ddp_gets_this_ranks_gpu_as_its_only_device(monkeypatch):
    calls = []
    monkeypatch.setattr(training, "DistributedDataParallel", lambda model, **kw: calls.append(kw) or "wrapped")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    model = torch.nn.Linear(2, 2)
    assert data_parallel(model, torch.device("cuda", 2)) == "wrapped"
    assert data_parallel(model, torch.device("cpu")) == "wrapped"
    assert calls == [{"device_ids": [2]}, {"device_ids": None}]
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1)
    assert data_parallel(model, torch.device("cpu")) is model


def json_objects(text: str) -> list:
    """Every JSON object printed in ``text`` (two processes' lines may run together)."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at != -1:
        try:
            obj, end = decoder.raw_decode(text, at)
            found.append(obj)
        except ValueError:
            end = at + 1
        at = text.find("{", end)
    return found


@pytest.mark.slow
def test_two_gloo_processes_with_a_time_limit_stop_at_the_same_step(tmp_path):
    """Rank 0 alone decides when time is up and tells the other: no rank hangs in an all-reduce."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "-m",
           "tfm_solution", "train", "--task", "copy", "--config", "tiny", "--device", "cpu", "--out", str(out),
           "--max-seconds", "6", "--epochs", "50", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    finals = [o for o in json_objects(done.stdout) if "step" in o]
    assert len(finals) == 2, done.stdout  # one final metrics line per rank
    assert finals[0]["step"] == finals[1]["step"] > 0
    assert finals[0]["epoch"] == finals[1]["epoch"]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = logged[-1]
    assert last["step"] == finals[0]["step"] and last["epoch"] < 49, last  # the time limit stopped it, not the epochs
    # A stop inside an epoch logs that epoch as partial; on a loaded machine the limit can fall on an epoch's end,
    # and then the last line is that whole epoch (its steps a multiple of the first epoch's).
    assert last.get("partial") or (not logged[0].get("partial") and last["step"] % logged[0]["step"] == 0), logged
