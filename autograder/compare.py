"""Comparing a returned value with the expected one, in the harness, on plain data only.

The returned value was rebuilt from bytes (see ``sandboxed.wire.unpack_value``): plain tensors,
numbers, tuples. Shapes and dtypes are checked explicitly, NaN never equals anything (not
even NaN), and the report says what a student can act on: shapes, dtypes, the largest
absolute and relative error, and the first index that differs. It never shows values.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from autograder import feedback
from autograder.exercises.shared import CHECKS
from autograder.sandboxed.procedure import MAX_BUILDS, MAX_NAME_CHARS, MAX_STRUCTURE_ENTRIES, generator_states
from autograder.sandboxed.wire import Unsupported


@dataclass
class Verdict:
    """Whether a returned value matches, and the lines that explain it."""

    ok: bool
    lines: list[str]
    answer_ok: bool = True  # the returned values alone were right (what failed, if anything, is the contract)


SCALAR_RTOL = 1e-12
"""Relative tolerance of a Python float result: both sides compute in float64, in any order of operations."""


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)}, dtype {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    if isinstance(value, Unsupported):
        return feedback.code(value.why)  # the worker's words (a class name, say): shown as code
    if isinstance(value, torch.dtype):
        return "a torch dtype"
    return f"a {type(value).__name__}"


def compare(got, expected, rtol: float, atol: float, where: str = "result", names: tuple[str, ...] = (),
            widen: tuple[str, ...] = ()) -> Verdict:
    """Compare ``got`` with ``expected`` (tensors, tuples of them, numbers, strings, dtypes); ``names`` label
    a tuple's items; a float64 tensor stands for a float32 one where its name is in ``widen`` (the contract
    lets it be computed in float64 and returned so)."""
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            return Verdict(False, [f"{where}: expected a tuple of {len(expected)} items, got {_describe(got)}"])
        lines, ok = [], True
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            verdict = compare(g, e, rtol, atol, names[i] if i < len(names) else f"{where}[{i}]", widen=widen)
            ok &= verdict.ok
            lines += verdict.lines
        return Verdict(ok, lines)
    if not isinstance(expected, torch.Tensor):
        return _compare_scalar(got, expected, where)
    if not isinstance(got, torch.Tensor):
        return Verdict(False, [f"{where}: expected a {_describe(expected)}, got {_describe(got)}"])
    if got.shape != expected.shape:
        return Verdict(False, [f"{where}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"])
    if got.dtype == torch.float64 and expected.dtype == torch.float32 and where in widen:
        expected = expected.double()
    if got.dtype != expected.dtype:
        return Verdict(False, [f"{CHECKS['dtype']}: {where} is {str(got.dtype).removeprefix('torch.')}, "
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
        lines += _float_differences(got.double(), expected.double(), where, rtol, atol)
    return Verdict(False, lines)


def _float_differences(g: torch.Tensor, e: torch.Tensor, where: str, rtol: float, atol: float) -> list[str]:
    """What a student can act on: NaNs, infinities where finite values belong (and the reverse), and the
    largest errors among the finite values."""
    lines = []
    nan = int(g.isnan().sum())
    if nan:
        lines.append(f"{where}: {nan} NaN value(s) in your output")
    for sign, word in ((-1, "-inf"), (1, "inf")):
        infinite = g.isinf() & (g.sign() == sign)
        wrong = int((infinite & ~(e.isinf() & (e.sign() == sign))).sum())
        missing = int((e.isinf() & (e.sign() == sign) & ~infinite).sum())
        if wrong:
            lines.append(f"{where}: {wrong} value(s) are {word} where the expected value is not")
        if missing:
            lines.append(f"{where}: {missing} value(s) should be {word} and are not")
    finite = g.isfinite() & e.isfinite()
    if bool(finite.any()):
        diff = (g - e).abs()[finite]
        rel = diff / e.abs()[finite].clamp_min(1e-12)
        lines.append(f"{where}: max absolute error {diff.max().item():.3g}, max relative error "
                     f"{rel.max().item():.3g} among the finite values (tolerance rtol={rtol:g}, atol={atol:g})")
    return lines


def _compare_scalar(got, expected, where: str) -> Verdict:
    """A number, string, dtype or ``None``: its type first, then its value; a float within ``SCALAR_RTOL``.
    The feedback says how far off a number is (relative error, or the ratio of two integers), never the
    expected value."""
    if type(got) is not type(expected):
        return Verdict(False, [f"{where}: expected {_describe(expected)}, got {_describe(got)}"])
    if type(expected) is float:
        if math.isclose(got, expected, rel_tol=SCALAR_RTOL, abs_tol=0.0):
            return Verdict(True, [])
        if not (math.isfinite(got) and math.isfinite(expected)):
            return Verdict(False, [f"{where}: your float is {got!r}, where a finite value is expected"
                                   if math.isfinite(expected) else f"{where}: the float differs"])
        error = abs(got - expected) / max(abs(expected), 1e-300)
        side = "larger" if got > expected else "smaller"
        return Verdict(False, [f"{where}: your float is {side} than the expected value by a relative error of "
                               f"{error:.3g} (tolerance {SCALAR_RTOL:g}, for float64 arithmetic)"])
    if got == expected:
        return Verdict(True, [])
    if type(expected) is int and expected and got:
        return Verdict(False, [f"{where}: your int is {got / expected:.4g} times the expected value"])
    return Verdict(False, [f"{where}: the {type(expected).__name__} differs from the expected one"])


def parse_structures(tree) -> list[dict]:
    """The worker's ``{"builds": [...]}``: one structure description per build (``sandboxed.procedure.describe_structure``).

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


def xavier_counts(matrices) -> tuple[int, int, int, int] | None:
    """``(beyond the bound, spread not Xavier's, equal to another, not finite)``: how many of the matrices
    fail each property of Xavier-uniform initialization; ``None`` unless given a tuple of tensors.

    A matrix of fan-in ``n_in`` and fan-out ``n_out`` drawn from U(-a, a), ``a = sqrt(6 / (n_in +
    n_out))``, lies within ``a`` and has standard deviation ``a / sqrt(3)``. The sample's standard
    deviation over ``n`` entries varies by about ``0.45 / sqrt(n)`` relatively, so a deviation beyond
    ``2.7 / sqrt(n)`` (six of those) is a different initialization, not bad luck. Two equal matrices
    were initialized once and then copied. A NaN or an infinity fails every property (comparisons
    with NaN are false, so it is counted first and on its own).
    """
    if not isinstance(matrices, tuple) or not all(isinstance(m, torch.Tensor) and m.is_floating_point()
                                                  and m.dim() > 1 and m.numel() for m in matrices):
        return None
    beyond = spread = equal = broken = 0
    for i, m in enumerate(matrices):
        fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(m)
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        w = m.double()
        if not bool(w.isfinite().all()):
            broken += 1
            continue
        beyond += bool(w.abs().max() > bound * (1 + 1e-5))
        spread += bool(abs(w.std() * math.sqrt(3) / bound - 1) > max(0.05, 2.7 / math.sqrt(w.numel())))
        equal += any(o.shape == m.shape and torch.equal(o, m) for o in matrices[:i] + matrices[i + 1:])
    return beyond, spread, equal, broken


_XAVIER_LINES = (
    "{} of {} matrices have entries beyond the Xavier-uniform bound sqrt(6 / (fan_in + fan_out)) "
    "(is nn.init.xavier_uniform_ applied to every parameter with more than one dimension?)",
    "{} of {} matrices do not have the spread of Xavier-uniform values, std = bound / sqrt(3) "
    "(another initialization, or none: PyTorch's defaults differ)",
    "{} of {} matrices are equal to another one: initialized once, then copied (initialize after "
    "building the whole model)",
    "{} of {} matrices hold NaN or infinite values",
)


def compare_xavier(got, expected) -> Verdict:
    """The initialization of the matrices a model was built with (``sandboxed.procedure.xavier_draws``: the matrices,
    and whether a build from another seed gave the same ones), judged by ``xavier_counts`` (``expected``,
    the reference's, fixes what the counts must be: none fails) and by where the draws came from."""
    if not (isinstance(expected, tuple) and len(expected) == 2):
        raise ValueError("the reference's measure is malformed")
    wanted = xavier_counts(expected[0])
    if wanted is None:
        raise ValueError("the reference's matrices are malformed")
    if not (isinstance(got, tuple) and len(got) == 2 and type(got[1]) is bool):
        return Verdict(False, [f"expected the model's matrices, got {_describe(got)}"])
    matrices, same = got
    found = xavier_counts(matrices)
    if found is None:
        return Verdict(False, [f"expected the model's matrices (a tuple of tensors), got {_describe(matrices)}"])
    lines = [line.format(f, len(matrices)) for line, f, w in zip(_XAVIER_LINES, found, wanted, strict=True)
             if f != w]
    if same and not expected[1]:
        lines.append(f"{CHECKS['random']}: two models built after seeding the caller's generator differently have "
                     "the same weights: the function reseeds torch's generator itself (torch.manual_seed inside?); "
                     "draw the initial weights from the generator as the caller left it")
    return Verdict(not lines, lines)


def compare_initial(got, expected, names: list[list[str]]) -> Verdict:
    """The tensors the text fixes, as built (``sandboxed.procedure.initial_values``: per build, chunks of tensors in the
    order of ``names``), against the reference's; each name reported once."""
    def flat(per_build) -> list[list]:
        if not isinstance(per_build, tuple) or len(per_build) != len(names):
            raise ValueError("malformed initial values")
        return [[t for chunk in build for t in chunk] if isinstance(build, tuple)
                and all(isinstance(c, tuple) for c in build) else None for build in per_build]

    mine, theirs = flat(got), flat(expected)
    lines: list[str] = []
    seen: set[str] = set()
    for build, (g, e, wanted) in enumerate(zip(mine, theirs, names, strict=True)):
        if e is None or len(e) != len(wanted):
            raise ValueError("the reference's initial values are malformed")
        if g is None or len(g) != len(wanted):
            return Verdict(False, [f"{CHECKS['init']}: the initial values could not be read"])
        for name, mine_t, theirs_t in zip(wanted, g, e, strict=True):
            if name in seen or mine_t is None:  # a missing tensor is the structure's to report
                continue
            if not isinstance(mine_t, torch.Tensor) or mine_t.shape != theirs_t.shape:
                continue  # so is a wrong shape
            close = torch.isclose(mine_t.double(), theirs_t.double(), rtol=INIT_RTOL, atol=INIT_ATOL)
            if not bool(close.all()):
                seen.add(name)
                lines.append(f"{CHECKS['init']}: `{name[:MAX_NAME_CHARS]}` as built (before any weight is loaded) "
                             f"is not what the text says it starts as: {int((~close).sum())} of {close.numel()} "
                             "values differ" + (" (built with another case's arguments)" if build else ""))
    return Verdict(not lines, lines)


INIT_RTOL, INIT_ATOL = 1e-4, 1e-3
"""Initial values the text fixes are computed, not drawn; a float32 recipe of a sinusoid table is within these."""


def split_record(value, keep: int) -> tuple:
    """A watched case's value, ``(answer, (arguments after the call, generator states, attributes))``
    (``sandboxed.procedure.answer``), checked for its shape: ``ValueError`` unless well formed (it is untrusted data)."""
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple) and len(value[1]) == 3):
        raise ValueError("malformed call record")
    after, states, kept = value[1]
    if after is not None and not (isinstance(after, tuple) and len(after) == 2
                                  and all(isinstance(part, tuple) for part in after)):
        raise ValueError("malformed arguments after the call")
    if not (isinstance(states, tuple) and len(states) == 3 and all(isinstance(t, torch.Tensor) for t in states)):
        raise ValueError("malformed generator states")
    if not (isinstance(kept, tuple) and len(kept) == keep):
        raise ValueError("malformed attributes")
    return value[0], after, states, kept


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


def changed_inputs(sent: tuple, after: tuple, names: list[str]) -> list[str]:
    """The arguments a call changed in place: ``sent`` and ``after`` are ``(positional, keyword values by
    sorted name)``, ``names`` label them in that order. Compared bit by bit."""
    lines = []
    flat_sent = [*sent[0], *sent[1]]
    flat_after = [*after[0], *after[1]]
    if len(flat_sent) != len(flat_after):
        return [f"{CHECKS['inputs']}: the arguments after the call could not be read"]
    for name, before, now in zip(names, flat_sent, flat_after, strict=True):
        if not isinstance(before, torch.Tensor):
            continue
        if not isinstance(now, torch.Tensor):
            how = "it is no longer a tensor"
        elif now.shape != before.shape:
            how = f"its shape went from {tuple(before.shape)} to {tuple(now.shape)}"
        elif now.dtype != before.dtype:
            how = f"its dtype went from {str(before.dtype).removeprefix('torch.')} to " \
                  f"{str(now.dtype).removeprefix('torch.')}"
        elif torch.equal(_bits(now), _bits(before)):
            continue
        else:
            how = f"{int((now.reshape(-1) != before.reshape(-1)).sum())} of {before.numel()} values changed"
        lines.append(f"{CHECKS['inputs']}: your code changed its argument `{name}` in place ({how}). The caller "
                     "still needs it: work on a new tensor (`x = x - mean`, not `x -= mean`; "
                     "`mask = mask.unsqueeze(1)`, not `mask.unsqueeze_(1)`; `masked_fill`, not `masked_fill_`)")
    return lines


@functools.lru_cache(maxsize=64)
def seeded_states(seed: int) -> tuple:
    """The states of torch's, Python's and NumPy's generators seeded with ``seed`` (``sandboxed.procedure.Generators``)."""
    import random

    import numpy

    return generator_states(torch.Generator().manual_seed(seed).get_state(), random.Random(seed).getstate(),
                            numpy.random.RandomState(seed % 2**32).get_state())


def moved_generators(states: tuple, seed: int) -> list[str]:
    """The global generators a call left in another state than the case's seed gives them."""
    expected = seeded_states(seed)
    moved = [label for label, got, want in zip(("torch's", "Python's (`random`)", "NumPy's"), states, expected,
                                                strict=True)
             if not (got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want))]
    if not moved:
        return []
    return [f"{CHECKS['random']}: the call changed {' and '.join(moved)} global random generator (it drew random "
            "numbers, or reseeded it): a call must leave the caller's generators as they were (the grader "
            "replaces dropout, the only randomness the text asks for)"]


def compare_attributes(keep: tuple[str, ...], got: tuple, expected: tuple, rtol: float, atol: float) -> Verdict:
    """The module's attributes after the call, against the reference's."""
    lines: list[str] = []
    for name, g, e in zip(keep, got, expected, strict=True):
        found = compare(g, e, rtol, atol, where=f"`{name}`")
        lines += [f"{CHECKS['attributes']}: {line}" for line in found.lines]
    return Verdict(not lines, lines)


def compare_nucleus(got, expected, logits: torch.Tensor) -> Verdict:
    """Top-k/top-p filtering where tokens of equal probability may be kept in any order: each row keeps as
    many tokens as the reference's, the kept logits unchanged and the others ``-inf``, and no dropped token
    is more probable than a kept one."""
    found = compare(got, expected, 0.0, 0.0)
    if found.ok or not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
        return found
    kept = got.isfinite()
    lines = []
    if not bool(torch.where(kept, got == logits, got == -math.inf).all()):
        lines.append("result: a kept logit was changed, or a removed one is not -inf")
    count = kept.sum(-1) != expected.isfinite().sum(-1)
    if bool(count.any()):
        lines.append(f"result: {int(count.sum())} of {count.numel()} rows keep another number of tokens than the "
                     "rule gives")
    weakest = logits.masked_fill(~kept, math.inf).amin(-1)
    strongest = logits.masked_fill(kept, -math.inf).amax(-1)
    if bool((strongest > weakest).any()):
        lines.append("result: a token was removed while a less probable one was kept")
    return Verdict(not lines, lines)
