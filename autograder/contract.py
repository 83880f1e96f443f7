"""An exercise's contract in words: the clauses its statement shows and its visible tests exercise.

Each chapter module declares a ``Contract`` per exercise (``autograder.exercises.shared``). Here it
becomes text: ``clauses`` gives one sentence per clause, keyed (``dtype``, ``gradients``, ``modes``,
``inputs``, ``random``, ``attributes``, ``init`` and the exercise's own rule keys), and ``make chapters``
writes them at the end of the exercise's statement between two HTML comments (``place``), so the text
states what the grader checks and nothing drifts. A visible test exercises each clause and says so
with a comment ``# contract: <key>[, <key> ...]`` (``marked``); the self-tests check both.
"""

from __future__ import annotations

import re

from autograder.exercises.shared import Exercise

START = "<!-- contract: written by make chapters from the exercise's grading module -->"
END = "<!-- end of contract -->"
MARKER = re.compile(r"#\s*contract:\s*([\w\- ,]+)")

_INPUTS = ("every tensor passed in is left as it was, bit for bit: no in-place operation on an argument "
           "(`x -= ...`, `mask.unsqueeze_(1)`, `masked_fill_`), because the caller may still need it")
_RANDOM = "torch's, Python's and NumPy's global random generators are left exactly as they were"


def clauses(exercise: Exercise) -> list[tuple[str, str]]:
    """``(key, sentence)`` for every clause of the exercise's contract, in the order the text shows them."""
    contract = exercise.contract
    if contract is None:
        raise ValueError(f"{exercise.id} has no contract")
    found = [("dtype", contract.dtype)]
    if contract.gradients:
        names = _words(contract.gradients)
        outputs = exercise.return_names
        if not outputs:
            reach = f"gradients reach {names} through the result"
        else:
            reach = f"gradients reach each of {names} through every result that depends on it ({_words(outputs)})"
        found.append(("gradients", f"{reach}: compute with differentiable torch operations (no `.detach()`, "
                                   "`.data`, `torch.no_grad()` or `torch.tensor(...)` on the way); the grader "
                                   "compares them with the reference's"))
    if contract.modes:
        stand_in = (" In training mode every dropout call (`nn.Dropout` or `F.dropout`) is one fixed stand-in, "
                    "the same in your module and in the reference, so dropout must act exactly where the text "
                    "puts it, once, at the rate given;" if exercise.has_dropout else " In training mode")
        found.append(("modes", f"graded in eval mode and in training mode.{stand_in} the output and the gradients "
                               "reaching the inputs and every parameter are compared with the reference's"))
    found.append(("inputs", _INPUTS if contract.pure else contract.pure_text))
    if contract.draws:
        found.append(("random", contract.draws_text))
    else:
        found.append(("random", f"{'apart from dropout, ' if exercise.has_dropout else ''}a call draws no random "
                                f"numbers: {_RANDOM}"))
    if contract.attributes:
        found.append(("attributes", contract.attributes_text))
    if contract.init:
        found.append(("init", contract.init))
    found += list(contract.rules)
    return found


def _words(names: tuple[str, ...]) -> str:
    """The names in backticks, joined by commas and a last "and"."""
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def markdown(exercise: Exercise) -> str:
    """The contract as the statement shows it, between ``START`` and ``END``."""
    bullets = "\n".join(f"- **{key}**: {text}." for key, text in clauses(exercise))
    return (f"{START}\n**Contract.** Besides the values, the grader checks each point below on every "
            f"submission, with fresh inputs; the visible tests exercise each one.\n\n{bullets}\n{END}")


def with_contract(statement: str, exercise: Exercise) -> str:
    """``statement`` (an exercise's Markdown) ending with its current contract, replacing an older one."""
    if START in statement:
        head, rest = statement.split(START, 1)
        if END not in rest:
            raise ValueError(f"{exercise.id}: the contract in the statement has no end marker")
        statement = (head + rest.split(END, 1)[1]).rstrip()
    return f"{statement.rstrip()}\n\n{markdown(exercise)}"


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def statement_index(cells: list, exercise: Exercise) -> int | None:
    """The index of the Markdown cell that states the exercise: the last one before its answer cell."""
    answer = next((i for i, c in enumerate(cells) if _grade_id(c) == exercise.solution_grade_id), None)
    if answer is None:
        return None
    return next((i for i in range(answer - 1, -1, -1) if cells[i].get("cell_type") == "markdown"), None)


def visible_cells(cells: list, exercise: Exercise) -> list:
    """The code cells between the exercise's answer cell and its graded cell: its visible tests."""
    ids = [_grade_id(c) for c in cells]
    if exercise.solution_grade_id not in ids or exercise.test_grade_id not in ids:
        return []
    start, end = ids.index(exercise.solution_grade_id), ids.index(exercise.test_grade_id)
    return [c for c in cells[start + 1:end] if c.get("cell_type") == "code"]


def marked(cells: list) -> set[str]:
    """The clause keys that ``# contract: ...`` comments in these cells name."""
    found: set[str] = set()
    for cell in cells:
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        for match in MARKER.finditer(source):
            found.update(k.strip() for k in match.group(1).split(",") if k.strip())
    return found


def place(cells: list, exercise: Exercise) -> list[str]:
    """Write the exercise's contract into its statement cell (in place); the problems found."""
    index = statement_index(cells, exercise)
    if index is None:
        return [f"{exercise.id}: no Markdown cell states the exercise before its answer cell"]
    cells[index]["source"] = with_contract(cells[index]["source"], exercise)
    return []
