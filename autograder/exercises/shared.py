"""What every chapter's grading module builds on: the ``Exercise``, ``Contract``, ``Case``,
``Mistake`` and ``Mutant`` types, random shapes drawn from a seed, and source templates for
declared mistakes and alternatives.

A chapter module imports from here only; the registry and the harness import the chapter
modules. Nothing here imports the rest of the grader, so there is no import circle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

PUBLIC_SEED = 0
"""Seed of the public cases: their inputs are the same for everyone and may be shown."""


@dataclass
class Case:
    """One graded call: ``fn(*args, **kwargs)`` in the worker vs the reference in the harness.

    ``args``/``kwargs`` hold tensors, numbers, ``None`` and module stand-ins
    (``{"module": "scale", "factor": f}``, a dropout that multiplies by ``f``). For an
    ``nn.Module`` exercise, ``construct`` holds the constructor's arguments: the student's
    module is built with them, gets the reference's weights, and is called in eval mode, or
    in training mode when ``train`` is set: every dropout is then the same fixed stand-in on
    both sides (``sandboxed.procedure.FixedDropout``), and the gradients reaching the floating-point inputs
    and the parameters named in ``gradients`` are compared too (``sandboxed.procedure.run_graded``). A
    ``structure`` case calls nothing: its ``args`` are constructor argument tuples, and the
    module's parameters, buffers and ``state_dict`` as built with each are compared. For a
    plain class exercise, ``attributes`` names the instance attributes that are compared: the
    instance never crosses, the tuple of those attributes does.

    A constructor argument may be a module description, ``{"module": "MultiHeadedAttention", "h": 2,
    "d_model": 8, "dropout": 0.0}``: the reference's class of that name (a prerequisite of the
    exercise) built with these keyword arguments, on both sides; descriptions may nest. With
    ``distinct``, the reference's weights get seeded noise before they are loaded, so that copies
    that start equal (clones of one prototype, LayerNorm's ones and zeros) differ and a module
    shared where copies belong computes something else.

    For a ``"factory"`` exercise (a function that builds an ``nn.Module``), ``construct`` holds the
    function's arguments; the module it returns is treated as a module exercise's, and ``method``
    names what is called on it (``"decode"``, ``"generator"``; ``None``: the module itself). A
    ``measure`` case loads no weights and calls nothing: the object as built is turned into data
    in the worker (``sandboxed.procedure.MEASURES``) and judged in the harness (``"xavier"``: the matrices'
    initialization, ``compare.compare_xavier``).

    A ``driver`` case does not call the answer on ``args``: a fixed procedure of the worker
    (``sandboxed.drivers.DRIVERS``) builds what ``args`` describe and calls the answer inside it, the same
    procedure running the reference in the harness (``"accumulation"``: a training run of chapter 9's
    ``train_with_accumulation`` on a tiny model, ``sandboxed.drivers.train_accumulated``).

    A case with a ``rule`` is judged by that rule instead of against the reference (which is then
    never computed): ``rule(returned value) -> (passed, lines for the student)``. Chapter 12 judges its
    training and translation runs in bands this way.

    ``marked`` names torch functions the text says the answer computes with (``"conv1d"``): on this case
    each call of one adds a fixed mark to its result, in the worker and in the harness alike
    (``sandboxed.procedure.marks``), so only an answer whose result goes through that function matches the reference.
    """

    title: str
    checks: str
    public: bool
    args: tuple
    kwargs: dict = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-5
    construct: tuple | None = None
    attributes: tuple[str, ...] = ()
    train: bool = False
    structure: bool = False
    gradients: tuple[str, ...] = ()
    distinct: bool = False
    method: str | None = None
    measure: Literal["xavier"] | None = None
    driver: Literal["accumulation", "reversal", "translation"] | None = None
    double: bool = False
    inputs: tuple[int, ...] | None = None
    keep: tuple[str, ...] = ()
    judge: Literal["nucleus"] | None = None
    rule: Callable[[object], tuple[bool, list[str]]] | None = None
    weight: int = 1
    marked: tuple[str, ...] = ()


@dataclass(frozen=True)
class Contract:
    """What an exercise promises besides its values: every clause is stated in the exercise's text
    (``make chapters`` writes ``contract_markdown`` into the statement), exercised by a visible test
    (a ``# contract: <key>`` comment marks it) and checked by the harness on every submission.

    Attributes:
        dtype: the result's dtype, in words (the ``dtype`` clause).
        keeps_dtype: floating-point results take the dtype of the floating-point inputs (for a module:
            of the module converted with ``.double()``); the harness adds a float64 case where the
            exercise has none.
        may_widen: results that may come back in float64 where the reference's are float32 (computed
            in float64 and not cast back), by their names in ``Exercise.return_names``.
        gradients: a function's arguments, by name, that gradients must reach through every
            floating-point result; the harness adds training copies of two cases that compare them
            with the reference's. (Module exercises always get such copies, see ``modes``.)
        pure: every tensor passed in is left unchanged; checked bitwise on every case. ``False`` only
            for an exercise whose job is to change what it is given (``pure_text`` says what).
        pure_text: the ``inputs`` clause, when ``pure`` is ``False``.
        draws: the call may draw from torch's global generator (``make_model``'s initial weights); it must
            then draw from the generator as the caller left it, never reseed it. Otherwise torch's,
            Python's and NumPy's generators must be left exactly as they were, on every case.
        draws_text: the ``random`` clause, when ``draws`` is set.
        modes: ``("eval", "train")`` for module exercises (both are graded), ``()`` for the others.
        attributes: attributes of the module (or what ``make_model`` returns) that later code reads, by
            name, compared with the reference's after a call on the attribute copies of two cases.
        attributes_text: the ``attributes`` clause.
        init: the ``init`` clause: initial values of parameters and buffers the text fixes. Those the
            reference builds the same way from any seed are compared on the structure line (weighted
            ``STRUCTURE_WEIGHT``), as built, before any weight is loaded.
        rules: tie and boundary rules, ``(key, sentence)``: each has hidden cases that exercise it.
    """

    dtype: str
    keeps_dtype: bool = False
    may_widen: tuple[str, ...] = ()
    gradients: tuple[str, ...] = ()
    pure: bool = True
    pure_text: str = ""
    draws: bool = False
    draws_text: str = ""
    modes: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    attributes_text: str = ""
    init: str = ""
    rules: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Mistake:
    """A named wrong answer: what to tell the student, and code that makes the mistake.

    ``source`` is a complete answer cell as a student would write it (``math`` and
    ``torch`` are imported for it); it defines the exercise's name.
    """

    message: str
    source: str


@dataclass(frozen=True)
class Mutant:
    """A wrong answer that no declared mistake describes (often a breach of the contract), named by what
    catches it: ``caught_by`` is a key of ``CHECKS`` (a universal check), a declared mistake's name, or
    words of the title or feedback of the case that catches it. The self-tests grade it and expect it
    to score below ``MUTANT_CEILING`` of the exercise's points with ``caught_by`` named on a failed line
    (``"policy"``: a library shortcut, named on the policy line and worth no points by design).
    ``source`` is a whole answer cell, as for a ``Mistake``."""

    caught_by: str
    source: str


MUTANT_CEILING = 0.9
"""A wrong answer (declared mistake or mutant) must score below this share of its exercise's points."""

CHECKS = {
    "inputs": "**Contract: inputs unchanged**",
    "random": "**Contract: random numbers**",
    "gradients": "**Contract: gradients**",
    "dtype": "**Contract: dtype**",
    "attributes": "**Contract: attributes**",
    "init": "**Contract: initial values**",
    "structure": "parameters, buffers and state_dict",
    "modes": "in training mode",
    "xavier": "Xavier",
    "policy": "policy",
}
"""How each universal check announces itself in the feedback (what a ``Mutant.caught_by`` names)."""


@dataclass(frozen=True, kw_only=True)
class Exercise:
    """One graded exercise.

    Attributes:
        id: stable identifier, ``"chNN.name"``.
        chapter: the chapter folder under ``solutions/`` and ``chapters/`` (= nbgrader assignment).
        notebook: the notebook file inside that folder.
        name: the top-level name the student defines (function or class).
        kind: ``"function"``, ``"module"`` (an ``nn.Module`` subclass), ``"factory"`` (a function
            returning an ``nn.Module``, graded like a module exercise, see ``Case.method``) or
            ``"class"`` (a plain class whose instance attributes are graded, see ``Case.attributes``).
        signature: as shown to the student.
        points: the exercise's weight.
        solution_grade_id: nbgrader ``grade_id`` of the cell holding the answer.
        test_grade_id: nbgrader ``grade_id`` of the graded (hidden) test cell.
        reference: ``"module:attr"`` of the reference implementation in ``tfm_solution``.
        cases: ``(seed) -> list[Case]``, the exercise's graded cases (public ones on ``PUBLIC_SEED``).
        prerequisites: names the exercise may use, injected from ``tfm_solution`` when grading.
        time_budget_s: seconds of the worker's own time (CPU and waiting, not the machine's load:
            ``sandbox.OwnTime``) one graded call may take before it is reported as too slow
            (reported apart, never counted as wrong; a call is killed only at the worker's timeout).
        memory_budget_mb: address space the submission may allocate beyond what the grading
            worker holds after importing torch (``sandbox.Limits.memory_mb``).
        mistakes: the declared mistakes, by name, that the grader names when an output matches one.
        banned: library shortcuts reported by the policy check for this exercise.
        return_names: what the items of a returned tuple are called in the feedback.
        has_dropout: a module exercise whose specification applies dropout (its constructor
            takes ``dropout``): its training-mode cases set that rate (see ``autograder.cases``).
        contract: what the exercise promises besides its values (``Contract``).
        alternatives: correct answers the text allows, by name -> source (a whole answer cell, as a
            ``Mistake``'s): each must get full marks, on several seeds.
        mutants: wrong answers no declared mistake describes, caught by a universal check (``Mutant``).
        runner: ``"module:Class"`` of an ``autograder.grade.ExerciseRun`` subclass that grades this
            exercise (chapter 12's, which gathers the student's code from every chapter); None: the
            standard one.
    """

    id: str
    chapter: str
    notebook: str
    name: str
    kind: Literal["function", "module", "factory", "class"]
    signature: str
    points: int
    solution_grade_id: str
    test_grade_id: str
    reference: str
    cases: Callable[[int], list[Case]]
    prerequisites: tuple[str, ...] = ()
    time_budget_s: float = 10.0
    memory_budget_mb: int = 2048
    mistakes: Mapping[str, Mistake] = field(default_factory=dict, hash=False)
    banned: tuple[str, ...] = ()
    return_names: tuple[str, ...] = ()
    has_dropout: bool = False
    contract: Contract | None = None
    alternatives: Mapping[str, str] = field(default_factory=dict, hash=False)
    mutants: Mapping[str, Mutant] = field(default_factory=dict, hash=False)
    runner: str | None = None


def resolve(target: str):
    """``"package.module:attr"`` -> the object (an exercise's ``reference``)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """``(public, hidden)``: a generator on ``PUBLIC_SEED`` for public inputs, one on ``seed`` for hidden ones."""
    return torch.Generator().manual_seed(PUBLIC_SEED), torch.Generator().manual_seed(seed)


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    """Standard normal values of ``shape`` times ``scale``."""
    return torch.randn(*shape, generator=gen, dtype=dtype) * scale


def dim(gen: torch.Generator, low: int, high: int) -> int:
    """A size drawn uniformly from ``low .. high`` (both included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def even(gen: torch.Generator, low: int, high: int) -> int:
    """An even size from ``low .. high`` (a ``d_model`` made of sin/cos pairs)."""
    return 2 * dim(gen, low // 2, high // 2)


def variants(template: str, **correct: str) -> Callable[..., str]:
    """A maker of answer sources: ``template`` filled with ``correct``, some slots replaced.

    ``make = variants(TEMPLATE, scale="...")`` then ``make(scale="wrong")`` is the source of a
    declared mistake that differs from a right answer in that slot only.
    """

    def make(**change: str) -> str:
        unknown = set(change) - set(correct)
        if unknown:
            raise KeyError(f"no slot {sorted(unknown)} in this template")
        return template.format(**{**correct, **change})

    return make


def padded_lengths(gen: torch.Generator, batch: int, longest: int, shortest: int = 1) -> list[int]:
    """Lengths of ``batch`` sentences for a padding case: the first is ``longest``, every other
    one is shorter (``shortest .. longest - 1``). Such a case always pads, so always hides keys:
    an answer that ignores the padding cannot pass it, whatever the seed."""
    return [longest] + [dim(gen, shortest, longest - 1) for _ in range(batch - 1)]


def key_padding_mask(lengths: list[int]) -> torch.Tensor:
    """``(batch, 1, 1, max(lengths))`` boolean mask, True on each sentence's real (not padded) keys."""
    return (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
