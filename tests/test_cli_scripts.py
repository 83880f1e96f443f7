"""The benchmark scripts and the GPU recipe run end to end at a tiny size (on the CPU)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ["kv_cache_speedup", "vs_hf_generate", "training_throughput", "weight_read_bound"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_script_runs_and_prints_a_ratio_table(name):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cores" in done.stdout and "torch" in done.stdout  # the machine's facts
    assert re.search(r"\|\s*\d+\.\d+x\s*\|", done.stdout), done.stdout  # a measured ratio in a table row


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MULTI30K_DIR"), reason="needs the Multi30k mirror (CI sets MULTI30K_DIR)")
def test_gpu_recipe_runs_on_cpu_with_a_tiny_config(tmp_path):
    env = dict(os.environ, CONFIG="tiny", DEVICE="cpu", MAX_STEPS="4", SUBSET="200", LIMIT="8", BENCH_TOKENS="4",
               TRAIN_SECONDS="120", OUT=str(tmp_path / "run"), PYTHON=sys.executable)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '"tokens_per_s"' in out and '"val_loss"' in out
    assert len(re.findall(r"test: BLEU \d+\.\d+", out)) == 2 and "greedy)" in out and "beam)" in out
    assert re.search(r"speedup \d+\.\d+x \(identical tokens\)", out)
