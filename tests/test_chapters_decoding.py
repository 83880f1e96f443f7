"""Chapter 10: the notebook's visible tests pass on the reference and fail on the declared mistakes and
on the practice exercise's classic bugs; the measurements file the notebook loads is complete (the
grader's verdicts on every chapter are in ``test_grader_submissions.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.mistakes import mistake_function
from autograder.registry import by_id
from tfm_solution import make_model, subsequent_mask
from tfm_solution.data import BOS, EOS, PAD
from tfm_solution.decoding import beam_step, greedy_decode, top_k_top_p_filter

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "10_decoding" / "decoding.ipynb"


def _visible(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    return [c.source for c in cells
            if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]


def _run_visible(prefix: str, names: dict) -> None:
    sources = _visible(prefix)
    assert sources, f"no visible tests for {prefix}"
    for source in sources:
        scope = {"math": math, "torch": torch, "subsequent_mask": subsequent_mask, "make_model": make_model,
                 "BOS": BOS, "EOS": EOS, "PAD": PAD, **names, "print": lambda *a, **k: None}
        exec(source, scope)  # noqa: S102


@pytest.mark.parametrize("exercise_id,prefix,reference", [
    ("ch10.top_k_top_p_filter", "ch10-top-k-top-p-filter", top_k_top_p_filter),
    ("ch10.beam_step", "ch10-beam-step", beam_step),
])
def test_visible_tests_pass_on_the_reference_and_fail_on_every_declared_mistake(exercise_id, prefix, reference):
    name = by_id(exercise_id).name
    _run_visible(prefix, {name: reference})
    for mistake in by_id(exercise_id).mistakes:
        with pytest.raises((AssertionError, RuntimeError, IndexError)):
            _run_visible(prefix, {name: mistake_function(exercise_id, mistake, name)})


def _greedy_variant(keep_generating=False, stop_at_any=False, no_mask=False, pad=None, extra_column=False):
    """The practice exercise with one classic bug switched on."""

    def decode(model, src, src_mask, max_len, start_symbol, end_symbol=None, pad_id=PAD):
        memory = model.encode(src, src_mask)
        ys = torch.full((src.size(0), 1), start_symbol, dtype=torch.long)
        finished = torch.zeros(src.size(0), dtype=torch.bool)
        for _ in range(max_len - (0 if extra_column else 1)):
            mask = torch.ones(1, ys.size(1), ys.size(1), dtype=torch.bool) if no_mask else subsequent_mask(ys.size(1))
            nxt = model.generator(model.decode(memory, src_mask, ys, mask)[:, -1]).argmax(-1)
            if not keep_generating:
                nxt = nxt.masked_fill(finished, pad if pad is not None else pad_id)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
            if end_symbol is not None:
                finished |= nxt == end_symbol
                if bool(finished.any() if stop_at_any else finished.all()):
                    break
        return ys

    return lambda model, src, src_mask, max_len, start_symbol, end_symbol=None, pad=PAD: decode(
        model, src, src_mask, max_len, start_symbol, end_symbol, pad)


def test_greedy_visible_tests_pass_on_the_reference_and_catch_the_classic_bugs():
    uncached = lambda *args, **kwargs: greedy_decode(*args, **kwargs, use_cache=False)  # noqa: E731
    _run_visible("ch10-greedy-decode", {"greedy_decode": uncached})  # the exercise's contract: no cache
    _run_visible("ch10-greedy-decode", {"greedy_decode": _greedy_variant()})  # the oracle of the bugs is right
    for bug in ({"keep_generating": True}, {"stop_at_any": True}, {"no_mask": True}, {"pad": 0},
                {"extra_column": True}):
        with pytest.raises(AssertionError):
            _run_visible("ch10-greedy-decode", {"greedy_decode": _greedy_variant(**bug)})


def test_the_measurements_file_has_every_row_the_notebook_prints():
    data = json.loads((REPO / "tfm_solution" / "assets" / "decoding_quality.json").read_text())
    names = [row["name"] for row in data["rows"]]
    assert names[:9] == ["greedy"] + [f"beam {w}" for w in range(1, 9)]
    assert {"beam 4, alpha 0", "sample T=1", "sample top-p 0.9"} <= set(names)
    assert data["width1_equals_greedy"] is True
    assert len(data["val_pairs"]) == 40 and all(len(p) == 2 for p in data["val_pairs"])
    greedy = data["rows"][0]
    assert greedy["time_ratio"] == 1.0 and all(0 <= r["bleu"] <= 100 for r in data["rows"])
    # deterministic strategies repeat one output: about 1 / 5 of the bigrams are distinct
    assert greedy["distinct2"] <= 0.21 and all(r["distinct2"] > greedy["distinct2"] for r in data["rows"]
                                               if r["name"].startswith("sample"))
    # every beam search but width 1 carries its paired-bootstrap p-value against greedy search
    tested = {r["name"] for r in data["rows"] if "p_vs_greedy" in r}
    assert tested == {f"beam {w}" for w in range(2, 9)} | {"beam 4, alpha 0"}
    assert all(0 < r["p_vs_greedy"] <= 1 for r in data["rows"] if "p_vs_greedy" in r)

