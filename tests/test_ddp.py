"""DistributedDataParallel through torchrun: two CPU processes (gloo) follow the same loss curve
as one process with a batch twice as large."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
