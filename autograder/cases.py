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
  ``F.dropout``, is ``worker.FixedDropout`` on both sides, so the reference and a right answer
  drop the same entries, while a missing, doubled or misplaced dropout, or one that ignores its
  ``p``, changes the output. A chapter that writes its own ``Case(..., train=True)`` cases gets
  none added (their ``gradients`` are filled in here);
* a structure case: the module as built with each case's arguments, its parameters and
  buffers (names, shapes, ``requires_grad``) and its ``state_dict`` keys against the reference's.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable

import torch

from autograder.exercises.shared import Case, resolve
from autograder.registry import REGISTRY, Exercise
from autograder.worker import MAX_BUILDS, build_module_arg

TRAIN_DROPOUT = 0.3
"""Dropout of the training-mode cases: neither PyTorch's default 0.5 nor the notes' usual 0.1."""


def graded_cases(exercise: Exercise, seed: int) -> list[Case]:
    """Every case the grader runs for ``exercise`` on ``seed``, in order."""
    cases = exercise.cases(seed)
    if exercise.kind not in ("module", "factory"):
        return cases
    if not any(c.train for c in cases):
        cases += train_mode_cases(exercise, cases)
    cases = [dataclasses.replace(c, gradients=parameter_names(exercise, c.construct)) if c.train else c
             for c in cases]
    return [*cases, structure_case(cases)]


def reference_classes() -> dict:
    """What a module description may name, on the harness's side: the reference package's public objects
    (the worker builds the same names from the exercise's prerequisites)."""
    import tfm_solution

    return {name: getattr(tfm_solution, name) for name in tfm_solution.__all__}


def built(value):
    """``value`` with every module description in it built from the reference (``worker.build_module_arg``)."""
    return build_module_arg(value, reference_classes())


def parameter_names(exercise: Exercise, construct: tuple) -> tuple[str, ...]:
    """The reference module's parameters, built with ``construct``: the gradients a training-mode case compares."""
    return tuple(name for name, _ in resolve(exercise.reference)(*built(construct)).named_parameters())


def _built(cases: list[Case]) -> list[Case]:
    return [c for c in cases if c.construct is not None and not c.structure and c.measure is None]


def _full_precision(case: Case) -> bool:
    tensors = [a for a in (*case.args, *case.kwargs.values()) if isinstance(a, torch.Tensor)]
    return all(t.dtype in (torch.float32, torch.float64) or not t.is_floating_point() for t in tensors)


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
                "requires_grad) and its state_dict keys are the reference's, built with each case's arguments",
                public, tuple(builds), structure=True)


CASES: dict[str, Callable[[int], list[Case]]] = {e.id: functools.partial(graded_cases, e) for e in REGISTRY}
