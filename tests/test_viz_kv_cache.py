"""Chapter 11's widgets: the cache growing, measured times, the memory calculator: frames, links, and
the student's ``kv_cache_bytes`` or the reference."""

from __future__ import annotations

import ipywidgets as widgets
import pytest

from tfm_solution.kv_cache import kv_cache_bytes
from tfm_solution.viz.kv_cache import PRESETS, cache_growth, human_bytes, memory_calculator, timing_explorer

pytestmark = pytest.mark.fast


def _stub(*args, **kwargs):
    raise NotImplementedError()


def _student_bytes(batch, layers, heads, head_dim, length, dtype, src_len=0):
    return kv_cache_bytes(batch, layers, heads, head_dim, length, dtype, src_len)


def _keys_only(batch, layers, heads, head_dim, length, dtype, src_len=0):
    return kv_cache_bytes(batch, layers, heads, head_dim, length, dtype, src_len) // 2


def _leaves(widget):
    if isinstance(widget, widgets.Stack):
        return [leaf for child in widget.children for leaf in _leaves(child)]
    return [widget]


def test_human_bytes():
    assert human_bytes(512) == "512 B" and human_bytes(2048) == "2.0 KiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB" and human_bytes(5 * 2**40) == "5120.0 GiB"


def test_cache_growth_counts_rows_and_bytes_per_step():
    tokens = ["<s>", "A", "dog", "runs", "</s>"]
    player = cache_growth(tokens, ["Ein", "Hund", "</s>"], layers=2, heads=4, head_dim=8, kv_cache_bytes=_student_bytes)
    frames = [f.value for f in player.stack.children]
    assert len(frames) == 4 and "your own" in player.children[0].value
    # step 3 reads "dog" and predicts "runs": 3 cached rows per layer, 1 + 2 + 3 = 6 without the cache
    assert "reads <b>dog</b> and predicts <b>runs</b>" in frames[2]
    assert "cached <b>3</b>, uncached <b>6</b>" in frames[2]
    # bytes: K and V, 2 layers, 4 heads of 8, (3 + 3 source) positions, 4 bytes = 3072 B
    assert human_bytes(2 * 2 * 4 * 8 * 6 * 4) in frames[2] and frames[2].count("self K, V") == 2
    wrong = cache_growth(tokens, ["Ein"], 1, 1, 2, _keys_only)
    assert "differ" in wrong.children[0].value
    assert "stub" in cache_growth(tokens, ["Ein"], 1, 1, 2, _stub).children[0].value


def test_memory_calculator_frames_by_hand():
    nest = memory_calculator(_student_bytes)
    frames = [leaf.value for leaf in _leaves(nest.stack)]
    assert len(frames) == len(PRESETS) * 3 * 3 and len(set(frames)) == len(frames)
    seven_b = PRESETS.index(next(p for p in PRESETS if p.name.startswith("7B")))
    mha_fp16 = frames[seven_b * 9 + 0 * 3 + 1]
    # 7B, MHA, 2 bytes, 4,096 tokens, batch 1: 2 * 32 layers * 32 heads * 128 * 4096 * 2 = 2 GiB
    assert "4,096 tokens</th><td style='padding:2px 10px;text-align:right'>2.0 GiB" in mha_fp16
    mqa_fp16 = frames[seven_b * 9 + 2 * 3 + 1]
    assert "<b>1</b> key/value head of 128" in mqa_fp16
    assert "(decoder-only: no cross-attention)" in mha_fp16 and "cross-attention cache" in frames[0]


def test_timing_explorer_draws_each_model_and_view():
    rows = [{"length": n, "cached_s": 0.01 * n, "uncached_s": 0.001 * n * n, "speedup": 0.1 * n} for n in (8, 16, 32)]
    entry = {"name": "m", "rows": rows, "fitted_exponent": {"cached": 1.0, "uncached": 2.0}}
    timing = {"command": "python scripts/kv_cache_timing.py", "batch": 1, "repeats": 3,
              "models": [entry, {**entry, "name": "n"}]}
    nest = timing_explorer(timing)
    frames = [leaf.value for leaf in _leaves(nest.stack)]
    assert len(frames) == 4 and all(f[:8] == b"\x89PNG\r\n\x1a\n" for f in frames) and len(set(frames)) == 4
    assert "scripts/kv_cache_timing.py" in nest.children[0].value
