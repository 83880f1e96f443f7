"""Comparing a returned value with the expected one, in the harness, on plain data only.

The returned value was rebuilt from bytes (see ``worker.unpack_value``): plain tensors,
numbers, tuples. Shapes and dtypes are checked explicitly, NaN never equals anything (not
even NaN), and the report says what a student can act on: shapes, dtypes, the largest
absolute and relative error, and the first index that differs. It never shows values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from autograder.worker import Unsupported


@dataclass
class Verdict:
    """Whether a returned value matches, and the lines that explain it."""

    ok: bool
    lines: list[str]


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)}, dtype {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    if isinstance(value, Unsupported):
        return value.why
    return f"a {type(value).__name__}"


def close(got, expected, rtol: float, atol: float) -> bool:
    """Same structure, shapes and dtypes, values within tolerance; NaN never matches."""
    return compare(got, expected, rtol, atol).ok


def compare(got, expected, rtol: float, atol: float, where: str = "result", names: tuple[str, ...] = ()) -> Verdict:
    """Compare ``got`` with ``expected`` (tensors, tuples of them, numbers); ``names`` label a tuple's items."""
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            return Verdict(False, [f"{where}: expected a tuple of {len(expected)} items, got {_describe(got)}"])
        lines, ok = [], True
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            verdict = compare(g, e, rtol, atol, names[i] if i < len(names) else f"{where}[{i}]")
            ok &= verdict.ok
            lines += verdict.lines
        return Verdict(ok, lines)
    if not isinstance(expected, torch.Tensor):
        ok = type(got) is type(expected) and got == expected
        return Verdict(ok, [] if ok else [f"{where}: expected {_describe(expected)}, got {_describe(got)}"])
    if not isinstance(got, torch.Tensor):
        return Verdict(False, [f"{where}: expected a {_describe(expected)}, got {_describe(got)}"])
    if got.shape != expected.shape:
        return Verdict(False, [f"{where}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"])
    if got.dtype != expected.dtype:
        return Verdict(False, [f"{where}: dtype {str(got.dtype).removeprefix('torch.')}, "
                               f"expected {str(expected.dtype).removeprefix('torch.')}"])
    if not (got.is_floating_point() or expected.is_floating_point()):
        bad = got != expected
    else:
        g, e = got.double(), expected.double()
        bad = ~torch.isclose(g, e, rtol=rtol, atol=atol) | g.isnan() | (e.isnan() & ~g.isnan())
    if not bool(bad.any()):
        return Verdict(True, [])
    lines = [f"{where}: {int(bad.sum())} of {bad.numel()} values differ ({_describe(got)})"]
    first = tuple(int(i) for i in bad.nonzero()[0])
    lines.append(f"{where}: first mismatch at index {list(first)}")
    if got.is_floating_point():
        g, e = got.double(), expected.double()
        nan = int(g.isnan().sum())
        if nan:
            lines.append(f"{where}: {nan} NaN value(s) in your output")
        finite = g.isfinite() & e.isfinite()
        if bool(finite.any()):
            diff = (g - e).abs()[finite]
            rel = diff / e.abs()[finite].clamp_min(1e-12)
            lines.append(f"{where}: max absolute error {diff.max().item():.3g}, max relative error "
                         f"{rel.max().item():.3g} (tolerance rtol={rtol:g}, atol={atol:g})")
    return Verdict(False, lines)
