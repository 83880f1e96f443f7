"""The grader's limits measure the submission, and its feedback names the cause of a failure to load.

Time limits count a worker's own time (``sandbox.OwnTime``: its CPU time plus the time it chose to
wait), never the time it waited for a CPU that other processes kept busy. The memory limit counts
what the submission allocates beyond what the worker holds after importing torch. (Every chapter's
solution at full marks on busy cores with a CUDA-sized reservation: see
``test_grader_submissions.test_solutions_score_full_marks_through_the_command_line``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.cases import graded_cases
from autograder.grade import Report, grade_path
from autograder.registry import by_id
from autograder.sandbox import POLL_S, OwnTime
from tests.grader_fixtures import ATTENTION, notebook, write
from tests.grader_fixtures.load import busy_cores


def _attention_only(tmp_path: Path, attention: str) -> Report:
    return grade_path(write(notebook(attention=attention), tmp_path), only="ch03.attention")


def _feedback(report: Report) -> str:
    return "\n".join(t.output for t in report.tests if t.name.startswith("ch03.attention "))


@pytest.mark.fast
def test_own_time_counts_cpu_and_chosen_waiting_but_not_waiting_for_a_busy_cpu():
    """A process spinning on a core that three others keep busy gets about a quarter of the wall
    clock, and that is its own time; a process that sleeps spends all of it by its own choice."""
    core = min(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    sleep = subprocess.Popen([sys.executable, "-c", "import time\nprint(flush=True)\ntime.sleep(60)"],
                             stdout=subprocess.PIPE)
    try:
        with busy_cores(per_core=3, cores=[core]):
            sleep.stdout.readline()  # started: asleep from now on
            clocks = {"spin": OwnTime(spin.pid), "sleep": OwnTime(sleep.pid)}
            start = time.monotonic()
            while time.monotonic() - start < 2.0:
                time.sleep(POLL_S)
                for clock in clocks.values():
                    clock.sample()
            wall = time.monotonic() - start
            own = {name: clock.sample() for name, clock in clocks.items()}
    finally:
        for process in (spin, sleep):
            process.kill()
            process.wait()
    assert 0 < own["spin"] < 0.5 * wall, (own, wall)  # a wall clock would say `wall`
    assert own["sleep"] > 0.8 * wall, (own, wall)


@pytest.mark.slow
def test_a_failed_import_says_which_import_and_why(tmp_path):
    report = _attention_only(tmp_path / "reference", "from tfm_solution.attention import attention\n")
    text = _feedback(report)
    assert report.score == 0
    assert "`attention` is not defined after running your code: an import failed" in text
    assert "line 1: `from tfm_solution.attention import attention`" in text
    assert "`tfm_solution` is not available while grading: an answer may not import the course's reference" in text
    assert "KeyError" not in text and text.count("an import failed") == len(graded_cases(by_id("ch03.attention"), 0))
    report = _attention_only(tmp_path / "missing", "import torch_extras_nobody_has\n" + ATTENTION)
    text = _feedback(report)
    assert "an import failed" in text and "ModuleNotFoundError" in text and "torch_extras_nobody_has" in text
    assert "not allowed" not in text


@pytest.mark.slow
def test_out_of_memory_while_loading_is_told_apart_from_a_missing_answer(tmp_path):
    """Allocating 16 GB at load time exceeds the budget (2 GB beyond the worker's own imports):
    the feedback says the code ran out of memory while loading, not merely that the name is missing.
    The same answer with a 256 MB table at load time stays within the budget and earns full marks."""
    report = _attention_only(tmp_path / "hog", "table = bytearray(16 * 2**30)\n" + ATTENTION)
    text = _feedback(report)
    assert report.score == 0
    assert "ran out of memory while it was loading" in text and "MemoryError" in text
    assert "an import failed" not in text
    report = _attention_only(tmp_path / "fits", "table = bytearray(256 * 2**20)\n" + ATTENTION)
    assert report.score == 6.0, _feedback(report)
