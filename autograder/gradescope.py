"""``python -m autograder gradescope-zip --chapter NN``: the Gradescope autograder package.

The zip holds the grader and the part of the reference it loads (``source/``), a
``requirements-grader.txt``, optionally wheels, ``setup.sh`` (installs them) and
``run_autograder`` (grades ``/autograder/submission`` into ``/autograder/results``) and
``autograder/salt.txt``, a secret drawn anew for each package: it goes into every seed of
hidden cases, so nobody can reproduce them outside the grader. When Gradescope runs it as
root, each worker gives up root for a user of its own (see ``worker``); ``run_autograder``
first closes everything under /autograder to other users but the venv, which they may only
read (where namespaces are missing, these modes are what hides the rest).

The requirements are derived from the code that ships: every third-party module that a
shipped file imports, anywhere in it, is a requirement, with the range the project declares
for it (``pyproject.toml``: the dependencies and the ``grade`` extra) capped at the version
tested here; torch is pinned to the version installed here, as the course's lock pins it.
``setup.sh`` installs them from the ordinary package index (or from the shipped wheels), so
a clean image with Python 3.10 or newer needs nothing else. Both scripts take
``AUTOGRADER_ROOT`` (default ``/autograder``), so the package can be tried in a scratch folder.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata as metadata
import re
import secrets
import sys
import tomllib
import zipfile
from pathlib import Path

from autograder.registry import REGISTRY
from autograder.sandbox import REPO_ROOT

PACKAGES = ("autograder", "tfm_solution")
# Instructors' nbgrader glue: it imports nbgrader, which Gradescope never runs.
SHIPPED_DATA = (REPO_ROOT / "translations" / "zh" / "diagnoses.yml",)  # the grader's Chinese feedback
NOT_SHIPPED = ("autograder/nbgrader_plugin.py", "autograder/report.py")  # instructors' tools, not grading
PINNED = ("torch",)  # pinned exactly: the reference's numbers come from it
# Needed without an import statement: torch's ``Tensor.numpy()`` (the wire format's bytes) needs NumPy.
USED_WITHOUT_IMPORT = {"numpy": {"numpy"}}

SETUP_SH = """#!/usr/bin/env bash
# Installs the grader's runtime. Gradescope runs this once, as root, when it builds the image.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${AUTOGRADER_PYTHON:-python3}"
cd "$ROOT/source"
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  apt-get update -qq && apt-get install -y -qq python3 python3-pip python3-venv >/dev/null
fi
"$PYTHON" -m venv "$ROOT/venv"
if [ -d wheels ]; then
  "$ROOT/venv/bin/pip" install --no-index --find-links wheels -r requirements-grader.txt
else
  "$ROOT/venv/bin/pip" install -r requirements-grader.txt
fi
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Grades the submission; results.json is written by the harness after every worker is gone.
# Workers run as users of their own: where the container forbids namespaces, these modes are
# what keeps the package (reference, salt), the submission, the results and everyone's
# metadata out of their reach. Only the venv stays readable, and nobody but root may write it.
set -eu
shopt -s nullglob dotglob
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
chmod 711 "$ROOT"
for entry in "$ROOT"/*; do
  [ "$entry" = "$ROOT/venv" ] || chmod -R go-rwx "$entry"
done
chmod -R go-w "$ROOT/venv"
cd "$ROOT/source"
{released}PYTHONPATH="$ROOT/source" exec "$ROOT/venv/bin/python" -m autograder grade "$ROOT/submission" \\
  --chapter {chapter} --results "$ROOT/results/results.json"{isolation}
"""


def _name(requirement: str) -> str:
    return re.split(r"[ ;<>=!~\\[(]", requirement, maxsplit=1)[0]


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def shipped_files() -> list[Path]:
    """The package's files: the grader, the modules of the reference it can load (followed from the grader's
    imports, lazy ones included; the widgets never are), and the grader's data (``SHIPPED_DATA``)."""
    grader = [p for p in sorted((REPO_ROOT / "autograder").rglob("*.py"))
              if str(p.relative_to(REPO_ROOT)) not in NOT_SHIPPED]
    seen: set[Path] = set()
    todo = list(grader)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in imported_modules(path):
            todo += _local_files(module)
    data = [p for p in SHIPPED_DATA if p.is_file()]
    return sorted(seen) + data


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, at any depth of its code (relative
    imports resolved; ``from a import b`` names ``a`` and ``a.b``, which may be a module)."""
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [p for p in package if p != "__init__"]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] if node.level else [])
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _local_files(module: str) -> list[Path]:
    """The files that importing ``module`` runs, if it is one of ours (its packages' ``__init__`` too)."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return []
    files = []
    for end in range(1, len(parts) + 1):
        folder = REPO_ROOT.joinpath(*parts[:end])
        for candidate in (folder / "__init__.py", folder.with_suffix(".py")):
            if candidate.is_file():
                files.append(candidate)
    return files


def third_party(files: list[Path]) -> dict[str, set[str]]:
    """Distribution name -> the top-level modules of it that ``files`` import."""
    owners = metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for path in (f for f in files if f.suffix == ".py"):
        for module in imported_modules(path):
            top = module.split(".")[0]
            if not top or top in PACKAGES or top in sys.stdlib_module_names or top == "__future__":
                continue
            if top not in owners:
                raise LookupError(f"{path.relative_to(REPO_ROOT)} imports `{top}`, which no installed "
                                  "distribution provides")
            for dist in owners[top]:
                found.setdefault(dist, set()).add(top)
    return found


def declared_ranges() -> dict[str, str]:
    """Normalised name -> the requirement the project declares for grading (dependencies + ``grade``), read
    from the checkout's pyproject.toml, which the package is built from: the installed metadata is as old as
    the last install, and a requirement added since would be missing from it."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared: dict[str, str] = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["grade"]]:
        spec = requirement.partition(";")[0].strip()  # the package runs on Gradescope's Linux: markers hold
        declared[_key(_name(spec))] = spec
    return declared


def requirements(files: list[Path] | None = None) -> list[str]:
    """``requirements-grader.txt``: one line per distribution the shipped code imports."""
    declared = declared_ranges()
    lines = []
    for dist in sorted({**USED_WITHOUT_IMPORT, **third_party(shipped_files() if files is None else files)}, key=_key):
        spec = declared.get(_key(dist))
        if spec is None:
            raise LookupError(f"the grader imports `{dist}`, which pyproject.toml does not declare for grading "
                              "(add it to the dependencies or the `grade` extra)")
        installed = metadata.version(dist).split("+")[0]  # a local label (+cpu) is no version on the index
        name = _name(spec)
        lines.append(f"{name}=={installed}" if _key(name) in PINNED else f"{spec},<={installed}")
    return lines


SALT_FILE = Path(__file__).with_name("salt.txt")


def packaged_salt() -> str:
    """The secret salt of the package this grader came in ("" in the repository)."""
    try:
        return SALT_FILE.read_text().strip()
    except OSError:
        return ""


def build(chapter: str, out: Path, wheels: Path | None = None, allow_unisolated: bool = False,
          released_through: int | None = None) -> Path:
    """Write the package for one chapter (= one Gradescope assignment); it grades nothing where workers cannot
    get the allowlist view, unless ``allow_unisolated``. ``released_through``: the cut-off of the graded release
    it grades (``make release THROUGH=NN``); ``run_autograder`` sets ``AUTOGRADER_RELEASED_THROUGH`` to it, so
    that its workers receive no reference of a later chapter. ``None``: the self-learner's course."""
    if not any(e.chapter.split("_")[0] == chapter.zfill(2) for e in REGISTRY):
        raise ValueError(f"no exercises for chapter {chapter!r}")
    from autograder.release import LAST_CHAPTER

    if released_through is not None and not 0 <= released_through <= LAST_CHAPTER:
        raise ValueError(f"the release's cut-off must be a chapter number 0..{LAST_CHAPTER}, got {released_through}")
    released = "" if released_through is None else f"export AUTOGRADER_RELEASED_THROUGH={released_through}\n"
    files = shipped_files()
    lines = requirements(files)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, str(path.relative_to(REPO_ROOT)))
        archive.writestr(f"autograder/{SALT_FILE.name}", secrets.token_hex(32) + "\n")
        archive.writestr("requirements-grader.txt", "\n".join(lines) + "\n")
        for name, text in (("setup.sh", SETUP_SH),
                           ("run_autograder", RUN_AUTOGRADER.format(
                               chapter=chapter.zfill(2), released=released,
                               isolation="" if allow_unisolated else " --require-isolation"))):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o100755 << 16
            archive.writestr(info, text)
        for wheel in sorted(wheels.glob("*.whl")) if wheels else []:
            archive.write(wheel, f"wheels/{wheel.name}")
    return out


def run(args: argparse.Namespace) -> int:
    out = Path(args.out or f"gradescope-ch{args.chapter.zfill(2)}.zip")
    build(args.chapter, out, Path(args.wheels) if args.wheels else None, args.allow_unisolated,
          getattr(args, "released_through", None))
    print(f"Gradescope package written to {out}; upload it as the assignment's autograder.")
    return 0
