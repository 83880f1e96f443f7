"""Other hosts for the grader's self-tests, made inside private mount and PID namespaces.

The suite runs as root on one machine, but the grader must also hold when an instructor runs
it as an ordinary user who owns the environment, on a host whose ``/proc`` is partly masked
(as in containers), or on Gradescope. ``contained(script, ...)`` runs a bash ``script`` as
root in fresh mount and PID namespaces (nothing it mounts, and no process it starts,
reaches the real host; a ``kill(-1, 9)`` inside reaches only its own processes) after
setting the scene:

- the interpreter's private ancestors (a home folder holding pyenv) become enterable by
  anyone, so that an unprivileged user can run the course's Python at all;
- ``writable_env``: the environment's ``site-packages`` belongs to ``nobody`` (an overlay,
  so the real one is untouched), as a user's own virtual environment does;
- ``masked_proc``: a file of ``/proc`` is covered, as container runtimes do, which keeps a
  user namespace from mounting a fresh ``/proc``.

In ``script``, ``$WORK`` is a scratch folder (readable by ``nobody``), ``$SITE`` the
environment's ``site-packages``, ``$UPPER`` what was written into it (``writable_env``)
and ``as_nobody CMD...`` runs a command as ``nobody``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from autograder.sandbox import _private_ancestors

NOBODY = 65534
SITE = sysconfig.get_path("purelib")


def _reachable_interpreter() -> list[str]:
    """Commands that make every private ancestor of the interpreter enterable, keeping what it holds."""
    lines = []
    for n, (ancestor, kept) in enumerate(_private_ancestors().items()):
        for m, path in enumerate(kept):
            lines.append(f"mkdir -p \"$WORK/.keep{n}_{m}\" && mount --rbind {shlex.quote(path)} \"$WORK/.keep{n}_{m}\"")
        lines.append(f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(ancestor)}")
        for m, path in enumerate(kept):
            lines.append(f"mkdir -p {shlex.quote(path)} && mount --move \"$WORK/.keep{n}_{m}\" {shlex.quote(path)}")
    return lines


def host_folder() -> Path:
    """A scratch folder for ``contained`` that ``nobody`` can enter (``tmp_path`` is root's own)."""
    work = Path(tempfile.mkdtemp(prefix="graded-host-", dir="/tmp"))
    work.chmod(0o755)
    return work


def contained(script: str, work: Path, *, writable_env: bool = False, masked_proc: bool = False,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``script`` (bash) as root in private namespaces set up as described above."""
    prologue = ["set -eu", f"WORK={shlex.quote(str(work))}", f"SITE={shlex.quote(SITE)}",
                "UPPER=\"$WORK/.upper\"", "mkdir -p \"$WORK/home\" && chown nobody \"$WORK/home\"",
                f"as_nobody() {{ setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups "
                f"env HOME=\"$WORK/home\" PYTHONDONTWRITEBYTECODE=1 \"$@\"; }}",
                "export WORK SITE UPPER", *_reachable_interpreter()]
    if writable_env:
        prologue += ["mkdir -p \"$UPPER\" \"$WORK/.overlay-work\" && chown nobody \"$UPPER\"",
                     "mount -t overlay overlay -o "
                     "lowerdir=\"$SITE\",upperdir=\"$UPPER\",workdir=\"$WORK/.overlay-work\" \"$SITE\""]
    if masked_proc:
        prologue.append("mount --bind /dev/null /proc/keys")
    text = "\n".join(prologue) + "\n" + script
    return subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "bash", "-c", text],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=str(Path(__file__).resolve().parents[2]))


PYTHON = shlex.quote(sys.executable)
