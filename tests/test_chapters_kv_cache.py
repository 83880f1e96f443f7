"""Chapter 11: the notebook's visible tests pass on the reference and fail on the declared mistakes;
the practice exercise's visible tests catch its classic bugs and flag (without failing) a decoder that
re-projects the encoder memory at every step; the timing file the notebook loads is complete (the
grader's verdicts on every chapter are in ``test_grader_submissions.py``)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import nbformat
import pytest

from autograder.mistakes import mistake_function
from autograder.registry import by_id
from tfm_solution.kv_cache import CachedSelfAttention, kv_cache_bytes

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "11_kv_cache" / "kv_cache.ipynb"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def _cells():
    return nbformat.read(SOLUTION, as_version=4).cells


def _grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


@pytest.fixture(scope="module")
def notebook_globals() -> dict:
    """What the notebook has defined when its exercises start: its setup cell, run once."""
    setup = next(c.source for c in _cells() if c.cell_type == "code" and "load_course_model()" in c.source)
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(setup, namespace)  # noqa: S102
    return namespace


def _run_visible(prefix: str, namespace: dict, names: dict) -> str:
    sources = [c.source for c in _cells() if _grade_id(c).startswith(prefix + "-visible")]
    assert sources, f"no visible tests for {prefix}"
    scope = {**namespace, **names}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in sources:
            exec(source, scope)  # noqa: S102 - the same namespace, as in the notebook
    return out.getvalue()


@pytest.mark.parametrize("exercise_id,prefix,reference", [
    ("ch11.CachedSelfAttention", "ch11-cached-self-attention", CachedSelfAttention),
    ("ch11.kv_cache_bytes", "ch11-kv-cache-bytes", kv_cache_bytes),
])
def test_visible_tests_pass_on_the_reference_and_fail_on_every_declared_mistake(exercise_id, prefix, reference,
                                                                                 notebook_globals):
    name = by_id(exercise_id).name
    _run_visible(prefix, notebook_globals, {name: reference})
    for mistake in by_id(exercise_id).mistakes:
        with pytest.raises((AssertionError, RuntimeError)):
            _run_visible(prefix, notebook_globals, {name: mistake_function(exercise_id, mistake, name)})


def _cached_decoder(namespace: dict, **replace: str):
    """The notebook's answer to the practice exercise, with text replacements (a mutant)."""
    source = next(c.source for c in _cells() if _grade_id(c) == "ch11-greedy-decode-cached")
    source = "\n".join(line for line in source.splitlines() if not line.strip().startswith(MARKERS))
    for old, new in replace.items():
        assert old in source, old
        source = source.replace(old, new)
    scope = dict(namespace)
    exec(source, scope)  # noqa: S102
    return scope["greedy_decode_cached"]


def test_practice_exercise_visible_tests_catch_the_classic_bugs(notebook_globals):
    prefix = "ch11-greedy-decode-cached"
    printed = _run_visible(prefix, notebook_globals, {"greedy_decode_cached": _cached_decoder(notebook_globals)})
    assert "static cross-attention cache" in printed and "slow" not in printed
    for bug in ({"position.pe[:, t:t + 1]": "position.pe[:, 0:1]"},  # every token at position 0
                {"model.decoder.norm(x)[:, -1]": "x[:, -1]"},  # the decoder's final norm forgotten
                {"next_word = next_word.masked_fill(finished, pad)": "pass"}):  # finished sentences go on
        with pytest.raises(AssertionError):
            _run_visible(prefix, notebook_globals, {"greedy_decode_cached": _cached_decoder(notebook_globals, **bug)})


def test_recomputing_the_cross_attention_is_correct_but_flagged_slow(notebook_globals):
    slow = _cached_decoder(notebook_globals, **{
        "cross_attention(layer.src_attn, y, *cross[i])": "layer.src_attn(y, memory, memory, src_mask)"})
    printed = _run_visible("ch11-greedy-decode-cached", notebook_globals, {"greedy_decode_cached": slow})
    assert "correct tokens, but slow" in printed


def test_the_timing_file_has_what_the_notebook_prints():
    data = json.loads((REPO / "tfm_solution" / "assets" / "kv_cache_timing.json").read_text())
    assert [m["name"].split(" (")[0] for m in data["models"]] == ["course model", "base size"]
    for entry in data["models"]:
        lengths = [r["length"] for r in entry["rows"]]
        assert lengths == sorted(lengths) and len(lengths) >= 3
        assert all(r["speedup"] == pytest.approx(r["uncached_s"] / r["cached_s"]) for r in entry["rows"])
        assert set(entry["fitted_exponent"]) == {"cached", "uncached"}
        assert entry["layout"]["length"] == lengths[-1]
    real = data["sentences"]
    assert real["count"] == 40 and [r["batch"] for r in real["rows"]] == [1, 40]
    assert all(r["speedup"] == pytest.approx(r["uncached_s"] / r["cached_s"]) for r in real["rows"])
