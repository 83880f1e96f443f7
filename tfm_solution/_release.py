"""The chapters whose answers this package holds: 1..RELEASED_THROUGH. A graded release holds those released so
far (``python -m autograder release`` writes this file); later answers are released after their deadlines."""

RELEASED_THROUGH = 12


class NotReleased(NotImplementedError):
    """A chapter's answer this release does not hold yet. A ``NotImplementedError``, as a stub is: the
    widgets and checks then use your own answer, or show the stored figure until you have written it."""

    def __init__(self, name: str, chapter: int) -> None:
        self.name, self.chapter = name, chapter
        super().__init__(f"`{name}` is an exercise of chapter {chapter:02d}, whose reference is released after "
                         f"that chapter's deadline: write `{name}` in your notebook to use your own")
