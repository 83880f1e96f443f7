"""Draw with the student's own function when it works, with the reference when it does not.

Every visualization of the course takes the student's function as an argument. While the
exercise is still a stub (or crashes), the widget falls back to the reference and says so;
when the student's function runs but disagrees with the reference, the widget keeps drawing
the student's results, because seeing one's own bug is the point, and says that too.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import torch


@dataclass(frozen=True)
class Resolved:
    """The function a widget draws with, and why.

    Attributes:
        fn: the function to call.
        source: ``"student"`` or ``"reference"``.
        status: ``"ok"`` (student's function matches), ``"differs"`` (student's function runs
            but disagrees), ``"stub"`` (not implemented yet), ``"error"`` (it raised), or
            ``"reference"`` (no student function was given).
        message: one sentence for the reader.
    """

    fn: Callable[..., Any]
    source: str
    status: str
    message: str

    def banner(self) -> widgets.HTML:
        """The message as a coloured line to place above the widget."""
        colour = {"ok": "#1b7f3b", "reference": "#555555", "differs": "#b45309"}.get(self.status, "#b91c1c")
        return widgets.HTML(f'<div style="color:{colour};margin:2px 0 6px 0">{html.escape(self.message)}</div>')


def _close(a: Any, b: Any) -> bool:
    """Whether two results (tensors, or tuples of tensors) agree to float32 tolerance."""
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5)
    return False


def resolve(
    candidate: Callable[..., Any] | None,
    reference: Callable[..., Any],
    probe: Callable[[Callable[..., Any]], Any],
    name: str,
) -> Resolved:
    """Choose the function a widget draws with.

    Args:
        candidate: the student's function, or ``None`` to draw with the reference.
        reference: the reference implementation.
        probe: calls a function on a small fixed input and returns its result.
        name: the function's name, for the message.
    """
    if candidate is None or candidate is reference:
        return Resolved(reference, "reference", "reference", f"Drawn with the reference `{name}`.")
    try:
        got = probe(candidate)
    except NotImplementedError:
        return Resolved(
            reference,
            "reference",
            "stub",
            f"Your `{name}` is still a stub, so this shows the reference. Fill in the exercise and run this cell again.",
        )
    except Exception as error:  # noqa: BLE001 - any failure of student code means: fall back
        return Resolved(
            reference,
            "reference",
            "error",
            f"Your `{name}` raised {type(error).__name__}: {error}. This shows the reference instead.",
        )
    if _close(got, probe(reference)):
        return Resolved(candidate, "student", "ok", f"Drawn with your own `{name}`.")
    return Resolved(
        candidate,
        "student",
        "differs",
        f"Drawn with your own `{name}`, whose results differ from the reference on a test input: look for the difference.",
    )
