"""The harness: grade a submission's exercises in sandboxed workers, judge here.

For each exercise: extract its code (``extract``), start one worker loaded with it
(``sandbox``), send the cases' inputs (``cases``), rebuild each answer from bytes, and
compare it with the reference computed in this process (``compare``). Every case is one
pytest test run here (``checks``). A failing case gets a diagnosis when the answer matches
a declared mistake (``mistakes``). A worker that dies, hangs or cheats the protocol fails
the case it was on, and grading goes on in a fresh one.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import marshal
import os
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import torch

from autograder.sandboxed import procedure, wire
from autograder.cases import built, case_points, case_request, graded_cases, reference_classes, watched
from autograder.checks import run_checks
from autograder.compare import (Verdict, changed_inputs, compare, compare_attributes, compare_initial, compare_nucleus,
                                compare_structures, compare_xavier, moved_generators, parse_structures, split_record)
from autograder.diagnoses_zh import diagnosis
from autograder.exercises.shared import CHECKS, Case, resolve
from autograder.extract import (Extraction, Notebook, Unreadable, extract, find_notebook, read_submission,
                                shortcut_uses, without_docstrings)
from autograder.feedback import bound, code, fenced
from autograder.gradescope import packaged_salt
from autograder.mistakes import compiled
from autograder.reach import reach_line, reaches
from autograder.registry import REGISTRY, Exercise
from autograder.results import ERROR_NOTE, Report, TestResult
from autograder.sandbox import Limits, SandboxFailed, Worker, WorkerDied, fork_server, isolation, kill_all

BLOCKED_PACKAGES = ("tfm_solution", "autograder", "sandboxed")  # the worker imports its own program as `sandboxed`
LONG_ERROR = 600
"""An error longer than this (characters) is given whole once per exercise (``ExerciseRun._error``)."""


def own_prerequisites(exercise: Exercise, through: int | None = None) -> list[str]:
    """The prerequisites of ``exercise`` that a release through chapter ``through`` (the grader's cut-off,
    ``release.released_through()``, when not given) has not released: answers of graded exercises of later
    chapters, the chapter being graded included. The worker receives none of their code; the student's own
    answers stand for them (the submission defines them: they come before this exercise in its notebook)."""
    from autograder.release import graded_references, released_through

    through = released_through() if through is None else through
    later = {name for name, chapter in graded_references().items() if chapter > through}
    return [attr for target in exercise.prerequisites if (attr := target.partition(":")[2]) in later]


def _names_in(obj) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(ast.parse(textwrap.dedent(
        inspect.getsource(obj)))) if isinstance(n, (ast.Name, ast.Attribute))}


def _described(value) -> set[str]:
    """The reference classes a case's module descriptions name (``{"module": "MultiHeadedAttention", ...}``)."""
    if isinstance(value, dict):
        found = {value["module"]} if isinstance(value.get("module"), str) else set()
        return found.union(*(_described(v) for v in value.values()))
    if isinstance(value, (tuple, list)):
        return set().union(*(_described(v) for v in value))
    return set()


@functools.lru_cache(maxsize=None)
def _roots(exercise_id: str) -> frozenset[str]:
    """What the exercise's reference reads, and the classes its cases describe (cases differ in inputs only)."""
    exercise = next(e for e in REGISTRY if e.id == exercise_id)
    roots = _names_in(resolve(exercise.reference))
    for case in graded_cases(exercise, 0):
        roots |= _described((case.args, case.kwargs, case.construct))
    return frozenset(roots)


def _only_behind(exercise: Exercise, unreleased: set[str]) -> set[str]:
    """Prerequisites that neither the exercise's reference nor its cases reach except through ``unreleased``."""
    targets = {t.partition(":")[2]: t for t in exercise.prerequisites}
    roots = _roots(exercise.id)
    reached, todo = set(), [n for n in roots if n in targets and n not in unreleased]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        module_name, _, attr = targets[name].partition(":")
        todo += [n for n in _names_in(getattr(importlib.import_module(module_name), attr))
                 if n in targets and n not in unreleased and n not in reached]
    return set(targets) - reached - unreleased


def _provided(exercise: Exercise, through: int | None = None) -> tuple[str, list[str], dict[str, list[str]]]:
    """Source, names and module layout of the prerequisites a worker receives.

    Only the listed objects travel (their source and their module's imports), never a whole
    module of ``tfm_solution``, so the reference of the exercise under test stays out; and of a
    graded release (``through``), only what it has released (``own_prerequisites``).
    """
    own = exercise.reference.partition(":")[2]
    unreleased = set(own_prerequisites(exercise, through))
    if unreleased:  # what only the unreleased answers called goes with them (chapter 2's `pair_frequencies`)
        unreleased |= _only_behind(exercise, unreleased)
    imports: dict[str, None] = {}
    bodies, names, modules = [], [], {}
    for target in exercise.prerequisites:
        module_name, _, attr = target.partition(":")
        if attr == own and module_name == exercise.reference.partition(":")[0]:
            raise ValueError(f"{exercise.id}: an exercise cannot be its own prerequisite")
        if attr in unreleased:
            continue
        module = importlib.import_module(module_name)
        for node in ast.parse(inspect.getsource(module)).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                text = ast.unparse(node)
                if "__future__" not in text and "tfm_solution" not in text and not getattr(node, "level", 0):
                    imports[text] = None
        bodies.append(inspect.getsource(getattr(module, attr)))
        names.append(attr)
        modules.setdefault(module_name, []).append(attr)
    if names:
        modules["tfm_solution"] = list(names)
    # Annotations stay unevaluated, as in the reference's modules: they may name aliases that do not travel.
    return "\n".join(["from __future__ import annotations", *imports, *bodies]), names, modules


def _salt() -> str:
    """The course's secret salt: ``AUTOGRADER_SALT``, else the one a Gradescope package carries."""
    return os.environ.get("AUTOGRADER_SALT") or packaged_salt()


def default_seed(exercise: Exercise, extraction: Extraction) -> int:
    """Fresh inputs per submission: a hash of the code the worker runs (normalised: comments,
    docstrings and formatting never reach it) and the course's secret salt."""
    digest = hashlib.sha256(f"{_salt()}|{exercise.id}|{extraction.digest()}".encode()).hexdigest()
    return int(digest[:8], 16)


def call_seed(seed: int, number: int) -> int:
    """The seed of case ``number``'s call: torch's generator, the dropout masks and the gradient probe,
    in the worker and in the harness alike. A hash of the submission's ``seed`` (which drew every
    hidden case) and the salt, so the worker, which sees it, learns nothing of that seed."""
    return int(hashlib.sha256(f"{_salt()}|{seed}|{number}".encode()).hexdigest()[:8], 16)


def mark_key(seed: int) -> int:
    """The key of the marks a marked case's convolutions add (``sandboxed.procedure.marks``): from the call's ``seed`` and
    the salt, so an answer that knows the seed (torch's generator is seeded with it) cannot work the marks out."""
    return int(hashlib.sha256(f"{_salt()}|{seed}|marks".encode()).hexdigest()[:12], 16)


def _pack(value, buffers: list[bytes]):
    """A case's argument on the wire; a module description (a dict, JSON data) travels as it is."""
    if isinstance(value, dict):
        return value
    if isinstance(value, tuple):
        return {"seq": [_pack(v, buffers) for v in value]}
    return wire.pack_value(value, buffers, wire.MAX_FRAME_BYTES)


def _pack_args(case: Case) -> tuple[list, dict, list[bytes]]:
    buffers: list[bytes] = []
    return [_pack(a, buffers) for a in case.args], {k: _pack(v, buffers) for k, v in case.kwargs.items()}, buffers


def build_request(exercise: Exercise, case: Case, reference, seed: int) -> tuple[dict, list[bytes], dict | None]:
    """A case as the worker receives it: ``(request, its buffers, the reference's weights sent with it)``."""
    args, kwargs, buffers = _pack_args(case)
    request = {"args": args, "kwargs": kwargs, **case_request(exercise, case, seed)}
    if case.marked:
        request["mark_key"] = mark_key(seed)
    state = _reference_state(reference, case, seed)
    if case.construct is not None:
        request["construct"] = [_pack(a, buffers) for a in case.construct]
    if state is not None:
        request["state"] = {k: wire.pack_value(v, buffers, wire.MAX_FRAME_BYTES) for k, v in state.items()}
    return request, buffers, state


def _local_args(case: Case) -> tuple[tuple, dict]:
    """Fresh copies of the case's inputs: code that updates its input in place changes no other call's."""

    def fresh(value):
        return value.clone() if isinstance(value, torch.Tensor) else built(value)

    return tuple(fresh(a) for a in case.args), {k: fresh(v) for k, v in case.kwargs.items()}


def _reference_state(reference, case: Case, seed: int) -> dict[str, torch.Tensor] | None:
    """For a module case, the weights of a freshly seeded reference module (sent to the worker).

    With ``case.distinct``, every parameter gets seeded noise first: copies that start equal (clones
    of one prototype, LayerNorm's ones and zeros) then differ, so an answer that shares one module
    where the reference has copies computes something else.
    """
    if case.construct is None or case.structure or case.measure is not None:
        return None
    torch.default_generator.manual_seed(seed)
    module = reference(*built(case.construct))
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    if case.distinct:
        gen = torch.Generator().manual_seed(seed)
        for name, _ in module.named_parameters():
            state[name] += 0.2 * torch.randn(state[name].shape, generator=gen, dtype=state[name].dtype)
    return state


def _record(exercise: Exercise | None, fn, case: Case, state: dict | None = None, seed: int = 0, *,
            watch: bool = True):
    """What ``fn`` (a function, or a module class given the weights ``state``) answers on the case, computed
    as the worker computes it (``sandboxed.procedure.answer``, from the same request, ``cases.case_request``): every
    dropout call is ``FixedDropout`` reset to ``seed``; a structure case gives ``(structures, initial values)``;
    a watched case ``(answer, (arguments after the call, generator states, attributes))``."""
    request = case_request(exercise, case, seed)
    request["watch"] &= watch
    if case.marked:
        request["mark_key"] = mark_key(seed)
    torch.default_generator.manual_seed(seed)  # as the worker does before building the arguments
    args, kwargs = _local_args(case)
    construct = None if case.construct is None else list(built(case.construct))
    with procedure.FixedDropout(seed):
        result, structures, _ = procedure.answer(fn, request, list(args), kwargs, construct, state, reference_classes())
    return _plain(result) if structures is None else (structures, _plain(result))


def _expected(fn, case: Case, state: dict | None = None, seed: int = 0):
    """What ``fn`` returns on the case, as in the worker (``_record``): the answer alone (a structure case:
    the structures), without what the harness checks besides."""
    found = _record(None, fn, case, state, seed, watch=False)
    return found[0] if case.structure else found


def _plain(value):
    """The reference's result as the worker would send it (tuples, detached tensors)."""
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value.detach().contiguous() if isinstance(value, torch.Tensor) else value


def error_text(exc: BaseException) -> str:
    """How an exception is reported, the same way here and in the worker."""
    return f"{type(exc).__name__}: {exc}"[:2000]


def verdict(exercise: Exercise, case: Case, got, expected) -> Verdict:
    """Whether the answer ``got`` matches ``expected`` on this case (a structure, or returned values), and
    why not: what a declared mistake is recognised by."""
    if case.structure:
        return compare_structures(got, expected)
    if case.measure == "xavier":
        return compare_xavier(got, expected)
    if case.judge == "nucleus":
        return compare_nucleus(got, expected, case.args[0])
    names = _item_names(exercise, case)
    contract = exercise.contract
    found = compare(got, expected, case.rtol, case.atol, names=names, widen=contract.may_widen if contract else ())
    if case.train and not found.ok:
        found.lines += _cut_off(got, expected, names)
    return found


def _cut_off(got, expected, names: tuple[str, ...]) -> list[str]:
    """The gradient that no longer arrives (all zeros where the reference's is not): the result was cut off."""
    if not (isinstance(got, tuple) and isinstance(expected, tuple) and len(got) == len(expected)):
        return []
    for name, g, e in zip(names, got, expected):
        if (name.startswith("gradient") and isinstance(g, torch.Tensor) and isinstance(e, torch.Tensor)
                and g.shape == e.shape and not bool(g.any()) and bool(e.any())):
            return [f"{CHECKS['gradients']}: no {name} arrives: the result is cut off from the graph (`.detach()`, "
                    "`.data`, `torch.no_grad()`, `torch.tensor(...)` or a copy into a new tensor on the way)"]
    return []


def judge(exercise: Exercise, case: Case, got, expected, seed: int) -> Verdict:
    """The whole verdict on a case, from the worker's record ``got`` and the reference's ``expected``
    (``_record``): the answer (``verdict``), and the contract: on a structure case the initial values, on a
    watched case the arguments left unchanged, the generators left alone and the attributes kept."""
    if case.structure:
        found = verdict(exercise, case, got[0], expected[0])
        initial = compare_initial(got[1], expected[1], case_request(exercise, case, seed)["init"])
        return Verdict(found.ok and initial.ok, initial.lines + found.lines, found.ok)
    if not watched(case):
        found = verdict(exercise, case, got, expected)
        return Verdict(found.ok, found.lines, found.ok)
    answer, after, states, kept = split_record(got, len(case.keep))
    wanted, _, _, wanted_kept = split_record(expected, len(case.keep))
    found = verdict(exercise, case, answer, wanted)
    lines = []
    contract = exercise.contract
    if after is not None and (contract is None or contract.pure):
        sent = (case.args, tuple(case.kwargs[k] for k in sorted(case.kwargs)))
        lines += changed_inputs(sent, after, argument_names(exercise, case))
    if contract is None or not contract.draws:
        lines += moved_generators(states, seed)
    if case.keep:
        lines += compare_attributes(case.keep, kept, wanted_kept, case.rtol, case.atol).lines
    return Verdict(found.ok and not lines, found.lines + lines, found.ok)


def value_of(case: Case, record):
    """The answer in a record of ``_record``'s or the worker's (``ValueError`` if it is malformed)."""
    if case.structure:
        return record[0]
    return split_record(record, len(case.keep))[0] if watched(case) else record


def _item_names(exercise: Exercise, case: Case) -> tuple[str, ...]:
    """What the items of the answer are called in the feedback."""
    if not case.train:
        return case.attributes or exercise.return_names
    reference = resolve(exercise.reference)
    if exercise.kind == "factory":  # the signature of what the case calls on the built module
        called = reference(*built(case.construct))
        reference = getattr(called, case.method) if case.method else called
    if exercise.kind == "function":
        parameters = list(inspect.signature(reference).parameters)
    else:
        parameters = list(inspect.signature(reference.forward).parameters)[1:]
    chosen = range(len(case.args)) if case.inputs is None else case.inputs
    inputs = [parameters[i] if i < len(parameters) else f"argument {i}" for i, a in enumerate(case.args)
              if i in chosen and isinstance(a, torch.Tensor) and a.is_floating_point()]
    outputs = exercise.return_names or ("output",)
    gradients = []
    for output in outputs:
        through = "" if len(outputs) == 1 else f" through `{output}`"
        gradients += [f"gradient of the input `{n}`{through}" for n in inputs]
        gradients += [f"gradient of `{n}`{through}" for n in case.gradients]
    return (*outputs, *gradients)


def argument_names(exercise: Exercise, case: Case) -> list[str]:
    """The names of the case's arguments, positional then keyword (sorted), for the feedback."""
    reference = resolve(exercise.reference)
    try:
        if exercise.kind == "function":
            parameters = list(inspect.signature(reference).parameters)
        elif exercise.kind == "module" and case.method is None:
            parameters = list(inspect.signature(reference.forward).parameters)[1:]
        else:
            parameters = []
    except (TypeError, ValueError):
        parameters = []
    return [parameters[i] if i < len(parameters) else f"argument {i}" for i in range(len(case.args))] + \
        sorted(case.kwargs)


def _diagnose(exercise: Exercise, case: Case, got=None, state: dict | None = None,
              error: str | None = None, seed: int = 0, language: str = "en") -> list[str]:
    """Declared mistakes that give the submission's output on this case, or raise its ``error``, named in the
    notebook's ``language``."""
    found = []
    for name, mistake in exercise.mistakes.items():
        try:
            wrong = _expected(compiled(mistake, exercise.name), case, state, seed)
        except Exception as exc:  # noqa: BLE001 - a mistake may fail on these inputs: then its error is its output
            matches = error is not None and error_text(exc) == error
        else:
            try:
                answer = value_of(case, got) if error is None else None
            except ValueError:
                answer = error = "unreadable"
            matches = error is None and (verdict(exercise, case, answer, wrong).ok
                                         or _same_nan_pattern(answer, wrong))
        if matches:
            found.append(diagnosis(name, mistake.message, language))
    return found


def _same_nan_pattern(got, wrong) -> bool:
    """NaN never equals NaN, but NaN in the same places as a known mistake is that mistake."""
    if isinstance(got, tuple) and isinstance(wrong, tuple) and len(got) == len(wrong):
        pairs = list(zip(got, wrong, strict=True))
    else:
        pairs = [(got, wrong)]
    tensors = [(g, w) for g, w in pairs if isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)]
    return bool(tensors) and any(bool(w.isnan().any()) for _, w in tensors) and all(
        g.shape == w.shape and g.dtype == w.dtype and torch.equal(g.isnan(), w.isnan())
        and torch.allclose(g.nan_to_num(), w.nan_to_num(), rtol=1e-4, atol=1e-5) for g, w in tensors)


def _policy(exercise: Exercise, extraction: Extraction) -> TestResult | None:
    """Library shortcuts for the exercise under test: reported apart, worth no points."""
    if not exercise.banned:
        return None
    used = shortcut_uses(extraction, exercise.banned)
    text = (f"Your answer calls {', '.join(f'`{u}`' for u in used)}: this exercise asks you to write it yourself. "
            "Points are not deducted automatically; your instructor sees this line." if used
            else "No library shortcut for this exercise was used.")
    return TestResult(f"{exercise.id} policy: no library shortcut", 0.0, 0.0, text, passed=not used)


def _case_name(exercise: Exercise, case: Case) -> str:
    label = "structure" if case.structure else "public" if case.public else "hidden"
    return f"{exercise.id} {label}: {case.title}"


class ExerciseRun:
    """One exercise of one notebook being graded: its cases, its worker, what it printed.

    ``case_result(i)`` runs case ``i`` (cases in order; a worker is started on demand and
    replaced after it dies); ``finish(report)`` adds the cases' results and the exercise's
    policy, performance and notes lines. The graded tests (``checks.py``) drive it.
    """

    def __init__(self, nb: Notebook, exercise: Exercise, *, seed: int | None, public_only: bool,
                 limits: Limits) -> None:
        self.exercise = exercise
        self.language = nb.language
        self.extraction = self.extract(nb)
        self.seed = default_seed(exercise, self.extraction) if seed is None else seed
        all_cases = graded_cases(exercise, self.seed)
        kept = [(c, w) for c, w in zip(all_cases, case_points(exercise.points, all_cases), strict=True)
                if c.public or not public_only]
        self.cases = [c for c, _ in kept]
        self.weights = [w for _, w in kept]
        self.notes = list(self.extraction.notes)
        self.reach = reaches(self.extraction.sources(), self.extraction.answer_source)
        self.limits = Limits(**{**limits.__dict__, "memory_mb": min(limits.memory_mb, exercise.memory_budget_mb)})
        self.results: dict[int, TestResult] = {}
        self.own: list[str] = []
        self.worker: Worker | None = None
        self.slow: list[str] = []
        self.printed: list[str] = []
        self.load_failure: str | None = None
        self.deadline: float | None = None
        self.spent = 0.0  # own seconds of this exercise's workers that are gone (see sandbox.OwnTime)
        self.timeouts = 0
        if not self.extraction.error:
            self.reference = resolve(exercise.reference)
            self.own = own_prerequisites(exercise)
            source, names, modules = _provided(exercise)
            # Only bytecode without docstrings travels: the worker holds no readable reference, even
            # of a prerequisite that is another exercise of the chapter being graded; and nothing at all
            # of one a graded release has not released (``own_prerequisites``: the student's own stands in).
            self.provided = marshal.dumps(compile(without_docstrings(ast.parse(source)), "<provided>", "exec"))
            self.setup = {"chunks": self.extraction.sources(), "name": exercise.name, "provided_names": names,
                          "provided_modules": modules, "blocked": list(BLOCKED_PACKAGES), "own_names": self.own}

    def extract(self, nb: Notebook) -> Extraction:
        """The code this exercise is graded on (a subclass may gather it from elsewhere)."""
        return extract(nb, self.exercise)

    def name(self, number: int) -> str:
        return _case_name(self.exercise, self.cases[number])

    def call_seed(self, number: int) -> int:
        return call_seed(self.seed, number)

    def case_result(self, number: int) -> TestResult:
        """Run case ``number`` and keep its result (which the graded test then asserts on)."""
        try:
            result = self._run(number)
        finally:
            if number == len(self.cases) - 1:
                self._stop_worker()
        self.results[number] = result
        return result

    def _error(self, number: int) -> str:
        """Why the answer could not be run: whole on the exercise's first line; on the others, when it is a
        list (chapter 12 names every missing answer of chapters 1-11), its first and last paragraphs only,
        so that one list repeated on every case cannot fill the run's feedback."""
        error = self.extraction.error
        paragraphs = error.split("\n\n")
        if number == 0 or len(paragraphs) < 3 or len(error) <= LONG_ERROR:
            return error
        return "\n\n".join([paragraphs[0], f"(listed in full on the line `{self.name(0)}`)", paragraphs[-1]])

    def _fail(self, number: int, why: str) -> TestResult:
        """Case ``number`` scores nothing, for the reason ``why``; an autograder error is no grade at all."""
        return TestResult(self.name(number), 0.0, self.weights[number],
                          f"Checked: {self.cases[number].checks}.\n\n{why}", not_graded=why.startswith(ERROR_NOTE))

    def _run(self, number: int) -> TestResult:
        case, exercise = self.cases[number], self.exercise
        if self.extraction.error:
            return TestResult(self.name(number), 0.0, self.weights[number], self._error(number))
        if self.reach:  # nothing of it runs: what the worker would measure could be forged
            return self._fail(number, reach_line(self.reach))
        # One exercise may take three calls' and one start's own time (its workers' CPU and waiting
        # time, never the machine's load); the wall clock is only a generous backstop, started once
        # the fork server is up (importing torch is the grader's time, not the exercise's).
        budget = 3 * self.limits.call_timeout_s + self.limits.start_timeout_s
        if self.deadline is None:
            fork_server()
            self.deadline = time.monotonic() + self.limits.wall_factor * budget
        spent = self.spent + (self.worker.spent if self.worker else 0.0)
        if spent > budget or time.monotonic() > self.deadline or self.timeouts >= 2:
            return self._fail(number, "not run: earlier cases of this exercise timed out, which bounds the "
                                      "time one exercise may take")
        if self.load_failure:
            # The same code dies the same way while loading: no point starting it again.
            return self._fail(number, self.load_failure)
        try:
            if self.worker is None:
                self._start_worker()
            # The per-call seed and a neutral id: nothing in the request names the exercise's seed.
            request, buffers, state = build_request(exercise, case, self.reference, self.call_seed(number))
            request["id"] = f"case {number}"
            reply, out, seconds = self.worker.call(request, buffers)
        except WorkerDied as died:
            self.printed.append(self.worker.captured_output() if self.worker else died.output)
            self.spent += self.worker.spent if self.worker else 0.0
            self.worker = None
            self.timeouts += died.reason.startswith("timed out")
            return self._fail(number, self.load_failure or f"{died.reason}; the remaining cases run in a fresh worker")
        except _NotDefined as missing:
            return self._fail(number, str(missing))
        if reply.get("ok") and seconds > exercise.time_budget_s:
            self.slow.append(f"{case.title}: {seconds:.2f} s")
        return _judge(exercise, case, self.name(number), self.weights[number], self.reference, reply, out, state,
                      self.call_seed(number), language=self.language)

    def _start_worker(self) -> None:
        try:
            try:
                self.worker = Worker(self.setup, self.limits, [self.provided])
            except SandboxFailed:  # the grader's trouble, not the answer's: once more, with a fresh fork server
                self.worker = Worker(self.setup, self.limits, [self.provided], fresh_server=True)
        except SandboxFailed as failed:  # nothing of the student's ran: fail closed, and the case is not graded
            self.load_failure = f"{ERROR_NOTE}: {failed.reason}"
            raise
        except WorkerDied as died:
            self.load_failure = f"{died.reason} (while running your notebook's code, before any test)"
            raise
        ready = self.worker.ready
        # Errors in other cells are mostly harmless here (their code runs without the calls it
        # relied on); they are shown only when the answer itself is missing.
        explained = [self.extraction.explain(e) for e in ready.get("errors", [])]
        label = self.extraction.answer_label
        errors = [e for e in explained if e.startswith((label + ":", label + ",")) or not ready.get("found")]
        if errors and not any(n.startswith("error while running") for n in self.notes):
            self.notes += [f"error while running your code:\n\n{fenced(e)}" for e in errors]
        if not ready.get("found"):
            # Every case meets the same missing name: each says why, and no worker runs for nothing.
            self.load_failure = not_defined(self.exercise.name, explained)
            self._stop_worker()
            raise _NotDefined(self.load_failure)

    def _stop_worker(self) -> None:
        if self.worker is not None:
            self.spent += self.worker.spent
            self.worker.kill()
            self.printed.append(self.worker.captured_output())
            self.worker = None

    def finish(self, report: Report) -> None:
        """Add this exercise's lines to ``report`` (after its worker is gone)."""
        self._stop_worker()
        exercise = self.exercise
        report.seeds[exercise.id] = self.seed
        lines = [self.results.get(number) or self._fail(number, f"{ERROR_NOTE}: this case did not run")
                 for number in range(len(self.cases))]
        behaviour = [line for line, case in zip(lines, self.cases) if not case.structure]
        if behaviour and all(NOT_IMPLEMENTED in line.output for line in behaviour):
            # a structure is worth points only for a module that computes something: an untouched stub scores 0
            lines = [replace(line, score=0.0, output=line.output.removesuffix("passed") + STRUCTURE_OF_A_STUB)
                     if case.structure and line.score else line for line, case in zip(lines, self.cases)]
        report.tests.extend(lines)
        policy = _policy(exercise, self.extraction)
        if policy:
            report.tests.append(policy)
        if self.reach:
            report.tests.append(TestResult(f"{exercise.id} integrity: the grader's machinery left alone", 0.0, 0.0,
                                           reach_line(self.reach), passed=False))
        if self.slow:
            report.tests.append(TestResult(f"{exercise.id} performance", 0.0, 0.0,
                                           f"correct or not, these calls took longer than the budget of "
                                           f"{exercise.time_budget_s:g} s (not counted as wrong): "
                                           + "; ".join(self.slow), passed=False))
        output = "".join(self.printed).strip()
        notes = list(self.notes)
        lost = any(line.score < line.max_score for line, case in zip(lines, self.cases))
        if self.own and lost:
            notes.append(_own_note(exercise, self.own, report))
        if output:
            notes.append("your code printed:\n\n" + fenced(output))
        if notes:
            report.tests.append(TestResult(f"{exercise.id} notes", 0.0, 0.0, "\n\n".join(notes)))


def _own_note(exercise: Exercise, own: list[str], report: Report) -> str:
    """Why a case may fail because of an earlier exercise: in a graded release, the student's own answers stand
    for the prerequisites not yet released; those that lost points on their own lines are named first."""
    by_name = {e.reference.partition(":")[2]: e for e in REGISTRY}
    failed = [name for name in own if name in by_name and any(
        t.name.startswith(by_name[name].id + " ") and t.score < t.max_score for t in report.tests)]
    names = ", ".join(code(n) for n in own)
    text = (f"this exercise ran with your own {names} (the course has not released {'its' if len(own) == 1 else 'their'}"
            " reference yet), not the reference's")
    if failed:
        text += (f"; {', '.join(code(n) for n in failed)} lost points on {'its' if len(failed) == 1 else 'their'} own "
                 f"lines above, so a failure here may come from that earlier exercise rather than from "
                 f"{code(exercise.name)}: fix it first")
    return text


NOT_IMPLEMENTED = "not implemented yet (the stub raises `NotImplementedError`)"
STRUCTURE_OF_A_STUB = ("no points yet: the module's computation is not implemented (every other case of this "
                       "exercise still meets the stub); the structure counts once the module computes something")


class _NotDefined(Exception):
    pass


def _is_memory_error(error: str) -> bool:
    return "MemoryError" in error or "can't allocate memory" in error or "Cannot allocate memory" in error


def not_defined(name: str, errors: list[str]) -> str:
    """Why the answer's name is missing after the notebook's code ran, from the errors it raised
    (each ``"cell N[, line L: `source`]: Exception: message"``): the cause first, the rest in the notes."""
    missing = f"`{name}` is not defined after running your code"
    memory = [e for e in errors if _is_memory_error(e)]
    imports = [e for e in errors if "ImportError" in e or "ModuleNotFoundError" in e]
    if memory:
        return (f"{missing}: your code ran out of memory while it was loading ({code(memory[0])}). The memory "
                "limit counts only what your code allocates, beyond what the grader itself holds")
    if imports:
        why = imports[0][:400]
        blocked = any(f"`{package}" in why or f"'{package}" in why or f"{package}." in why
                      for package in BLOCKED_PACKAGES)
        hint = ("; importing the course's reference (`tfm_solution`) or the grader is not allowed in an answer: "
                "what an exercise may use from earlier chapters is provided already")
        # (the worker's own refusal says so already)
        return f"{missing}: an import failed ({code(why, 400)}{hint if blocked and 'not available' not in why else ''})"
    return missing + ("" if errors else " (is the answer cell still a stub?)")


def _judge(exercise: Exercise, case: Case, name: str, weight: float, reference, reply: dict,
           out: list[bytes], state: dict | None = None, seed: int = 0, expected=None,
           language: str = "en") -> TestResult:
    """Score one case from the worker's reply (plain data) against the live reference (its record,
    ``_record``, unless ``expected`` already holds it); a declared mistake is named in ``language``."""
    lines = [f"Checked: {case.checks}."]
    if case.public and (case.construct is not None or case.structure):
        builds = case.args if case.structure else (case.construct,)
        lines.append("Built as " + ", ".join(f"`{exercise.name}{_arguments(b)}`" for b in builds))
    if case.public and not case.structure and case.judge is None and (case.args or case.kwargs):
        lines.append("Inputs: " + ", ".join(_shape(a) for a in case.args)
                     + "".join(f", {k}={_shape(v)}" for k, v in case.kwargs.items()))
    if not reply.get("ok"):
        error = str(reply.get("error", "unknown error"))
        if error.startswith("NotImplementedError"):
            return TestResult(name, 0.0, weight, "\n\n".join(lines + [NOT_IMPLEMENTED]))
        if error.startswith("MemoryError") or "can't allocate memory" in error:
            return TestResult(name, 0.0, weight, "\n\n".join(lines + ["exceeded the memory limit:\n\n"
                                                                       + fenced(error, 200)]))
        named = _diagnose(exercise, case, state=state, error=error, seed=seed, language=language)
        return TestResult(name, 0.0, weight, "\n\n".join(lines + ["your code raised:\n\n" + fenced(error), *named]))
    try:
        got = wire.unpack_value(reply.get("value"), out)
        if case.structure:
            got = (parse_structures(reply.get("structure")), got)
        value_of(case, got)  # a record of the right shape, or ValueError
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as exc:
        return TestResult(name, 0.0, weight, "\n\n".join(lines + [f"the returned value could not be read: {exc}"]))
    if case.rule is not None:  # a rule, not the reference, decides: its verdict first, then what it was given
        passed, said = case.rule(got)
        return TestResult(name, weight if passed else 0.0, weight, "\n\n".join([lines[0], *said, *lines[1:]]))
    if expected is None:
        expected = _record(exercise, reference, case, state, seed)
    found = judge(exercise, case, got, expected, seed)
    if found.ok:
        return TestResult(name, weight, weight, "\n\n".join(lines + ["passed"]))
    unloaded = reply.get("unloaded")
    if case.construct is not None and isinstance(unloaded, list) and unloaded:
        names = ", ".join(code(n) for n in unloaded[:12] if isinstance(n, str))
        found.lines.append(f"the reference's weights did not all fit your module ({names}): see the structure line")
    # A declared mistake is recognised by the values it returns: only wrong values are compared with them.
    named = [] if found.answer_ok else _diagnose(exercise, case, got, state, seed=seed, language=language)
    shown = found.lines[:MAX_MISMATCH_LINES]
    if len(found.lines) > len(shown):  # a model's gradients can fill pages: the diagnosis must stay in view
        shown.append(f"... and {len(found.lines) - len(shown)} more lines like these")
    return TestResult(name, 0.0, weight, "\n\n".join(lines + ["- " + "\n- ".join(shown), *named]))


MAX_MISMATCH_LINES = 24
"""Lines of differences shown per case (a case of a whole model can differ in every one of its gradients)."""


def _arguments(values: tuple) -> str:
    return "(" + ", ".join(_shape(v) for v in values) + ")"


def _shape(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict) and value.get("module") == "scale":
        return f"a dropout stand-in multiplying by {value.get('factor')}"
    if isinstance(value, dict) and value.get("module") == "weight_names":
        return f"your {len(value.get('names', []))} weight tensors"
    if isinstance(value, dict):  # a module description: the reference's sublayer, built with these arguments
        return f"{value.get('module')}(" + ", ".join(f"{k}={_shape(v)}" for k, v in value.items() if k != "module") + ")"
    if isinstance(value, tuple):
        return "(" + ", ".join(_shape(v) for v in value) + ")"
    return repr(value)


def select_exercises(notebooks: list, chapter: str | None) -> list[tuple[Exercise, Notebook | Unreadable | None]]:
    """The exercises to grade and the notebook each one is in (``None``: not submitted)."""
    if chapter is not None:
        wanted = [e for e in REGISTRY if e.chapter == chapter or e.chapter.split("_")[0] == chapter.zfill(2)]
        if not wanted:
            raise ValueError(f"no exercises for chapter {chapter!r}")
        return [(e, find_notebook(notebooks, e)) for e in wanted]
    return [(e, nb) for e in REGISTRY if (nb := find_notebook(notebooks, e)) is not None]


def grade_path(path: str | os.PathLike, *, chapter: str | None = None, seed: int | None = None,
               public_only: bool = False, limits: Limits | None = None, only: str | None = None) -> Report:
    """Grade a notebook, folder or zip. ``only`` restricts to one exercise id (the hook). The
    workers see none of it but the extracted code (their file system is an allowlist)."""
    start = time.monotonic()
    report = Report()
    limits = limits or Limits()
    notebooks = read_submission(path)
    chosen = select_exercises(notebooks, chapter)
    if only is not None:
        chosen = [(e, nb) for e, nb in chosen if e.id == only] or [
            (e, find_notebook(notebooks, e)) for e in REGISTRY if e.id == only]
    if not chosen:
        report.notes.append("no exercise of the course was found in this submission")
    runs: list[ExerciseRun] = []
    # The reference side seeds torch per case with a hidden seed; fork_rng leaves the caller's
    # generator (a notebook kernel's, for the graded cells) as it was.
    try:
        with torch.random.fork_rng(devices=[]):
            for exercise, nb in chosen:
                if isinstance(nb, Notebook):
                    runner = resolve(exercise.runner) if exercise.runner else ExerciseRun
                    more = {"submission": (Path(path), notebooks)} if exercise.runner else {}
                    runs.append(runner(nb, exercise, seed=seed, public_only=public_only, limits=limits, **more))
            run_checks(runs)
    finally:
        kill_all()  # whatever was raised: every worker, and all it started, is gone before results exist
    if runs:
        report.sandbox = isolation()[2]
    if any(isinstance(nb, Notebook) and nb.language == "zh" for _, nb in chosen):
        report.language = "zh"  # its feedback is rendered in Chinese (results.to_gradescope, results.table)
    unreadable_done: set[str] = set()
    for exercise, nb in chosen:
        if isinstance(nb, Notebook):
            runs.pop(0).finish(report)
            continue
        name = f"{exercise.id} could not read notebook" if isinstance(nb, Unreadable) else f"{exercise.id} missing"
        why = nb.reason if isinstance(nb, Unreadable) else f"no notebook with `{exercise.name}` was submitted " \
                                                             f"(expected {exercise.notebook})"
        report.tests.append(TestResult(name, 0.0, float(exercise.points), why))
        if isinstance(nb, Unreadable):
            unreadable_done.add(nb.name)
    for nb in notebooks:
        if isinstance(nb, Unreadable) and nb.name not in unreadable_done and only is None:
            report.tests.append(TestResult(f"could not read notebook {nb.name}", 0.0, 0.0, nb.reason))
    bound(report.tests)
    report.execution_time = time.monotonic() - start
    return report
