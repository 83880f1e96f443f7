"""The first code cell of every chapter notebook: on Colab it installs the course package.

A chapter opened in Colab (the launch button of the website) starts on a machine that has
PyTorch but not this course's package, so the notebook's first code cell installs it from the
course repository, and anywhere else (a laptop with the course installed, CI, nbval, the
website's build) it does nothing. The repository address lives in one place, ``_config.yml``
(``repository.url`` and ``repository.branch``); :func:`install_cell` turns it into the cell's
text, and a test checks that every notebook under ``solutions/`` begins with exactly that cell.

    python -m tfm_solution.colab            # print the cell for the current _config.yml
    python -m tfm_solution.colab --write    # put it first in every solutions/NN_*/ notebook

Run ``--write`` and then ``make chapters`` after changing the address in ``_config.yml``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

#: The id of the cell in every notebook, and the tag that keeps it off the website.
CELL_ID = "colab-install"
CELL_TAGS = ["remove-cell"]

_TEMPLATE = '''\
# On Google Colab this cell installs the course package (reference code and widgets);
# anywhere else it does nothing. Run it first.
import sys

if "google.colab" in sys.modules:
    import importlib
    import subprocess

    course = "{requirement}"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", course], check=True)
    importlib.invalidate_caches()'''


def install_cell(url: str, branch: str = "main") -> str:
    """The source of the first code cell for the course repository at ``url``, ``branch``."""
    url = url.rstrip("/")
    if not url.startswith("https://") or any(c in url + branch for c in "\"' \\"):
        raise ValueError(f"not a plain https repository address: {url!r} (branch {branch!r})")
    return _TEMPLATE.format(requirement=f"git+{url}@{branch}")


def release_cell(url: str) -> str:
    """The first code cell of a graded release's notebooks: it installs the release's student package
    from ``url`` (where the instructor serves it, ``course_release.package_url`` in ``_config.yml``),
    never the whole repository, which holds every chapter's answers."""
    if not url.startswith("https://") or any(c in url for c in "\"' \\"):
        raise ValueError(f"not a plain https address: {url!r}")
    return _TEMPLATE.format(requirement=url).replace("installs the course package (reference code and widgets)",
                                                     "installs this release's course package (widgets, data tools)")


def repository(config: Path) -> tuple[str, str]:
    """``(url, branch)`` from the ``repository`` section of a Jupyter Book ``_config.yml``."""
    import yaml  # the maintainers' environment has it (Jupyter Book); students never call this

    section = (yaml.safe_load(config.read_text()) or {}).get("repository") or {}
    if "url" not in section:
        raise ValueError(f"{config} has no repository.url")
    return str(section["url"]), str(section.get("branch", "main"))


def write_first_cells(root: Path) -> list[Path]:
    """Put the install cell first in every ``solutions/*/*.ipynb`` under ``root``; return the changed ones."""
    source = install_cell(*repository(root / "_config.yml"))
    changed = []
    for path in sorted((root / "solutions").glob("*/*.ipynb")):
        nb = json.loads(path.read_text())
        first = nb["cells"][0] if nb["cells"] else {}
        if first.get("id") == CELL_ID and "".join(first.get("source", [])) == source:
            continue
        cell = {"cell_type": "code", "execution_count": None, "id": CELL_ID,
                "metadata": {"tags": list(CELL_TAGS)}, "outputs": [], "source": source.splitlines(keepends=True)}
        nb["cells"] = [cell, *(c for c in nb["cells"] if c.get("id") != CELL_ID)]
        path.write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
        changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the course repository (default: here)")
    parser.add_argument("--write", action="store_true", help="write the cell into every solutions notebook")
    args = parser.parse_args(argv)
    if args.write:
        for path in write_first_cells(args.root):
            print(f"updated {path.relative_to(args.root)}")
    else:
        print(install_cell(*repository(args.root / "_config.yml")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
