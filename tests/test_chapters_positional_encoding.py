"""Chapter 2: the notebook's visible tests catch the mistakes the chapter names (the grader's
verdicts on every chapter's notebooks are in ``test_grader_submissions.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

from tfm_solution.positional_encoding import PositionalEncoding, positional_encoding, rotation_matrix


CHAPTER = "02_positional_encoding"
_ROOT = Path(__file__).resolve().parents[1]
SOLUTION = _ROOT / "solutions" / CHAPTER / "positional_encoding.ipynb"


# --- the visible tests of the notebook, run on the reference and on wrong answers ---------------


def _visible_tests(prefix: str) -> list[str]:
    cells = nbformat.read(SOLUTION, as_version=4).cells
    found = [c.source for c in cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(prefix + "-visible")]
    assert found, f"no visible tests for {prefix}"
    return found


def _run_visible(prefix: str, names: dict) -> None:
    for source in _visible_tests(prefix):
        exec(source, {"math": math, "torch": torch, "nn": nn, "print": lambda *a, **k: None, **names})  # noqa: S102


def _table(seq_len, d_model, *, omega=None, fill="interleaved", start=0):
    """A sinusoid table written independently of the reference, with switches for known mistakes."""
    pos = torch.arange(start, start + seq_len, dtype=torch.float64)[:, None]
    if omega is None:
        omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angle = pos * omega
    if fill == "halves":
        return torch.cat([torch.sin(angle), torch.cos(angle)], 1).float()
    sin, cos = (torch.cos(angle), torch.sin(angle)) if fill == "swapped" else (torch.sin(angle), torch.cos(angle))
    return torch.stack([sin, cos], -1).flatten(1).float()


def _per_dimension(seq_len, d_model):
    j = torch.arange(d_model, dtype=torch.float64)
    angle = torch.arange(seq_len, dtype=torch.float64)[:, None] * 10000.0 ** (-j / d_model)
    return torch.where(j % 2 == 0, torch.sin(angle), torch.cos(angle)).float()


PE_MUTANTS = {
    "sin_cos_swapped": lambda n, d: _table(n, d, fill="swapped"),
    "halves_not_interleaved": lambda n, d: _table(n, d, fill="halves"),
    "positions_start_at_one": lambda n, d: _table(n, d, start=1),
    "pair_index_not_doubled": lambda n, d: _table(n, d, omega=10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d)),
    "exponent_per_dimension": _per_dimension,
    "float64_result": lambda n, d: _table(n, d).double(),
}


@pytest.mark.fast
def test_visible_table_tests_pass_on_the_reference():
    _run_visible("ch02-positional-encoding", {"positional_encoding": positional_encoding})
    _run_visible("ch02-positional-encoding", {"positional_encoding": _table})  # the independent one agrees


@pytest.mark.fast
@pytest.mark.parametrize("mutant", sorted(PE_MUTANTS))
def test_visible_table_tests_fail_on_known_mistakes(mutant):
    with pytest.raises(AssertionError):
        _run_visible("ch02-positional-encoding", {"positional_encoding": PE_MUTANTS[mutant]})


def _module(forward, *, buffer="pe", batched=True, parameter=False):
    class Mutant(nn.Module):
        def __init__(self, d_model, dropout, max_len=5000):
            super().__init__()
            self.dropout = nn.Dropout(dropout)
            table = positional_encoding(max_len, d_model)
            table = table.unsqueeze(0) if batched else table
            if parameter:
                self.pe = nn.Parameter(table)
            else:
                self.register_buffer(buffer, table)

        def forward(self, x):
            return forward(self, x, getattr(self, buffer))

    return Mutant


MODULE_MUTANTS = {
    "parameter_not_buffer": _module(lambda m, x, pe: m.dropout(x + pe[:, : x.size(1)].to(x.dtype)), parameter=True),
    "buffer_not_named_pe": _module(lambda m, x, pe: m.dropout(x + pe[:, : x.size(1)].to(x.dtype)), buffer="table"),
    "no_batch_axis": _module(lambda m, x, pe: m.dropout(x + pe[: x.size(1)].to(x.dtype)), batched=False),
    "positions_start_at_one": _module(lambda m, x, pe: m.dropout(x + pe[:, 1 : x.size(1) + 1].to(x.dtype))),
    "result_dtype_promoted": _module(lambda m, x, pe: m.dropout(x + pe[:, : x.size(1)])),
    "no_dropout": _module(lambda m, x, pe: x + pe[:, : x.size(1)].to(x.dtype)),
    "scales_by_sqrt_d_model": _module(lambda m, x, pe: m.dropout(x * math.sqrt(x.size(-1)) + pe[:, : x.size(1)].to(x.dtype))),
}


@pytest.mark.fast
def test_visible_module_tests_pass_on_the_reference():
    _run_visible("ch02-positional-encoding-module", {"PositionalEncoding": PositionalEncoding})


@pytest.mark.fast
@pytest.mark.parametrize("mutant", sorted(MODULE_MUTANTS))
def test_visible_module_tests_fail_on_known_mistakes(mutant):
    with pytest.raises((AssertionError, RuntimeError)):
        _run_visible("ch02-positional-encoding-module", {"PositionalEncoding": MODULE_MUTANTS[mutant]})


def _rotation(k, d_model, *, sign=1.0, omega=None):
    if omega is None:
        omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    blocks = [torch.tensor([[math.cos(k * w), sign * math.sin(k * w)], [-sign * math.sin(k * w), math.cos(k * w)]],
                           dtype=torch.float64) for w in omega.tolist()]
    return torch.block_diag(*blocks)


ROTATION_MUTANTS = {
    "rotates_backwards": lambda k, d: _rotation(k, d, sign=-1.0),
    "angle_without_frequency": lambda k, d: _rotation(k, d, omega=torch.ones(d // 2, dtype=torch.float64)),
    "pair_index_not_doubled": lambda k, d: _rotation(k, d, omega=10000.0 ** (-torch.arange(d // 2) / d)),
    "float32_result": lambda k, d: _rotation(k, d).float(),
    "ignores_the_sign_of_k": lambda k, d: _rotation(abs(k), d),
}


@pytest.mark.fast
def test_visible_rotation_tests_pass_on_the_reference_and_an_independent_build():
    for fn in (rotation_matrix, _rotation):
        _run_visible("ch02-rotation-matrix", {"rotation_matrix": fn})


@pytest.mark.fast
@pytest.mark.parametrize("mutant", sorted(ROTATION_MUTANTS))
def test_visible_rotation_tests_fail_on_known_mistakes(mutant):
    with pytest.raises(AssertionError):
        _run_visible("ch02-rotation-matrix", {"rotation_matrix": ROTATION_MUTANTS[mutant]})
