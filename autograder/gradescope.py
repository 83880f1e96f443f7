"""``python -m autograder gradescope-zip --chapter NN``: the Gradescope autograder package.

The zip holds the grader and the reference (``source/``), a ``requirements-grader.txt``
pinned to the versions installed here (the grader's runtime closure only, not the course's
whole environment), optionally the wheels themselves, ``setup.sh`` (installs them) and
``run_autograder`` (grades ``/autograder/submission`` into ``/autograder/results``) and
``autograder/salt.txt``, a secret drawn anew for each package: it goes into every seed of
hidden cases, so nobody can reproduce them outside the grader. When Gradescope runs it as
root, each worker gives up root for a user of its own (see ``worker``); ``run_autograder``
first closes everything under /autograder to other users but the venv, which they may only
read (where namespaces are missing, these modes are what hides the rest).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import secrets
import zipfile
from pathlib import Path

from autograder.registry import REGISTRY
from autograder.sandbox import REPO_ROOT

RUNTIME_ROOTS = ("torch", "numpy", "nbformat", "tqdm", "pytest")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SETUP_SH = """#!/usr/bin/env bash
# Installs the grader's pinned runtime. Gradescope runs this once, as root, when it builds the image.
set -euo pipefail
cd /autograder/source
apt-get update -qq && apt-get install -y -qq python3 python3-pip python3-venv >/dev/null
python3 -m venv /autograder/venv
if [ -d wheels ]; then
  /autograder/venv/bin/pip install --no-index --find-links wheels -r requirements-grader.txt
else
  /autograder/venv/bin/pip install --extra-index-url {index} -r requirements-grader.txt
fi
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Grades the submission; results.json is written by the harness after every worker is gone.
# Workers run as users of their own: where the container forbids namespaces, these modes are
# what keeps the package (reference, salt), the submission, the results and everyone's
# metadata out of their reach. Only the venv stays readable, and nobody but root may write it.
set -eu
shopt -s nullglob dotglob
chmod 711 /autograder
for entry in /autograder/*; do
  [ "$entry" = /autograder/venv ] || chmod -R go-rwx "$entry"
done
chmod -R go-w /autograder/venv
cd /autograder/source
PYTHONPATH=/autograder/source exec /autograder/venv/bin/python -m autograder grade /autograder/submission \\
  --chapter {chapter} --results /autograder/results/results.json
"""


def _name(requirement: str) -> str:
    return re.split(r"[ ;<>=!~\\[(]", requirement, maxsplit=1)[0]


def runtime_requirements(roots: tuple[str, ...] = RUNTIME_ROOTS) -> list[str]:
    """``name==version`` for the roots and everything they need at run time (no extras)."""
    pins: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = dist.metadata["Name"]
        if key in pins:
            continue
        pins[key] = dist.version
        todo += [_name(r) for r in dist.requires or [] if "extra ==" not in r]
    return sorted(f"{n}=={v}" for n, v in pins.items())


SALT_FILE = Path(__file__).with_name("salt.txt")


def packaged_salt() -> str:
    """The secret salt of the package this grader came in ("" in the repository)."""
    try:
        return SALT_FILE.read_text().strip()
    except OSError:
        return ""


def build(chapter: str, out: Path, wheels: Path | None = None) -> Path:
    """Write the package for one chapter (= one Gradescope assignment)."""
    if not any(e.chapter.split("_")[0] == chapter.zfill(2) for e in REGISTRY):
        raise ValueError(f"no exercises for chapter {chapter!r}")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in ("autograder", "tfm_solution"):
            for path in sorted((REPO_ROOT / package).rglob("*.py")):  # with sub-packages (autograder.exercises)
                archive.write(path, str(path.relative_to(REPO_ROOT)))
        archive.writestr(f"autograder/{SALT_FILE.name}", secrets.token_hex(32) + "\n")
        archive.writestr("requirements-grader.txt", "\n".join(runtime_requirements()) + "\n")
        for name, text in (("setup.sh", SETUP_SH.format(index=TORCH_CPU_INDEX)),
                           ("run_autograder", RUN_AUTOGRADER.format(chapter=chapter.zfill(2)))):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o100755 << 16
            archive.writestr(info, text)
        for wheel in sorted(wheels.glob("*.whl")) if wheels else []:
            archive.write(wheel, f"wheels/{wheel.name}")
    return out


def run(args: argparse.Namespace) -> int:
    out = Path(args.out or f"gradescope-ch{args.chapter.zfill(2)}.zip")
    build(args.chapter, out, Path(args.wheels) if args.wheels else None)
    print(f"Gradescope package written to {out}; upload it as the assignment's autograder.")
    return 0
