"""Bounded feedback: what a student's code says reaches the results fenced, and never too much.

Results are Markdown. Text that the student controls is shown as code, never as Markdown:
longer texts (exception messages, printed output, errors while loading) inside a fenced code
block (``fenced``), short ones inside a line (``code``: names of parameters, buffers, keys,
classes, a failing import), each with a fence longer than any run of backticks in the text,
so no heading, link, image or HTML in it is rendered and it cannot close its fence early; a
name that goes between the backticks of a template (``name``) carries no backtick and no line
break. Each such text is cut to ``TEXT_CAP`` characters, each test's feedback to ``TEST_CAP``
and a whole run's to ``RUN_CAP``: however much a submission prints or raises, the results stay
small.
"""

from __future__ import annotations

import re
import unicodedata

TEXT_CAP = 2000  # characters of one student-controlled text
TEST_CAP = 8000  # characters of one test's feedback
RUN_CAP = 60_000  # characters of all the feedback of one run
_CUT = "\n[... truncated ...]"


# C0 and C1 control characters but newline and tab (an ANSI escape redraws a terminal), DEL, and the
# bidirectional overrides and isolates (they reorder what a reader sees, as in "Trojan Source").
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(text: str) -> str:
    """``text`` without the characters that act instead of showing (``_CONTROLS``): safe for a terminal, a
    file, Markdown and HTML alike. Every student byte is cleaned before it leaves the grader."""
    return _CONTROLS.sub("", str(text))


def fenced(text: str, cap: int = TEXT_CAP) -> str:
    """``text`` (student-controlled) as an inert Markdown code block, at most ``cap`` characters of it."""
    text = clean(text)
    if len(text) > cap:
        text = text[:cap] + _CUT
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def code(text: str, cap: int = 300) -> str:
    """``text`` (student-controlled) as an inert Markdown code span on one line, at most ``cap`` characters of it.

    Line breaks become spaces (a code span cannot hold one: the next line could start a heading);
    the fence is one backtick longer than the longest run in the text, and spaces pad a text that
    starts or ends with a backtick, as CommonMark asks.
    """
    text = " ".join(clean(text)[:cap].splitlines()) + ("..." if len(str(text)) > cap else "")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def name(text: str) -> str:
    """A student-controlled name (of a parameter, buffer, submodule, ``state_dict`` key) as it may stand between
    the single backticks of a feedback template: inside a code span only a backtick (which would close it) and a
    line break (which could start a heading on the next line) are not inert, so each of those, each other control
    character and each backslash is written as a ``\\uXXXX`` escape; every name the reference has is unchanged."""
    return "".join(f"\\u{ord(c):04x}" if c in "`\\" or unicodedata.category(c) in ("Cc", "Zl", "Zp") else c
                   for c in str(text))


def _cut(output: str, cap: int) -> str:
    """``output`` cut to about ``cap`` characters, closing a code block left open by the cut."""
    if len(output) <= cap:
        return output
    kept, fence = output[:cap], None
    for line in kept.splitlines():
        run = len(line) - len(line.lstrip("`"))
        if fence is None and run >= 3:
            fence = "`" * run
        elif fence is not None and line.strip() == fence:
            fence = None
    return kept + (f"\n{fence}" if fence else "") + _CUT


def bound(tests: list) -> None:
    """Clean each test's name and ``output`` and cut the output to ``TEST_CAP``, the run's to ``RUN_CAP``
    (in place)."""
    left = RUN_CAP
    for test in tests:
        test.name = clean(test.name)
        test.output = _cut(clean(test.output), min(TEST_CAP, max(left, 0)))
        if left <= 0:
            test.output = "[feedback omitted: this run's feedback reached its size limit]"
        left -= len(test.output)
