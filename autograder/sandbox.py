"""Starting, talking to and killing grading workers (the harness side of the boundary).

Workers are forked by one fork server per harness process (``worker.fork_server``: a
``python -I -S -u -B`` with an allow-listed environment that imports torch once, so a worker costs
milliseconds, not seconds). Where the operating system allows it, each worker gets fresh
mount, network and PID namespaces (as root directly, otherwise inside a user namespace): no
network, the harness's files hidden under empty mounts, and killing the worker, the first
process of its PID namespace, kills every process the submission made. Otherwise its
process group is killed, and the report says the isolation was weaker.
"""

from __future__ import annotations

import json
import os
import select
import socket
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from autograder import worker as wire

WORKER_SCRIPT = Path(wire.__file__).resolve()
REPO_ROOT = WORKER_SCRIPT.parent.parent
OUTPUT_CAP = 16 * 1024  # characters of a worker's stdout/stderr kept for the feedback


@dataclass(frozen=True)
class Limits:
    """What one worker may use. ``call_timeout_s`` is wall time per graded call."""

    memory_mb: int = 3072
    cpu_s: int = 60
    file_mb: int = 16
    nproc: int = 256
    call_timeout_s: float = 10.0
    start_timeout_s: float = 30.0
    max_result_bytes: int = 64 * 1024 * 1024


class WorkerDied(Exception):
    """The worker ended, timed out or broke the protocol; ``reason`` says which, for humans."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.output = ""  # what the worker printed, when it died while loading


class _ForkServer:
    """The process that imports torch once and forks every worker (see ``worker.fork_server``)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [sys.executable, "-I", "-S", "-u", "-B", str(WORKER_SCRIPT), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=_ENV, cwd="/", start_new_session=True)
        theirs.close()
        ours.settimeout(120)
        ours.send(json.dumps({"sys_path": _site_paths()}).encode())
        hello = json.loads(ours.recv(1 << 16))
        ours.settimeout(None)
        self.namespaces, self.root = hello["namespaces"], hello["root"]

    def spawn(self, fds: list[int], isolate: bool) -> tuple[int, int]:
        """Fork a worker wired to ``fds``; (waiting child's PID, worker's PID)."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps({"isolate": isolate}).encode()], fds)
            reply = json.loads(self.sock.recv(1 << 16))
        return reply["pid"], reply["worker"]


_SERVER: _ForkServer | None = None
_SERVER_LOCK = threading.Lock()
# The whole environment of the fork server and its workers (PYTHON* variables would be
# ignored anyway: ``-I``); ``-u`` keeps what a worker prints even when it is killed.
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp",
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def fork_server() -> _ForkServer:
    """The running fork server, started (again) when needed."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or _SERVER.proc.poll() is not None:
            _SERVER = _ForkServer()
        return _SERVER


def isolation() -> tuple[bool, bool, str]:
    """(namespaces, drop to nobody, description) of the isolation workers get here."""
    server = fork_server()
    if server.namespaces:
        who = "runs as nobody" if server.root else "runs without privileges in a user namespace"
        return True, server.root, f"namespaces (no network, harness files hidden, own PIDs); {who}"
    # Without namespaces, root can still give up root, if nobody can reach the interpreter.
    drop = server.root and not _private_ancestors()
    return False, drop, ("process group and resource limits only (namespaces unavailable): network not blocked"
                         + ("; runs as nobody" if drop else ""))


def _site_paths() -> list[str]:
    """The interpreter's standard library and site-packages, nothing project-local."""
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = [sysconfig.get_path(k) for k in keys]
    zipped = [p for p in sys.path if p.endswith(".zip")]
    lib_dynload = [p for p in sys.path if p.endswith("lib-dynload")]
    return list(dict.fromkeys(zipped + paths[:2] + lib_dynload + paths[2:]))


def _private_ancestors() -> dict[str, list[str]]:
    """The interpreter's ancestors that ``nobody`` cannot enter (e.g. a home holding pyenv)."""
    cover: dict[str, list[str]] = {}
    for prefix in {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}:
        for ancestor in reversed(prefix.parents):
            if ancestor != Path("/") and not ancestor.stat().st_mode & 0o001:
                cover.setdefault(str(ancestor), []).append(str(prefix))
                break
    return cover


def covered_paths() -> dict[str, list[str]]:
    """Folders replaced by an empty one in a worker, with what is mounted back into them.

    /tmp is replaced first (the worker's private working folder). The project folder (the
    grader, the reference, its git history, built pages) disappears but for the environment,
    if it lives there; so does the first ancestor of the interpreter that ``nobody`` could
    not enter, but for the interpreter.
    """
    prefixes = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    tmp = Path("/tmp").resolve()
    # /tmp first: a private, empty one (where the worker works), keeping an environment there.
    cover = {str(tmp): [str(p) for p in prefixes if tmp in p.parents]}
    cover.update(_private_ancestors())
    repo = REPO_ROOT.resolve()
    if not any(Path(top) == repo or (Path(top) in repo.parents and top != str(tmp)) for top in cover):
        cover[str(repo)] = [str(p) for p in prefixes if repo in p.parents]
    return cover


def hidden_paths(extra: list[str | os.PathLike]) -> list[str]:
    """Directories a worker must not see: the harness, the reference, tests, submissions, results."""
    keep = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    covered = covered_paths()
    candidates = [REPO_ROOT / name for name in ("autograder", "tfm_solution", "tests", "solutions", "chapters")]
    candidates += [Path(p) for p in extra] + [Path("/root"), Path("/home")]
    hide = []
    for path in candidates:
        path = path.resolve()
        # Hiding a folder that holds the interpreter would hide the interpreter too.
        if (path.is_dir() and path != Path("/") and not any(k == path or path in k.parents for k in keep)
                and str(path) not in covered):
            hide.append(str(path))
    return list(dict.fromkeys(hide))


@dataclass
class Worker:
    """One worker process, loaded with one exercise's code.

    ``setup`` is the first frame: the code chunks to run, the name to grade, the
    prerequisites' source, the blocked packages (see ``worker.main``).
    """

    setup: dict
    limits: Limits
    hide: list[str]
    ready: dict = field(default_factory=dict)
    output: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        isolate, nobody, _ = isolation()
        self._scratch = None if isolate else tempfile.mkdtemp(prefix="grade-worker-")
        if self._scratch and nobody:
            os.chown(self._scratch, 65534, 65534)
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        self._out_r, out_w = os.pipe()
        try:
            self.pid, self.worker_pid = fork_server().spawn([req_r, resp_w, out_w], isolate)
        finally:
            for fd in (req_r, resp_w, out_w):
                os.close(fd)
        self.exit_code: int | None = None
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        frame = dict(self.setup, nobody=nobody, hide=self.hide, cover=covered_paths(),
                     cwd="/tmp" if isolate else self._scratch, max_result_bytes=self.limits.max_result_bytes,
                     limits={"memory_mb": self.limits.memory_mb, "cpu_s": self.limits.cpu_s,
                             "file_mb": self.limits.file_mb, "nproc": self.limits.nproc})
        try:
            wire.write_all(self._req_w, wire.encode_frame(frame, []))
            self.ready, _ = self._receive(self.limits.start_timeout_s)
        except (WorkerDied, OSError) as exc:
            died = exc if isinstance(exc, WorkerDied) else WorkerDied(self._death("died before answering"))
            self.kill()
            died.output = self.captured_output()
            raise died from None

    def _drain(self) -> None:
        """Keep the first OUTPUT_CAP characters of the worker's output; discard the rest."""
        kept = 0
        for raw in iter(lambda: os.read(self._out_r, 8192), b""):
            if kept < OUTPUT_CAP:
                text = raw.decode("utf-8", "replace")[: OUTPUT_CAP - kept]
                self.output.append(text)
                kept += len(text)
                if kept >= OUTPUT_CAP:
                    self.output.append("\n[... output truncated ...]")

    def call(self, request: dict, buffers: list[bytes]) -> tuple[dict, list[bytes], float]:
        """Send one graded call; (reply, buffers, wall seconds). Raises ``WorkerDied``."""
        start = time.monotonic()
        try:
            wire.write_all(self._req_w, wire.encode_frame(dict(request, buffers=[len(b) for b in buffers]), buffers))
        except OSError as exc:
            raise WorkerDied(self._death("died before answering")) from exc
        reply, out = self._receive(self.limits.call_timeout_s)
        if reply.get("id") != request["id"]:
            raise WorkerDied("answered out of turn (a forged or stale reply)")
        return reply, out, time.monotonic() - start

    def _receive(self, timeout: float) -> tuple[dict, list[bytes]]:
        deadline = time.monotonic() + timeout
        data = bytearray()

        def need(n: int) -> bytes:
            while len(data) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerDied(self._death(f"timed out after {timeout:g} s"))
                ready, _, _ = select.select([self._resp_r], [], [], left)
                if ready:
                    chunk = os.read(self._resp_r, 1 << 20)
                    if not chunk:
                        raise WorkerDied(self._death("died before answering"))
                    data.extend(chunk)
                    if len(data) > wire.MAX_FRAME_BYTES + 4096:
                        raise WorkerDied("sent more data than allowed")
            return bytes(data[:n])

        (n,) = wire._LEN.unpack(need(4))
        if n > 1 << 20:
            raise WorkerDied("sent a malformed reply")
        try:
            header = json.loads(need(4 + n)[4:])
            sizes = header.get("buffers", [])
            if not (isinstance(sizes, list) and all(isinstance(s, int) and s >= 0 for s in sizes)):
                raise ValueError
            if sum(sizes) > self.limits.max_result_bytes:
                raise WorkerDied("returned more data than the size cap")
        except (ValueError, AttributeError) as exc:
            raise WorkerDied(self._death("sent a malformed reply")) from exc
        body = need(4 + n + sum(sizes))[4 + n:]
        del data[: 4 + n + sum(sizes)]
        if "exited" in header:  # written by the waiting parent once the worker is gone
            self.exit_code = header["exited"] if isinstance(header["exited"], int) else None
            raise WorkerDied(self._death("died before answering"))
        out, pos = [], 0
        for s in sizes:
            out.append(body[pos: pos + s])
            pos += s
        return header, out

    def _death(self, what: str) -> str:
        """Why the worker is gone, in words; kills it first, so nothing outlives the message."""
        self.kill()
        code = self.exit_code
        if what.startswith("timed out"):
            return what
        if code is not None and code < 0:
            sig = signal.Signals(-code).name
            hints = {"SIGKILL": " (likely the memory or CPU limit)", "SIGXCPU": " (CPU time limit)",
                     "SIGSEGV": " (often memory exhausted)"}
            return f"worker {what}: killed by {sig}{hints.get(sig, '')}"
        return f"worker {what} (exit code {code}); an exit code never counts as success"

    def kill(self) -> None:
        """Kill the worker (with its PID namespace) and its parent's group; wait until they are gone."""
        for kill, pid in ((os.kill, self.worker_pid), (os.killpg, self.pid)):
            try:
                if pid > 0:
                    kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in (self.pid, self.worker_pid)):
            time.sleep(0.01)
        for fd in (self._req_w, self._resp_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._req_w = self._resp_r = -1
        self._reader.join(timeout=5)
        try:
            os.close(self._out_r)
        except OSError:
            pass
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def captured_output(self) -> str:
        return "".join(self.output)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has finished: only its exit status remains)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
