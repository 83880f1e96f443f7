"""Draw with the student's own function when it works, with the reference when it does not,
and say truthfully which one drew.

Every visualization of the course takes the student's function as an argument and passes it
through :func:`resolve`, which picks what to draw with and writes the line shown above the
widget (:meth:`Resolved.banner`). A chapter's widget module needs nothing else::

    from .student import resolve

    def _probe(fn):                     # a small fixed input every correct answer treats alike
        return fn(torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(7)))

    def my_widget(student_fn=None):
        used = resolve(student_fn, reference_fn, _probe, "reference_fn_name")
        ...draw every frame with used.fn...
        return FramePlayer(control, render, n, header=[used.banner()])

and the notebook cell is ``my_widget(the_students_function)``. The message then fits the place
where the reader sees it:

- **preview**: ``make chapters`` executes the *solution* notebook, whose exercise cells still
  hold the course's own answer between nbgrader's solution markers. The figures stored then are
  what the website and a freshly released student notebook show, so the message says that they
  were drawn with the reference and that running the cell redraws them with the student's code;
- **ok** / **differs**: in a live kernel with the student's answer, "your own", with a warning
  when its results disagree with the reference (seeing one's own bug is the point);
- **stub** / **error**: the student's answer is still ``raise NotImplementedError()`` or it
  crashed; the widget falls back to the reference and says why;
- **reference**: no student function was given (``None``, or the reference itself).

In a graded release whose package does not hold the reference yet (it raises ``NotReleased``), the
student's answer is used as it is; while it is a stub, :func:`resolve` raises ``NotReleased`` and the
cell shows the stored figure with one line (:mod:`tfm_solution.viz.stored`).

How the preview is recognised: the source of the cell that defined the function still contains
nbgrader's ``### BEGIN SOLUTION`` marker. ``nbgrader generate_assignment`` removes that marker
from every released notebook, so a student's function can never carry it.
"""

from __future__ import annotations

import html
import inspect
import linecache
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import torch

from .._release import RELEASED_THROUGH, NotReleased
from .stored import LAST_CHAPTER, unwritten

#: The nbgrader marker that opens a solution region; it exists only in the course's solution notebooks.
SOLUTION_MARKER = "### BEGIN SOLUTION"

_COLOURS = {"ok": "#1b7f3b", "reference": "#555555", "preview": "#555555", "differs": "#b45309"}

#: What the reader is told, by purpose (a widget draws, a check cell checks) and status.
_MESSAGES = {
    "draw": {
        "reference": "Drawn with the reference `{name}`.",
        "stub": "Your `{name}` is still a stub, so this shows the reference. Fill in the exercise and run this "
                "cell again.",
        "error": "Your `{name}` raised {error}. This shows the reference instead.",
        "preview": "Preview drawn with the reference `{name}`. Run this cell in your notebook and it is redrawn "
                   "with your own `{name}`.",
        "ok": "Drawn with your own `{name}`.",
        "differs": "Drawn with your own `{name}`, whose results differ from the reference on a test input: look "
                   "for the difference.",
    },
    "check": {
        "reference": "Checked with the reference `{name}`.",
        "stub": "Your `{name}` is still a stub, so the cells below run the reference `{name}`. Fill in the "
                "exercise and run them again.",
        "error": "Your `{name}` raised {error}. The cells below run the reference `{name}` instead.",
        "preview": "Here the cells below ran the reference `{name}`; in your notebook they run your own.",
        "ok": "The cells below run your own `{name}`.",
        "differs": "The cells below run your own `{name}`, whose results differ from the reference on a test "
                   "input: look for the difference.",
    },
}


@dataclass(frozen=True)
class Resolved:
    """The function a widget draws with, and why.

    Attributes:
        fn: the function to call.
        source: ``"student"`` (the student's own code draws) or ``"reference"`` (the course's
            code draws: the reference, or the course's solution in a preview).
        status: ``"ok"`` (student's function matches the reference), ``"differs"`` (it runs but
            disagrees), ``"stub"`` (not implemented yet), ``"error"`` (it raised), ``"preview"``
            (the course's solution drew, when the notebooks were generated), or ``"reference"``
            (no student function was given).
        message: one sentence for the reader.
    """

    fn: Callable[..., Any]
    source: str
    status: str
    message: str

    @property
    def yours(self) -> bool:
        """Whether the figure shows the student's own results (so a label may say "your ...")."""
        return self.source == "student"

    def banner(self) -> widgets.HTML:
        """The message as a coloured line to place above the widget."""
        colour = _COLOURS.get(self.status, "#b91c1c")
        return widgets.HTML(f'<div style="color:{colour};margin:2px 0 6px 0">{html.escape(self.message)}</div>')


def fixed_weights(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``module`` with every parameter drawn from ``seed`` in the order of its name, uniform in
    ``±1/sqrt(last dim)``: any two modules whose parameters have the same names and shapes get the same
    weights, however they were built. A probe needs no reference to fix its weights (in a graded release
    the reference may not be released yet). Returns ``module``, in evaluation mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, parameter in sorted(module.named_parameters()):
            bound = parameter.shape[-1] ** -0.5 if parameter.dim() else 1.0
            parameter.copy_((torch.rand(parameter.shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound)
    return module.eval()


def _close(a: Any, b: Any) -> bool:
    """Whether two results (tensors, or tuples of tensors) agree to float32 tolerance."""
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5)
    return False


def _code_objects(obj: Any) -> list[Any]:
    """The code objects of a function, or of the methods a class defines itself."""
    if inspect.isclass(obj):
        members = []
        for member in vars(obj).values():
            if isinstance(member, staticmethod | classmethod):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            members.append(member)
    else:
        members = [obj]
    return [m.__code__ for m in members if hasattr(m, "__code__")]


def is_course_solution(obj: Any) -> bool:
    """Whether ``obj`` was defined by a solution cell of the course (see the module docstring).

    IPython keeps the text of every executed cell in ``linecache`` under the cell's file name,
    which is the ``co_filename`` of the code defined in it.
    """
    return any(
        SOLUTION_MARKER in "".join(linecache.getlines(code.co_filename)) for code in _code_objects(obj)
    )


def _not_released(reference: Callable[..., Any], probe: Callable[[Callable[..., Any]], Any]) -> NotReleased | None:
    """The ``NotReleased`` a graded release's stub of ``reference`` raises; ``None`` where it is released."""
    if RELEASED_THROUGH >= LAST_CHAPTER:
        return None
    stub = vars(reference).get("__new__", reference.__init__) if inspect.isclass(reference) else reference
    own = getattr(inspect.unwrap(getattr(stub, "__func__", stub)), "__code__", None)
    if own is not None and "NotReleased" in own.co_names:  # the reference is a stub itself: its own chapter
        chapter = [c for c in own.co_consts if type(c) is int]
        if chapter:
            return NotReleased(getattr(reference, "__name__", ""), chapter[-1])
    try:
        with torch.random.fork_rng(devices=[]):
            probe(reference)
    except NotReleased as error:
        return error
    except Exception:  # noqa: BLE001 - the reference ran: it is released
        return None
    return None


def resolve(
    candidate: Callable[..., Any] | None,
    reference: Callable[..., Any],
    probe: Callable[[Callable[..., Any]], Any],
    name: str,
    purpose: str = "draw",
) -> Resolved:
    """Choose the function a widget draws with, and the message that says which one it is.

    Args:
        candidate: the student's function or class, or ``None`` to draw with the reference.
        reference: the reference implementation.
        probe: calls a function on a small fixed input and returns its result (a tensor or a
            tuple of tensors), to compare the candidate with the reference.
        name: the function's name, for the message.
        purpose: ``"draw"`` for a widget, ``"check"`` for the cells that check a claim in code
            (the message then speaks of the checks instead of a figure).

    Returns:
        A :class:`Resolved`; draw with its ``fn`` and show its ``banner()`` above the widget.
    """
    text = _MESSAGES[purpose]
    if candidate is None or candidate is reference:
        return Resolved(reference, "reference", "reference", text["reference"].format(name=name))
    try:
        got = probe(candidate)
    except NotImplementedError:
        missing = _not_released(reference, probe)
        if missing is not None:  # a graded release: no reference to fall back on; the stored figure shows
            raise unwritten(name, missing.chapter) from None
        return Resolved(reference, "reference", "stub", text["stub"].format(name=name))
    except Exception as error:  # noqa: BLE001 - any failure of student code means: fall back
        if _not_released(reference, probe) is not None:
            raise  # nothing to fall back on: the reader's own error, with its traceback
        message = text["error"].format(name=name, error=f"{type(error).__name__}: {error}")
        return Resolved(reference, "reference", "error", message)
    try:
        expected = probe(reference)
    except NotReleased:  # a graded release before the reference's deadline: the reader's own answer, unchecked
        return Resolved(candidate, "student", "ok", text["ok"].format(name=name))
    agrees = _close(got, expected)
    if agrees and is_course_solution(candidate):
        return Resolved(reference, "reference", "preview", text["preview"].format(name=name))
    if agrees:
        return Resolved(candidate, "student", "ok", text["ok"].format(name=name))
    return Resolved(candidate, "student", "differs", text["differs"].format(name=name))
