"""The graded cases of every exercise: inputs drawn fresh from a seed, checked live.

Each chapter module gives its exercises a builder ``(seed) -> list[Case]`` (see
``autograder/exercises``). Public cases use a fixed seed (their inputs may be shown);
hidden cases use the submission's seed, change shapes from one submission to the next,
and are compared with the reference computed in the harness.

What every module exercise gets on top, from here rather than from each chapter:

* training-mode copies of its first public and its first full-precision hidden case. The
  module runs in ``train()`` mode with autograd on, and the answer holds, besides the output,
  the gradients that a fixed random probe of the output sends to the floating-point inputs
  and to each of the reference's parameters: a forward that detaches something, runs under
  ``no_grad`` or freezes a weight fails here. With ``Exercise.has_dropout`` the constructor's
  ``dropout`` is ``TRAIN_DROPOUT``, and every dropout call, be it ``nn.Dropout`` or
  ``F.dropout``, is ``sandboxed.procedure.FixedDropout`` on both sides, so the reference and a right answer
  drop the same entries, while a missing, doubled or misplaced dropout, or one that ignores its
  ``p``, changes the output. A chapter that writes its own ``Case(..., train=True)`` cases gets
  none added (their ``gradients`` are filled in here);
* a structure case: the module as built with each case's arguments, its parameters and
  buffers (names, shapes, ``requires_grad``) and its ``state_dict`` keys against the reference's,
  and the initial values the text fixes (those the reference builds alike from any seed: LayerNorm's
  ones and zeros, a positional-encoding table). It weighs ``STRUCTURE_WEIGHT`` ordinary cases.

And every exercise, from its ``Contract`` (``autograder.exercises.shared``):

* on every case that calls the answer, the arguments after the call must be bitwise what was sent,
  and torch's, Python's and NumPy's generators must be in the state the case's seed gives them,
  unless the contract lets the call draw (``watched``, ``sandboxed.procedure.answer``);
* float64 copies of the first public and the first full-precision hidden case, where the dtype is
  kept and no case is float64 yet (a module is converted with ``.double()``);
* for a function whose results carry gradients, copies of its first public and first
  full-precision hidden case run with autograd: the gradients reaching the named arguments
  through each floating-point result are compared;
* where the contract names attributes (``size``, ``true_dist``), copies of the first public and
  first hidden case that read them after the call.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable

import torch

from autograder.exercises.shared import Case, resolve
from autograder.registry import REGISTRY, Exercise
from autograder.sandboxed.procedure import MAX_BUILDS, build_module_arg, walk_module

TRAIN_DROPOUT = 0.3
"""Dropout of the training-mode cases: neither PyTorch's default 0.5 nor the notes' usual 0.1."""

STRUCTURE_WEIGHT = 2
"""The structure line (names, shapes, state_dict keys and initial values) counts as two cases."""


def graded_cases(exercise: Exercise, seed: int) -> list[Case]:
    """Every case the grader runs for ``exercise`` on ``seed``, in order."""
    cases = exercise.cases(seed)
    derived: list[Case] = []
    if exercise.kind in ("module", "factory") and not any(c.train for c in cases):
        derived += train_mode_cases(exercise, cases)
    if exercise.contract is not None:
        derived += float64_cases(exercise, cases) + gradient_cases(exercise, cases) + attribute_cases(exercise, cases)
    cases = [*cases, *derived]
    if exercise.kind not in ("module", "factory"):
        return cases
    cases = [dataclasses.replace(c, gradients=parameter_names(exercise, c.construct)) if c.train else c
             for c in cases]
    return [*cases, structure_case(cases)]


def case_points(points: float, cases: list[Case]) -> list[float]:
    """``points`` shared among ``cases`` by their ``weight``: whole cents that add up to ``points`` exactly
    (largest remainder; equal weights get equal shares, the first ones the cents left over)."""
    cents, total = round(points * 100), sum(c.weight for c in cases)
    quotas = [cents * c.weight / total for c in cases]
    shares = [int(q) for q in quotas]
    order = sorted(range(len(cases)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for i in order[: cents - sum(shares)]:
        shares[i] += 1
    return [s / 100 for s in shares]


def watched(case: Case) -> bool:
    """Whether the case calls the answer (its arguments and the generators are then checked after the call)."""
    return not case.structure and case.measure is None


def case_request(exercise: Exercise | None, case: Case, seed: int) -> dict:
    """What a request for ``case`` carries besides its arguments and weights, the same for the worker and for
    the harness's own run of the reference (``sandboxed.procedure.answer``). ``exercise`` (``None``: none of the contract's
    checks) gives the initial values a structure case reads (``initial_names``)."""
    request = {"seed": seed, "attributes": list(case.attributes), "train": case.train, "structure": case.structure,
               "gradients": list(case.gradients) if case.train else None, "method": case.method,
               "measure": case.measure, "driver": case.driver, "watch": watched(case) and exercise is not None,
               "double": case.double, "inputs": None if case.inputs is None else list(case.inputs),
               "keep": list(case.keep), "marked": list(case.marked)}
    if case.structure:
        request["init"] = [list(initial_names(exercise.reference, repr(b), b)) if exercise is not None else []
                           for b in case.args]
    return request


_INITIAL: dict[tuple[str, str], tuple[str, ...]] = {}


def initial_names(reference: str, key: str, arguments: tuple) -> tuple[str, ...]:
    """The parameters and buffers of the reference built with ``arguments`` that come out the same from two
    seeds: the initial values the text fixes (LayerNorm's ones and zeros, a sinusoid table), which an
    answer must build too. (``key`` is the arguments' ``repr``, what the answers are kept under.)"""
    if (reference, key) not in _INITIAL:
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(1)
            first = walk_module(resolve(reference)(*built(arguments)))["all"]
            torch.default_generator.manual_seed(2)
            second = walk_module(resolve(reference)(*built(arguments)))["all"]
        _INITIAL[(reference, key)] = tuple(n for n, t in first.items() if n in second
                                           and t.shape == second[n].shape and torch.equal(t, second[n]))
    return _INITIAL[(reference, key)]


def reference_classes() -> dict:
    """What a module description may name, on the harness's side: the reference package's public objects
    (the worker builds the same names from the exercise's prerequisites)."""
    import tfm_solution

    return {name: getattr(tfm_solution, name) for name in tfm_solution.__all__}


def built(value):
    """``value`` with every module description in it built from the reference (``sandboxed.procedure.build_module_arg``)."""
    return build_module_arg(value, reference_classes())


def parameter_names(exercise: Exercise, construct: tuple) -> tuple[str, ...]:
    """The reference module's parameters, built with ``construct``: the gradients a training-mode case compares."""
    return tuple(name for name, _ in resolve(exercise.reference)(*built(construct)).named_parameters())


def _built(cases: list[Case]) -> list[Case]:
    return [c for c in cases if c.construct is not None and not c.structure and c.measure is None
            and not c.keep and not c.double]


def _full_precision(case: Case) -> bool:
    tensors = [a for a in (*case.args, *case.kwargs.values()) if isinstance(a, torch.Tensor)]
    return all(t.dtype in (torch.float32, torch.float64) or not t.is_floating_point() for t in tensors)


def _floating(case: Case) -> list[torch.Tensor]:
    return [a for a in (*case.args, *case.kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]


def _calls(exercise: Exercise, cases: list[Case]) -> list[Case]:
    """The chapter's cases that call the answer on arguments (not the structure, a measure or a driver)."""
    return [c for c in cases if watched(c) and c.driver is None and not c.train and not c.marked
            and (c.construct is not None or exercise.kind not in ("module", "factory"))]


def float64_cases(exercise: Exercise, cases: list[Case]) -> list[Case]:
    """Where the contract keeps the dtype and no case is float64 yet: the first public and the first hidden
    full-precision case again, in float64 (a module converted with ``.double()``)."""
    module = exercise.kind in ("module", "factory")
    if not exercise.contract.keeps_dtype or any(t.dtype == torch.float64 for c in cases for t in _floating(c)):
        return []
    calls = [c for c in _calls(exercise, cases) if _full_precision(c) and (module or _floating(c))]
    chosen = [c for c in calls if c.public][:1] + [c for c in calls if not c.public][:1]

    def wide(value):
        return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    return [dataclasses.replace(
        c, title=f"{c.title}, float64", checks=_also(c, "the same in float64: the result keeps the dtype"),
        args=tuple(wide(a) for a in c.args), kwargs={k: wide(v) for k, v in c.kwargs.items()},
        double=module) for c in chosen]


def gradient_cases(exercise: Exercise, cases: list[Case]) -> list[Case]:
    """For a function whose contract names arguments that gradients must reach: copies of the first public
    and the first full-precision hidden case, run with autograd (``sandboxed.procedure.run_graded``)."""
    wanted = exercise.contract.gradients
    if not wanted or exercise.kind != "function":
        return []
    names = list(inspect.signature(resolve(exercise.reference)).parameters)
    unknown = set(wanted) - set(names)
    if unknown:
        raise ValueError(f"{exercise.id}: the contract's gradients name no argument {sorted(unknown)}")
    calls = [c for c in _calls(exercise, cases) if _full_precision(c)]
    chosen = [c for c in calls if c.public][:1] + [c for c in calls if not c.public][:1]
    said = ", ".join(f"`{n}`" for n in wanted)
    return [dataclasses.replace(
        c, title=f"{c.title}, with gradients", train=True, inputs=tuple(names.index(n) for n in wanted),
        checks=_also(c, f"with autograd: the gradients reaching {said} through every result are the reference's "
                        "(nothing detached)")) for c in chosen]


def attribute_cases(exercise: Exercise, cases: list[Case]) -> list[Case]:
    """Where the contract names attributes: copies of the first public and the first hidden case that also
    read them after the call."""
    keep = exercise.contract.attributes
    if not keep:
        return []
    calls = _calls(exercise, cases)
    chosen = [c for c in calls if c.public][:1] + [c for c in calls if not c.public][:1]
    said = ", ".join(f"`{a}`" for a in keep)
    return [dataclasses.replace(c, title=f"{c.title}, its attributes", keep=keep,
                                checks=_also(c, f"after the call the module's {said} are the reference's"))
            for c in chosen]


def _also(case: Case, more: str) -> str:
    """A derived case's ``checks``: the original's, then what the copy checks besides."""
    base = case.checks.removesuffix(" (public)")
    return f"{base}; {more}" + (" (public)" if case.public else "")


def with_dropout(exercise: Exercise, construct: tuple, p: float) -> tuple:
    """``construct`` with the constructor's ``dropout`` argument set to ``p`` (defaults filled in before it)."""
    parameters = list(inspect.signature(resolve(exercise.reference)).parameters.values())
    names = [q.name for q in parameters]
    if "dropout" not in names:
        raise ValueError(f"{exercise.id}: has_dropout is set, but the constructor takes no `dropout` argument")
    at = names.index("dropout")
    filled = list(construct[: at + 1])
    for q in parameters[len(filled): at + 1]:
        if q.default is inspect.Parameter.empty:
            raise ValueError(f"{exercise.id}: no value for `{q.name}` before `dropout`")
        filled.append(q.default)
    filled[at] = p
    return (*filled, *construct[at + 1:])


def train_mode_cases(exercise: Exercise, cases: list[Case]) -> list[Case]:
    """Training-mode copies of the first public and the first full-precision hidden module case."""
    chosen = [c for c in _built(cases) if c.public][:1]
    chosen += [c for c in _built(cases) if not c.public and _full_precision(c)][:1]
    if not chosen:
        raise ValueError(f"{exercise.id}: no case builds the module")
    dropout = (f", with dropout {TRAIN_DROPOUT} (the same fixed mask stands in for the random one in your module "
               "and in the reference): dropout is applied exactly where the notes apply it, once, at the rate "
               "given to the constructor" if exercise.has_dropout else "")
    return [dataclasses.replace(
        case, title=f"{case.title}, in training mode",
        checks=f"in training mode{dropout}; the gradients reaching the input and every parameter are the "
               "reference's (nothing detached)" + (" (public)" if case.public else ""),
        construct=with_dropout(exercise, case.construct, TRAIN_DROPOUT) if exercise.has_dropout else case.construct,
        train=True) for case in chosen]


def structure_case(cases: list[Case]) -> Case:
    """The structure check: the module built with each distinct argument tuple of the cases (at most
    ``worker.MAX_BUILDS``), so that a wrong default argument or a size-dependent slip shows too."""
    builds: list[tuple] = []
    for case in _built(cases):
        if case.construct not in builds and len(builds) < MAX_BUILDS:
            builds.append(case.construct)
    public = all(c.public for c in _built(cases) if c.construct in builds)
    return Case("parameters, buffers and state_dict", "the module's parameters and buffers (names, shapes, "
                "requires_grad) and its state_dict keys are the reference's, built with each case's arguments, "
                "and so are the initial values the text fixes", public, tuple(builds), structure=True,
                weight=STRUCTURE_WEIGHT)


CASES: dict[str, Callable[[int], list[Case]]] = {e.id: functools.partial(graded_cases, e) for e in REGISTRY}
