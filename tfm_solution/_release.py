"""The chapters whose answers this package holds: 1..RELEASED_THROUGH. A graded release holds those released so
far (``python -m autograder release`` writes this file); later answers are released after their deadlines."""

import inspect
import sys
from collections.abc import Callable

RELEASED_THROUGH = 12


class NotReleased(NotImplementedError):
    """A chapter's answer this release does not hold yet. A ``NotImplementedError``, as a stub is: the
    widgets and checks then use your own answer, or show the stored figure until you have written it.
    ``yours``: the answer is in your notebook, still the exercise's stub."""

    def __init__(self, name: str, chapter: int, yours: bool = False) -> None:
        self.name, self.chapter, self.yours = name, chapter, yours
        super().__init__(f"`{name}` is an exercise of chapter {chapter:02d}, whose reference is released after "
                         f"that chapter's deadline: write `{name}` in your notebook to use your own")

    @classmethod
    def stand_in(cls, name: str, chapter: int, defaults: dict | None = None) -> Callable:
        """Your own ``name``, defined in the notebook you are running, called where the package would call the
        reference this release does not hold yet. Raises ``NotReleased`` while you have not written it (not
        defined in the notebook, or still the exercise's stub), or when the call needs more than the exercise
        asked for: an argument the reference has and yours has not, at other than its ``defaults``."""
        own = _notebook_namespace().get(name)
        if not callable(own) or getattr(own, "__module__", None) != "__main__":
            raise cls(name, chapter)

        def call(*args, **kwargs):
            try:
                accepts = inspect.signature(own)
            except ValueError:  # no signature to read: try the call as it is
                accepts = None
            for key in [k for k in kwargs if k in (defaults or {}) and _same(kwargs[k], defaults[k])]:
                if kwargs[key] is None or (accepts is not None and key not in accepts.parameters):
                    del kwargs[key]  # the reference's default: your own default stands for it
            try:
                if accepts is not None:
                    accepts.bind(*args, **kwargs)
            except TypeError:  # a feature of the reference beyond the exercise
                raise cls(name, chapter) from None
            try:
                return own(*args, **kwargs)
            except NotReleased:
                raise
            except NotImplementedError:  # the exercise's stub
                raise cls(name, chapter, yours=True) from None
        return call


def _same(value, default) -> bool:
    try:
        return bool(value is default or value == default)
    except Exception:  # noqa: BLE001 - a tensor, say: not a default
        return False


def _notebook_namespace() -> dict:
    """The running notebook's names (IPython's user namespace), else those of the script run as ``__main__``."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return getattr(shell, "user_ns", None) or vars(sys.modules.get("__main__", sys))
