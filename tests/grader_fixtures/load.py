"""A busy machine for the grader's self-tests: one spinning process per core.

Correct answers must keep full marks however loaded the machine is: the grader's limits count
a worker's own CPU and waiting time, never the time it waits for a CPU (``sandbox.OwnTime``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

#: Each spinner stops by itself after this many seconds, should the test that started it be killed.
MAX_SECONDS = 1200


@contextlib.contextmanager
def busy_cores(per_core: int = 1, cores: list[int] | None = None) -> Iterator[list[int]]:
    """``per_core`` spinning processes for each core of ``cores`` (default: every core this process may
    use), each pinned to its core; yields their PIDs and kills them on the way out."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    # Pinned to its core; dies with the test process (PR_SET_PDEATHSIG), or after MAX_SECONDS at most.
    spin = ("import ctypes, os, time\nctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
            f"os.sched_setaffinity(0, {{int(os.environ['CORE'])}})\nend = time.monotonic() + {MAX_SECONDS}\n"
            "while time.monotonic() < end:\n    pass\n")
    spinners = [subprocess.Popen([sys.executable, "-c", spin], env={"CORE": str(core), "PATH": os.environ["PATH"]},
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for core in cores for _ in range(per_core)]
    try:
        yield [p.pid for p in spinners]
    finally:
        for process in spinners:
            process.kill()
            process.wait()
