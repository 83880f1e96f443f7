"""A graded release's cells while an answer they need is not released yet: the stored figure, and one line.

In a graded release (``python -m autograder release``) the answers of later chapters are stubs that call the
student's own answer of that name (``NotReleased.stand_in``), or raise ``NotReleased`` while there is none. A
figure, a widget or a check of such a chapter runs the student's own answer instead
(:func:`tfm_solution.viz.student.resolve`); while that answer is still a stub, or when the cell needs an
answer of a chapter the student does not write here (the course model needs chapter 8's ``make_model``),
the cell shows the figure the chapter's committed notebook stored for it, with one line in place of a
traceback::

    Stored figure: write `DecoderLayer` to make this figure live.

The stored figures travel in the release's package (``assets/stored_figures.json``, written by the
release's build (:mod:`tfm_solution._stored`) from the committed notebooks' outputs: a PNG output, or the first image of a widget's
saved state), keyed by the cell's source, which IPython records before it runs the cell. The line is an
IPython custom exception handler for ``NotReleased``, installed when a graded release's package is
imported in a kernel; the self-learner's package holds every answer and installs nothing.
"""

from __future__ import annotations

import sys

from .._release import RELEASED_THROUGH, NotReleased
from .._stored import stored_figure

LAST_CHAPTER = 12

#: The lines a reader sees, by whether a stored figure is shown and whether the answer is the reader's to write.
MESSAGES = {
    (True, True): "Stored figure: write `{name}` to make this figure live.",
    (True, False): "Stored figure: it needs `{name}`, the answer of chapter {chapter:02d}, released after that "
                   "chapter's deadline.",
    (False, True): "Write `{name}` to run this cell: its reference is released after chapter {chapter:02d}'s "
                   "deadline.",
    (False, False): "This cell needs `{name}`, the answer of chapter {chapter:02d}, released after that "
                    "chapter's deadline.",
}


def unwritten(name: str, chapter: int) -> NotReleased:
    """The exception of a cell that needs the reader's own ``name`` (still a stub) where no reference is released."""
    return NotReleased(name, chapter, yours=True)


def message(error: NotReleased, figure: bool) -> str:
    """The one line shown for ``error``, in the notebook's language."""
    from .language import said

    return said(MESSAGES[(figure, error.yours)].format(name=error.name, chapter=error.chapter))


def _current_source(shell) -> str:
    try:
        return shell.history_manager.input_hist_raw[-1]
    except (AttributeError, IndexError):
        return ""


def _handler(shell, etype, value, tb, tb_offset=None) -> list[str]:
    """The cell stops (its reply is an error, so a notebook run by nbclient or nbval stops there too), and shows
    what it stored with the line in place of the traceback (IPython prints nothing else for a custom exception)."""
    from IPython.display import Image, display

    png = stored_figure(_current_source(shell))
    if png is not None:
        display(Image(data=png, format="png"))
    line = message(value, png is not None)
    print(line, file=sys.stderr)
    return [line]


def install() -> bool:
    """Show ``NotReleased`` as the stored figure and one line, in this IPython kernel; whether it was installed."""
    if RELEASED_THROUGH >= LAST_CHAPTER:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    shell.set_custom_exc((NotReleased,), _handler)
    return True
