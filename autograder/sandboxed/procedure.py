"""A graded call in the worker, and what is measured beside it.

``answer`` calls the student's function or module on a request's arguments, as the grader calls the
reference on the same request to compute its record: the same procedure on both sides. What it measures
beside the answer (the inputs after the call, the random generators, a module's structure and initial
values, the dropout and conv1d stand-ins) shares a process with the answer: the grader reads the answer's
code before it runs (``autograder.reach``), and computes from data whatever it can.
"""

from __future__ import annotations

import contextlib

from .drivers import DRIVERS
from .wire import Unsupported


class _Scale:
    """Deterministic stand-in for a dropout module: multiplies its input by ``factor``."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


class FixedDropout:
    """Deterministic stand-in for every dropout call (``nn.Dropout`` and ``F.dropout`` alike).

    ``nn.Dropout`` calls ``torch.nn.functional.dropout``; both that and ``torch.dropout`` are
    replaced, so a module's dropouts and a functional one are treated the same. The k-th call
    after ``reset(seed)`` keeps the entries where a uniform draw from the generator seeded with
    ``(seed, k)`` is at least ``p`` and scales them by ``1 / (1 - p)``: the reference (in the
    harness) and the submission (here) drop the same entries when they call dropout at the
    same places with the same ``p``, while a dropout that is missing, doubled, misplaced or
    given another ``p`` changes the output. ``training=False`` is the identity, as in PyTorch.
    Used as a context manager, it is installed only inside the ``with`` block.
    """

    def __init__(self, seed: int = 0) -> None:
        self.reset(seed)
        self._saved: tuple | None = None

    def reset(self, seed: int) -> None:
        self.seed, self.calls = seed, 0

    def __call__(self, input, p=0.5, training=True, inplace=False, *, train=None):  # noqa: A002 - torch's names
        import torch

        if train is not None:  # torch.dropout(input, p, train)
            training = train
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        if not training:
            return input
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
        self.calls += 1
        keep = torch.rand(input.shape, generator=gen) >= p
        factor = (keep / (1.0 - p) if p < 1.0 else torch.zeros(input.shape)).to(input.dtype)
        return input.mul_(factor) if inplace else input * factor

    def install(self) -> None:
        import torch

        self._saved = (torch.nn.functional.dropout, torch.dropout)
        torch.nn.functional.dropout = torch.dropout = self

    def __enter__(self) -> FixedDropout:
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.nn.functional.dropout, torch.dropout = self._saved


def _marked_convolution():
    """Stand-in for torch's 1-D convolution (``torch.conv1d`` and ``torch.nn.functional.conv1d``, one
    function, which ``nn.Conv1d`` calls too): ``(install, marking)``.

    ``install()`` puts it in place of the real one; the worker does so before the student's code runs
    (``from torch.nn.functional import conv1d`` gets it) and again before every request. Inside
    ``marking(key)`` the k-th call returns the real convolution plus a mark, one number added to every
    element: ``0.5 + sum(input * R) + sum(weight * S)``, with ``R`` and ``S`` drawn for call k from a
    generator seeded with ``key`` (a secret of the grader's that only the request carries) and scaled so
    the mark stays near 1. A case that marks it (``Case.marked``) runs the answer here and the reference in
    the harness with the same key, so an answer whose result the convolutions compute carries the same
    marks, call by call (the bias, given to conv1d or added after it, does not enter: both ways are right).
    One computed any other way misses them: ``@``, ``matmul``, ``einsum``, ``F.linear``, a convolution
    called on the side and thrown away, and a call made to learn a mark (it uses up that call's draw, and
    on other inputs than the real ones shows another mark). The marks' state lives in this closure, not in
    an attribute; reaching into closures or frames is refused before the answer runs (``autograder.reach``).
    """
    import torch

    real = torch.conv1d
    state: list = [None, 0]  # the key while marking, and how many calls were marked

    def mark(tensor, draw: torch.Generator):
        weights = torch.rand(tensor.shape, generator=draw, dtype=torch.float64) * 2 - 1
        return float((tensor.detach().double() * weights).sum()) / max(tensor.numel(), 1)

    def conv1d(input, weight, *args, **kwargs):
        out = real(input, weight, *args, **kwargs)
        if state[0] is None:
            return out
        draw = torch.Generator().manual_seed((state[0] + 7919 * state[1]) % (1 << 63))
        state[1] += 1
        return out + (0.5 + mark(input, draw) + mark(weight, draw))

    def install() -> None:
        torch.conv1d = torch.nn.functional.conv1d = conv1d

    @contextlib.contextmanager
    def marking(key: int):
        saved = (torch.conv1d, torch.nn.functional.conv1d)
        install()
        state[:] = [key, 0]
        try:
            yield
        finally:
            state[:] = [None, 0]
            torch.conv1d, torch.nn.functional.conv1d = saved

    return install, marking


_MARK_FACTORIES = {"conv1d": _marked_convolution}
_MARKS: dict = {}


def marks(name: str):
    """``(install, marking)`` of the stand-in for the torch function ``name`` a case may mark
    (``Case.marked``), made once per process."""
    if name not in _MARKS:
        _MARKS[name] = _MARK_FACTORIES[name]()
    return _MARKS[name]


MAX_STRUCTURE_ENTRIES, MAX_NAME_CHARS, MAX_BUILDS = 256, 200, 8
MAX_MODULE_DEPTH = 32  # nesting of submodules a walk follows (a module inside itself ends there)


def walk_module(module) -> dict:
    """A module's tensors, read from the modules' own ``_parameters``, ``_buffers`` and ``_modules``
    dicts (with ``dict``'s and ``object``'s functions), never through the instance's methods, which a
    submission may override to describe something else than what it holds.

    ``{"parameters": [(name, tensor)], "buffers": [(name, tensor)], "state_dict": [(key, tensor)],
    "all": {name: tensor}}``, as ``named_parameters``, ``named_buffers`` and ``state_dict`` would list
    them for a plain ``nn.Module``: a module or tensor reached twice is listed once by the first two
    and under every name by ``state_dict``; non-persistent buffers are left out of it.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"the object built is a {type(module).__name__}, not a torch.nn.Module")
    found: dict = {"parameters": [], "buffers": [], "state_dict": [], "all": {}}
    seen_modules: set[int] = set()
    seen = {"parameters": set(), "buffers": set()}

    def own(m, key: str, kind: type):
        value = object.__getattribute__(m, "__dict__").get(key)
        return value if isinstance(value, kind) else kind()

    def visit(m, prefix: str, depth: int, listed: bool) -> None:
        if depth > MAX_MODULE_DEPTH or len(found["all"]) > 16 * MAX_STRUCTURE_ENTRIES:
            raise ValueError("modules nested too deep, or too many of them (a module inside itself?)")
        listed = listed and id(m) not in seen_modules
        seen_modules.add(id(m))
        transient = own(m, "_non_persistent_buffers_set", set)
        for kind, table in (("parameters", "_parameters"), ("buffers", "_buffers")):
            for name, tensor in dict.items(own(m, table, dict)):
                if not isinstance(tensor, torch.Tensor):
                    continue
                full = prefix + str(name)
                found["all"].setdefault(full, tensor)
                if listed and id(tensor) not in seen[kind]:
                    seen[kind].add(id(tensor))
                    found[kind].append((full, tensor))
                if kind == "parameters" or not set.__contains__(transient, name):
                    found["state_dict"].append((full, tensor))
        for name, child in dict.items(own(m, "_modules", dict)):
            if isinstance(child, torch.nn.Module):
                visit(child, f"{prefix}{name}.", depth + 1, listed)

    visit(module, "", 0, True)
    return found


def _shape(tensor) -> list[int]:
    import torch

    with torch._C.DisableTorchFunction():
        return list(torch.Tensor.size(tensor))


def describe_structure(module) -> dict:
    """A module's parameters, buffers and ``state_dict``: names, shapes, ``requires_grad`` (JSON data).

    ``{"parameters": [[name, shape, requires_grad], ...], "buffers": [[name, shape], ...],
    "state_dict": [[key, shape or None], ...]}``; what the structure check compares. Read by
    ``walk_module``, not by the module's own (overridable) methods.
    """
    import torch

    found = walk_module(module)
    with torch._C.DisableTorchFunction():
        return {
            "parameters": [[str(n)[:MAX_NAME_CHARS], _shape(p), bool(torch.Tensor.requires_grad.__get__(p))]
                           for n, p in found["parameters"][:MAX_STRUCTURE_ENTRIES]],
            "buffers": [[str(n)[:MAX_NAME_CHARS], _shape(b)] for n, b in found["buffers"][:MAX_STRUCTURE_ENTRIES]],
            "state_dict": [[str(k)[:MAX_NAME_CHARS], _shape(v)]
                           for k, v in found["state_dict"][:MAX_STRUCTURE_ENTRIES]],
        }


def initial_values(module, names: list[str]) -> tuple:
    """The tensors ``names`` of ``module`` as built (``walk_module``), in chunks of at most 64 (what a
    tuple on the wire may hold); a name the module lacks is ``None``."""
    everything = walk_module(module)["all"]
    values = [everything.get(n) for n in names]
    values = [v.detach().clone() if v is not None else None for v in values]
    return tuple(tuple(values[i:i + 64]) for i in range(0, len(values), 64))


def load_fitting(module, state: dict) -> list[str]:
    """Load the entries of ``state`` whose name and shape fit ``module``; return the names that did not.

    Not strict: a ``state_dict`` that differs from the reference's costs the structure line,
    and the other cases judge what the module computes with the weights it could take. The
    module's tensors are found by ``walk_module`` and copied into directly.
    """
    import torch

    own = dict(walk_module(module)["state_dict"])
    loaded = set()
    with torch.no_grad(), torch._C.DisableTorchFunction():
        for key, tensor in own.items():
            value = state.get(key)
            if value is not None and _shape(tensor) == _shape(value):
                torch.Tensor.copy_(tensor, value)
                loaded.add(key)
    return sorted({*(k for k in own if k not in loaded), *(k for k in state if k not in loaded)})


def run_graded(target, args: list, kwargs: dict, gradients: list[str] | None, seed: int, module=None,
               inputs: list[int] | None = None) -> tuple:
    """Call ``target`` as a graded case does, here and in the harness alike: ``(answer, (args, kwargs)
    as the callee received them)``.

    ``gradients is None``: a plain call without autograd. Otherwise (a training-mode case) every
    floating-point result is followed by gradients: for each result in turn (one, or each item of a
    returned tuple), the gradients of ``(probe * result).sum()``, for a probe drawn from ``seed``, with
    respect to the floating-point arguments (those at ``inputs``, if given) and to the parameters named
    in ``gradients``: zeros where no gradient arrives (something detached, cut with ``.data`` or run
    under ``no_grad``), ``None`` for a parameter the module lacks. The answer is ``(result, gradients
    ...)``, or ``(*results, gradients through the first, through the second, ...)`` for a tuple. The
    parameters are ``module``'s when ``target`` is one of its methods or submodules, else ``target``'s
    own, found by ``walk_module``.
    """
    import torch

    if gradients is None:
        with torch.no_grad():
            return target(*args, **kwargs), (args, kwargs)
    chosen = range(len(args)) if inputs is None else inputs
    leaves = [a.detach().clone().requires_grad_() if i in chosen and isinstance(a, torch.Tensor)
              and a.is_floating_point() else None for i, a in enumerate(args)]
    # The callee gets a non-leaf copy, as it would in a model (whether it changes it is checked apart).
    given = [a if leaf is None else leaf.clone() for a, leaf in zip(args, leaves)]
    output = target(*given, **kwargs)
    many = isinstance(output, tuple)
    outputs = output if many else (output,)
    if not any(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outputs):
        return output, (given, kwargs)
    owner = target if module is None else module
    parameters = dict(walk_module(owner)["parameters"]) if isinstance(owner, torch.nn.Module) else {}
    wanted = [leaf for leaf in leaves if leaf is not None] + [parameters.get(n) for n in gradients]
    active = [t for t in wanted if t is not None and t.requires_grad]
    grads: list = []
    for i, out in enumerate(outputs):
        if not (isinstance(out, torch.Tensor) and out.is_floating_point()):
            continue
        found: dict[int, torch.Tensor] = {}
        if out.requires_grad and active:
            probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 7919 * i)).to(out.dtype)
            # A scalar, not grad_outputs=probe: that path imports sympy, seconds on a worker's first call.
            got = torch.autograd.grad((probe * out).sum(), active, allow_unused=True, retain_graph=True)
            found = {id(t): g for t, g in zip(active, got) if g is not None}
        grads += [None if t is None else found.get(id(t), torch.zeros_like(t)) for t in wanted]
    detached = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outputs)
    return (*detached, *grads), (given, kwargs)


class Generators:
    """Seeds torch's, Python's and NumPy's global generators with ``seed`` on entry; on exit keeps
    their states in ``after`` (what the harness compares with the states of that seed: a call that
    drew random numbers or reseeded a generator changed them) and puts back the states found on entry.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.after: tuple = ()

    def __enter__(self) -> Generators:
        import random

        import numpy
        import torch

        self._saved = (torch.get_rng_state(), random.getstate(), numpy.random.get_state())
        torch.default_generator.manual_seed(self.seed)
        random.seed(self.seed)
        numpy.random.seed(self.seed % 2**32)
        return self

    def __exit__(self, *exc) -> None:
        import random

        import numpy
        import torch

        self.after = generator_states(torch.get_rng_state(), random.getstate(), numpy.random.get_state())
        torch.set_rng_state(self._saved[0])
        random.setstate(self._saved[1])
        numpy.random.set_state(self._saved[2])


def generator_states(torch_state, python_state, numpy_state) -> tuple:
    """``(torch, Python, NumPy)`` generator states as three plain tensors (what crosses the wire)."""
    import numpy
    import torch

    version, words, gauss = python_state
    _, keys, pos, has_gauss, _ = numpy_state
    return (torch_state.clone(), torch.from_numpy(numpy.array([*words, gauss is not None], dtype=numpy.int64)),
            torch.from_numpy(numpy.concatenate([keys.astype(numpy.int64), numpy.array([pos, has_gauss])])))


def _attribute(obj, name: str):
    """``obj.name`` for the answer, or what stands for it when there is none."""
    try:
        return getattr(obj, name)
    except Exception:  # noqa: BLE001 - a missing attribute, or a property that raises
        return Unsupported(f"no attribute `{name}`")


def answer(target, request: dict, args: list, kwargs: dict, construct: list | None, state: dict | None,
           classes: dict) -> tuple:
    """What a request asks of ``target`` (the answer in the worker, the reference in the harness):
    ``(value, structures or None, names of weights that did not fit)``.

    A ``structure`` request builds ``target`` with each argument tuple of ``args``: the structures, and
    as value the initial tensors named in ``request["init"]`` (one list per build). A ``measure`` builds it
    (seeded) and turns it into data (``MEASURES``). Otherwise the module built with ``construct`` gets
    ``state`` (``load_fitting``), is converted to float64 (``double``) and put in training or eval mode;
    then ``target``, the module or its ``method``, is called on the case's arguments (``run_graded``), or
    run by a ``driver``. With ``watch``, the value is ``(answer, facts)``: the arguments after the call,
    the generators' states after it (``Generators``) and the module's attributes named in ``keep``.
    """
    import torch

    seed = request["seed"]
    if request.get("structure"):  # the module as built by each argument tuple, no weights loaded
        builds = args[:MAX_BUILDS]
        names = request.get("init") or [[] for _ in builds]
        modules = [target(*b) for b in builds]
        return (tuple(initial_values(m, list(n)) for m, n in zip(modules, names)),
                [describe_structure(m) for m in modules], [])
    if request.get("measure") is not None:  # the object as built is the answer, turned into data

        def build(s: int):
            torch.default_generator.manual_seed(s)
            return target(*construct)

        return MEASURES[request["measure"]](build, seed), None, []
    watch = Generators(seed) if request.get("watch") else None
    built, unloaded, received = None, [], None
    if construct is not None:
        target = built = target(*construct)
    if request.get("driver") is not None:  # the answer is called by a fixed procedure
        with watch or _Nothing():
            result = DRIVERS[request["driver"]](target, args, classes)
    else:
        if built is not None:
            unloaded = [str(k)[:MAX_NAME_CHARS] for k in load_fitting(built, state or {})]
            if request.get("double"):
                torch.nn.Module.double(built)
            built.train(bool(request.get("train")))
            if request.get("method"):  # a method or submodule of what was built is called
                target = getattr(built, str(request["method"]))
        with watch or _Nothing(), contextlib.ExitStack() as marked:
            for mark in request.get("marked") or ():
                marked.enter_context(marks(str(mark))[1](int(request["mark_key"])))
            result, received = run_graded(target, args, kwargs, request.get("gradients"), seed, built,
                                          request.get("inputs"))
    if request.get("attributes"):  # a class exercise: its instance's attributes are the answer
        result = tuple(getattr(result, a) for a in request["attributes"])
    if watch is not None:
        after = None
        if received is not None:
            given, named = received
            after = (tuple(a if isinstance(a, torch.Tensor) else None for a in given),
                     tuple(named[k] if isinstance(named[k], torch.Tensor) else None for k in sorted(named)))
        kept = tuple(_attribute(built, str(a)) for a in request.get("keep") or ())
        result = (result, (after, watch.after, kept))
    return result, None, unloaded


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


MAX_DESCRIPTION_DEPTH = 6


def build_module_arg(tree, classes: dict | None = None, depth: int = 0):
    """A module described by a case, built here: ``{"module": "scale", "factor": f}`` is the
    dropout-like stand-in ``_Scale``; ``{"module": "Name", **kwargs}`` is ``classes["Name"](**kwargs)``,
    its keyword values built the same way (a description may nest others). ``classes`` holds the
    reference's objects: the prerequisites in the worker, ``tfm_solution`` in the harness, so both
    sides build the same sublayers from the same description. Tuples are built item by item;
    anything else is returned as it is.
    """
    if depth > MAX_DESCRIPTION_DEPTH:
        raise ValueError("module description nested too deep")
    if isinstance(tree, dict) and "module" in tree:
        name = tree["module"]
        if name == "scale":
            return _Scale(float(tree["factor"]))
        if not isinstance(name, str) or name not in (classes or {}):
            raise ValueError(f"unknown module argument {str(name)[:MAX_NAME_CHARS]!r}")
        return classes[name](**{str(k): build_module_arg(v, classes, depth + 1) for k, v in tree.items()
                                if k != "module"})
    if isinstance(tree, tuple):
        return tuple(build_module_arg(t, classes, depth + 1) for t in tree)
    return tree


def matrices(model) -> tuple:
    """The parameters of ``model`` with more than one dimension, as built (found by ``walk_module``)."""
    return tuple(p.detach().clone() for _, p in walk_module(model)["parameters"] if len(_shape(p)) > 1)


def xavier_draws(build, seed: int) -> tuple:
    """A ``measure="xavier"`` case: ``(the matrices of build(seed), whether build(seed + 1) gave the same
    ones)``: initial weights must be drawn from the generator as the caller seeded it, so two seeds give
    two models; a function that reseeds the generator itself gives one model whatever the caller did."""
    import torch

    first, second = matrices(build(seed)), matrices(build(seed + 1))
    same = len(first) == len(second) and all(_shape(a) == _shape(b) and torch.equal(a, b)
                                             for a, b in zip(first, second))
    return first, same


MEASURES = {"xavier": xavier_draws}
"""What a ``Case.measure`` turns the object built by ``build(seed)`` into before it crosses: plain data only."""
