"""Comparing a returned value with the expected one, in the harness, on plain data only.

The returned value was rebuilt from bytes (see ``worker.unpack_value``): plain tensors,
numbers, tuples. Shapes and dtypes are checked explicitly, NaN never equals anything (not
even NaN), and the report says what a student can act on: shapes, dtypes, the largest
absolute and relative error, and the first index that differs. It never shows values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from autograder import feedback
from autograder.worker import MAX_BUILDS, MAX_NAME_CHARS, MAX_STRUCTURE_ENTRIES, Unsupported


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
        return feedback.code(value.why)  # the worker's words (a class name, say): shown as code
    return f"a {type(value).__name__}"


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


def parse_structures(tree) -> list[dict]:
    """The worker's ``{"builds": [...]}``: one structure description per build (``worker.describe_structure``).

    Raises ``ValueError`` unless each is exactly the expected JSON shape: it is untrusted data.
    """
    builds = tree.get("builds") if isinstance(tree, dict) and set(tree) == {"builds"} else None
    if not isinstance(builds, list) or not 0 < len(builds) <= MAX_BUILDS:
        raise ValueError("malformed structure list")
    return [parse_structure(item) for item in builds]


def parse_structure(tree) -> dict:
    """One structure description, checked item by item (``ValueError`` unless well formed)."""

    def shape(value) -> bool:
        return value is None or (isinstance(value, list) and len(value) <= 16
                                 and all(type(s) is int and s >= 0 for s in value))

    def entries(key: str, width: int) -> list:
        items = tree.get(key)
        if not isinstance(items, list) or len(items) > MAX_STRUCTURE_ENTRIES:
            raise ValueError(f"malformed {key}")
        for item in items:
            if not (isinstance(item, list) and len(item) == width and isinstance(item[0], str)
                    and len(item[0]) <= MAX_NAME_CHARS and shape(item[1])
                    and (width == 2 or type(item[2]) is bool)):
                raise ValueError(f"malformed entry in {key}")
        return [[feedback.name(item[0]), *item[1:]] for item in items]  # shown between backticks: made inert

    if not isinstance(tree, dict) or set(tree) != {"parameters", "buffers", "state_dict"}:
        raise ValueError("malformed structure")
    return {"parameters": entries("parameters", 3), "buffers": entries("buffers", 2),
            "state_dict": entries("state_dict", 2)}


def _size(shape: list[int] | None) -> str:
    return "not a tensor" if shape is None else f"shape {tuple(shape)}"


def compare_structures(got: list[dict], expected: list[dict]) -> Verdict:
    """The module as built by each case's arguments (the first: the first case's); each difference named once."""
    if len(got) != len(expected):
        return Verdict(False, [f"{len(got)} modules were described, expected {len(expected)}"])
    lines: list[str] = []
    seen: set[str] = set()
    for number, (g, e) in enumerate(zip(got, expected, strict=True)):
        # Later builds only add what the first did not show (a default argument, another size).
        for line in _differences(g, e):
            if line not in seen:
                seen.add(line)
                lines.append(line if number == 0 else f"built with another case's arguments: {line}")
    return Verdict(not lines, [*lines, _holds(expected[0])] if lines else [])


def _holds(expected: dict) -> str:
    names = ", ".join(f"`{k}` {_size(s).removeprefix('shape ')}" for k, s in expected["state_dict"][:12])
    return f"the reference's state_dict holds: {names or 'nothing'}"


def _differences(got: dict, expected: dict) -> list[str]:
    """Parameters vs buffers, ``requires_grad``, shapes and ``state_dict`` keys, by name: one line per difference."""
    g_par = {n: (s, rg) for n, s, rg in got["parameters"]}
    e_par = {n: (s, rg) for n, s, rg in expected["parameters"]}
    g_buf, e_buf = {n: s for n, s in got["buffers"]}, {n: s for n, s in expected["buffers"]}
    g_sd, e_sd = {k: s for k, s in got["state_dict"]}, {k: s for k, s in expected["state_dict"]}
    lines = []
    for name in [*e_par, *e_buf]:
        wanted = e_par[name][0] if name in e_par else e_buf[name]
        if name in e_buf and name in g_par:
            lines.append(f"`{name}` is a trainable parameter; the reference registers it as a buffer (saved with "
                         "the module, moved by .to(), never trained): use register_buffer")
        elif name in e_par and name in g_buf:
            lines.append(f"`{name}` is a buffer; it must be a trainable parameter (nn.Parameter, or the weight "
                         "of a layer)")
        elif name not in g_par and name not in g_buf:
            how = "register_buffer" if name in e_buf else "nn.Parameter or a layer"
            lines.append(f"`{name}` is missing: the reference has a {'buffer' if name in e_buf else 'parameter'} "
                         f"of that name with {_size(wanted)} (a tensor kept as a plain attribute is neither saved "
                         f"nor moved with the module: use {how}, with the notes' names)")
        else:
            shape = g_par[name][0] if name in g_par else g_buf[name]
            if shape != wanted:
                lines.append(f"`{name}` has {_size(shape)}, expected {_size(wanted)}")
            if name in e_par and name in g_par and g_par[name][1] != e_par[name][1]:
                lines.append(f"`{name}` is frozen (requires_grad=False): training would never change it"
                             if e_par[name][1] else f"`{name}` is trainable; the reference freezes it")
    for name in [*g_par, *g_buf]:
        if name not in e_par and name not in e_buf:
            kind = "parameter" if name in g_par else "buffer"
            lines.append(f"your module has a {kind} `{name}` that the reference does not have")
    for key in e_sd:
        if key in g_sd:
            continue
        if key in g_buf:
            lines.append(f"`{key}` is a buffer left out of the state_dict (persistent=False); the reference saves it")
        elif key in g_par or (key not in e_par and key not in e_buf):
            lines.append(f"`{key}` is missing from the state_dict")
    for key in g_sd:
        if key in e_sd:
            continue
        if key in e_buf:
            lines.append(f"`{key}` is saved in your state_dict; the reference's buffer is not (persistent=False)")
        elif key not in g_par and key not in g_buf:
            lines.append(f"your state_dict has an entry `{key}` that the reference's does not have")
    return lines


def xavier_counts(matrices) -> tuple[int, int, int] | None:
    """``(beyond the bound, spread not Xavier's, equal to another)``: how many of the matrices fail
    each property of Xavier-uniform initialization; ``None`` unless given a tuple of tensors.

    A matrix of fan-in ``n_in`` and fan-out ``n_out`` drawn from U(-a, a), ``a = sqrt(6 / (n_in +
    n_out))``, lies within ``a`` and has standard deviation ``a / sqrt(3)``. The sample's standard
    deviation over ``n`` entries varies by about ``0.45 / sqrt(n)`` relatively, so a deviation beyond
    ``2.7 / sqrt(n)`` (six of those) is a different initialization, not bad luck. Two equal matrices
    were initialized once and then copied.
    """
    if not isinstance(matrices, tuple) or not all(isinstance(m, torch.Tensor) and m.is_floating_point()
                                                  and m.dim() > 1 and m.numel() for m in matrices):
        return None
    beyond = spread = equal = 0
    for i, m in enumerate(matrices):
        fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(m)
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        w = m.double()
        beyond += bool(w.abs().max() > bound * (1 + 1e-5))
        spread += bool(abs(w.std() * math.sqrt(3) / bound - 1) > max(0.05, 2.7 / math.sqrt(w.numel())))
        equal += any(o.shape == m.shape and torch.equal(o, m) for o in matrices[:i] + matrices[i + 1:])
    return beyond, spread, equal


_XAVIER_LINES = (
    "{} of {} matrices have entries beyond the Xavier-uniform bound sqrt(6 / (fan_in + fan_out)) "
    "(is nn.init.xavier_uniform_ applied to every parameter with more than one dimension?)",
    "{} of {} matrices do not have the spread of Xavier-uniform values, std = bound / sqrt(3) "
    "(another initialization, or none: PyTorch's defaults differ)",
    "{} of {} matrices are equal to another one: initialized once, then copied (initialize after "
    "building the whole model)",
)


def compare_xavier(got, expected) -> Verdict:
    """The initialization of the matrices a model was built with, judged by ``xavier_counts``
    (``expected``, the reference's, fixes what the counts must be: none fails)."""
    wanted = xavier_counts(expected)
    found = xavier_counts(got)
    if wanted is None:
        raise ValueError("the reference's matrices are malformed")
    if found is None:
        return Verdict(False, [f"expected the model's matrices (a tuple of tensors), got {_describe(got)}"])
    lines = [line.format(f, len(got)) for line, f, w in zip(_XAVIER_LINES, found, wanted, strict=True) if f != w]
    return Verdict(not lines, lines)
