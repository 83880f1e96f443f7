"""CTranslate2 as an independent oracle of the fast engine, and the benchmark against it.

``benchmarks/vs_ctranslate2.py`` rebuilds our model in CTranslate2 (its own C++ Transformer); that
both engines then choose the same greedy tokens checks the engine, and the export the benchmark's
ratios rest on, against code we did not write. CTranslate2 comes with the developers' extras."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tfm_solution import make_model
from tfm_solution.fast import InferenceEngine
from tfm_solution.norm import LayerNorm

ctranslate2 = pytest.importorskip("ctranslate2")
ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("vs_ctranslate2", ROOT / "benchmarks" / "vs_ctranslate2.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

V, PAD, START, END = 60, 0, 1, 2  # CTranslate2's <blank>, <s>, </s>


@pytest.mark.fast
def test_the_engine_chooses_ctranslate2s_greedy_tokens(tmp_path):
    torch.manual_seed(0)
    model = make_model(V, V, N=2, d_model=64, d_ff=128, h=4, dropout=0.0, attention_kernel="sdpa",
                       layer_norm="torch").eval()
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that a misplaced one shows
        for module in model.modules():
            if isinstance(module, LayerNorm):
                module.a_2.uniform_(0.5, 1.5)
                module.b_2.uniform_(-0.5, 0.5)
        model.generator.proj.bias[END] = 1.7  # found by trying: some outputs end early, some run to the limit
    translator = bench.ctranslate2_translator(model, tmp_path / "ct2", None, 1)
    vocab = bench.vocabulary(V)
    lengths = [9, 5, 2, 7]
    src = torch.full((4, 9), PAD)
    for row, n in enumerate(lengths):
        src[row, :n] = torch.randint(4, V, (n,), generator=torch.Generator().manual_seed(row))
    theirs = translator.translate_batch([[vocab[i] for i in src[row, :n]] for row, n in enumerate(lengths)],
                                        beam_size=1, min_decoding_length=0, max_decoding_length=15)
    ours = InferenceEngine(model).greedy_decode(src, (src != PAD).unsqueeze(-2), 16, START, END, PAD)
    for row, result in enumerate(theirs):
        tokens = ours[row, 1:].tolist()
        tokens = tokens[: tokens.index(END)] if END in tokens else tokens
        assert [vocab[i] for i in tokens] == result.hypotheses[0], row
    assert sorted(len(r.hypotheses[0]) for r in theirs) == [0, 9, 15, 15]  # ends at different steps, or none


def test_export_refuses_what_ctranslate2_cannot_compute():
    model = make_model(V, V, N=1, d_model=32, d_ff=64, h=4)  # the notes' LayerNorm
    with pytest.raises(ValueError, match="LayerNorm"):
        bench.ctranslate2_spec(model, bench.vocabulary(V))


@pytest.mark.slow
def test_the_benchmark_prints_every_ratio():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_ctranslate2.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cores" in done.stdout and "load average" in done.stdout
    rows = [line for line in done.stdout.splitlines() if re.match(r"\| [12] \| 8 \|", line)]
    assert len(re.findall(r"\*\*\d+\.\d+x\*\*", rows[0])) == 2  # ours / CT2, float32 and int8
    assert "| 1 | 8 | all equal |" in done.stdout  # CTranslate2's float32 tokens are the engine's
