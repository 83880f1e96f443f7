"""The widget toolkit every chapter reuses: controls that flip through precomputed frames.

A static website has no Python kernel, so a control cannot call back into Python there.
What does work without a kernel is a link between two widget attributes made in the
browser (``widgets.jslink``). So a visualization is built as

    control (slider, toggle buttons, dropdown)  --jslink-->  Stack of frames

where every frame was rendered beforehand, one per control value. The notebook stores the
widget state when it is executed, and the page replays it. In a running kernel the same
widget works unchanged; ``live=True`` instead renders each frame on demand, with whatever
function the student has defined at that moment.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets
from matplotlib.figure import Figure

from .language import localize

#: A rendered frame: PNG bytes, an HTML string, or any widget.
Frame = bytes | str | widgets.Widget

#: Low resolution keeps a notebook with dozens of frames well under a few megabytes.
FRAME_DPI = 72


def figure_png(fig: Figure, dpi: int = FRAME_DPI) -> bytes:
    """Render ``fig`` to PNG bytes.

    The PNG carries no software-version text, so rendering the same figure twice gives the
    same bytes and regenerating a notebook leaves it unchanged.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


def as_widget(frame: Frame) -> widgets.Widget:
    """Wrap a rendered frame in the widget that shows it."""
    if isinstance(frame, widgets.Widget):
        return frame
    if isinstance(frame, bytes):
        return widgets.Image(value=frame, format="png")
    if isinstance(frame, str):
        return widgets.HTML(value=frame)
    raise TypeError(f"a frame must be PNG bytes, an HTML string or a widget, not {type(frame).__name__}")


def control_index_trait(control: widgets.Widget) -> str:
    """The attribute of ``control`` that holds the position of the chosen value.

    Selection widgets (``SelectionSlider``, ``ToggleButtons``, ``Dropdown``) expose it as
    ``index``; an ``IntSlider`` over ``0 .. n-1`` is its own index.
    """
    if "index" in control.trait_names():
        return "index"
    if isinstance(control, (widgets.IntSlider, widgets.BoundedIntText)):
        return "value"
    raise TypeError(f"{type(control).__name__} has no integer position to link frames to")


class FramePlayer(widgets.VBox):
    """A control above a stack of frames, one frame per control position.

    Args:
        control: a selection widget with ``n`` options, or an ``IntSlider`` over ``0 .. n-1``.
        render: maps a position ``i`` in ``0 .. n-1`` to a frame (PNG bytes, HTML or a widget).
        n_frames: how many positions the control has.
        header: widgets shown above the control (a title, a status message).
        live: render each frame when it is first shown, in the running kernel, instead of
            all of them now. Live players need a kernel: on a static page only the frames
            already shown exist, so the notebooks of the course keep the default.

    Attributes:
        control, stack: the two linked widgets; ``stack.selected_index`` follows the control.
        link: the browser-side link (``None`` for live players, which use a Python callback).
    """

    def __init__(
        self,
        control: widgets.Widget,
        render: Callable[[int], Frame],
        n_frames: int,
        *,
        header: Sequence[widgets.Widget] = (),
        live: bool = False,
    ) -> None:
        if n_frames < 1:
            raise ValueError(f"a player needs at least one frame, got n_frames={n_frames}")
        self.control = control
        self._trait = control_index_trait(control)
        self._render = render
        start = getattr(control, self._trait)
        if live:
            frames = [widgets.HTML("") for _ in range(n_frames)]
            frames[start] = as_widget(render(start))
            self._rendered = {start}
        else:
            frames = [as_widget(render(i)) for i in range(n_frames)]
            self._rendered = set(range(n_frames))
        self.stack = widgets.Stack(children=frames, selected_index=start)
        if live:
            self.link = None
            control.observe(self._on_change, names=self._trait)
        else:
            self.link = widgets.jslink((control, self._trait), (self.stack, "selected_index"))
        super().__init__(children=[*header, control, self.stack])
        localize(self)  # the labels in the notebook's language (language.py)

    def _on_change(self, change: dict[str, Any]) -> None:
        """Live path: draw the newly chosen frame with the current function, then show it."""
        i = change["new"]
        if i not in self._rendered:
            children = list(self.stack.children)
            children[i] = as_widget(self._render(i))
            self.stack.children = children
            self._rendered.add(i)
        self.stack.selected_index = i
