"""Grade every chapter in a fresh environment made by the README's install, whatever torch it brings.

    python scripts/grade_in_fresh_install.py [--python python3.11] [--venv DIR]

A plain ``pip install ".[grade]"`` on Linux resolves torch to its CUDA build (gigabytes, even on a
machine without a GPU): the build that most students' machines, lab machines and Gradescope images
have. This script makes such an environment outside the repository from a copy of the committed
tree, then grades every chapter's solution (full marks expected) and every untouched release (0)
with ``python -m autograder grade``, and prints the command, torch's version and build, each
chapter's scores and the times. It is not part of ``make test``: it downloads or unpacks several
gigabytes. The environment is deleted at the end unless ``--venv`` names where to make it (an
environment already there made by ``pip install .`` gets the ``grade`` extra added, as the README says).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def score(python: Path, notebook: Path, chapter: str, scratch: Path) -> tuple[float, float, float]:
    """(score, max score, seconds) of one notebook graded by the installed package."""
    results = scratch / "results.json"
    start = time.monotonic()
    run([str(python), "-m", "autograder", "grade", str(notebook), "--chapter", chapter, "--results", str(results)],
        cwd=scratch)
    data = json.loads(results.read_text())
    return data["score"], data["extra_data"]["max_score"], time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3.11", help="the interpreter to make the venv with")
    parser.add_argument("--venv", help="make (or complete) the environment here, and keep it")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="fresh-install-"))
    venv = Path(args.venv) if args.venv else scratch / "venv"
    try:
        source = scratch / "source"  # the committed tree, as a fresh clone has it
        source.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        command = f"{args.python} -m venv {venv} && {venv}/bin/pip install '{source}[grade]'"
        start = time.monotonic()
        if not (venv / "bin" / "python").exists():
            run([args.python, "-m", "venv", str(venv)])
        run([str(venv / "bin" / "pip"), "install", "--quiet", f"{source}[grade]"])
        installed = time.monotonic() - start
        python = venv / "bin" / "python"
        torch = run([str(python), "-c", "import torch; print(torch.__version__, torch.version.cuda, "
                     "torch.cuda.is_available())"]).stdout.split()
        size = run(["du", "-sh", str(venv)]).stdout.split()[0]
        print(f"command: {command}\ninstall: {installed:.0f} s, {size}; torch {torch[0]} (CUDA {torch[1]}, "
              f"GPU available: {torch[2]})")
        failures = 0
        for solution in sorted(REPO.glob("solutions/[0-9][0-9]_*/*.ipynb")):
            chapter = solution.parent.name
            release = REPO / "chapters" / chapter / solution.name
            got, total, seconds = score(python, solution, chapter[:2], scratch)
            stub, _, stub_seconds = score(python, release, chapter[:2], scratch)
            ok = got == total and stub == 0
            failures += not ok
            print(f"{chapter:<28} solution {got:g}/{total:g} ({seconds:.0f} s)   untouched {stub:g}/{total:g} "
                  f"({stub_seconds:.0f} s){'' if ok else '   WRONG'}", flush=True)
        return 1 if failures else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
