"""Run ``python -m tfm_solution train ...`` and die by SIGKILL at a chosen moment (fault injection).

Usage: ``python _crash_train.py FAULT ARGS...`` where FAULT is
  ``none``                 no fault;
  ``after:SECONDS``        a timer kills the process after SECONDS;
  ``call:NAME:N``          killed on the N-th call of ``NAME`` while a checkpoint is being saved,
                           NAME one of save_model (inside the temporary folder), torch.save (weights
                           written, trainer state not), atomic_write_text (checkpoint complete, pointers
                           not yet moved), replace (a pointer's temporary file written, not renamed).
"""

import os
import signal
import sys
import threading
import time

from tfm_solution import checkpoint
from tfm_solution.cli import main


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_on_call(owner: object, attr: str, n: int) -> None:
    original = getattr(owner, attr)
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == n:
            die()
        return original(*args, **kwargs)

    setattr(owner, attr, wrapper)


fault, args = sys.argv[1], sys.argv[2:]
if fault.startswith("after:"):
    delay = float(fault.split(":")[1])
    threading.Thread(target=lambda: (time.sleep(delay), die()), daemon=True).start()
elif fault.startswith("call:"):
    _, name, n = fault.split(":")
    owner = {"save_model": checkpoint, "torch.save": checkpoint.torch, "atomic_write_text": checkpoint,
             "replace": checkpoint.os}[name]
    kill_on_call(owner, name.split(".")[-1], int(n))
sys.exit(main(args))
