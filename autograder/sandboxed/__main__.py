"""A worker's program: the fork server, and one worker's life.

The grader starts this package as a script (``python -I -S -u -B sandboxed.pyz FD``): a fork server that
imports torch once and forks one sandboxed worker per exercise. It talks to each worker over two private
pipes (``wire``). Start-up order matters, because student code must find the sandbox already closed:

  0. (the fork server) inside bubblewrap's view, which holds only what grading needs (see
     ``autograder.sandbox.view_argv``); each worker forked from it inherits that view;
  1. close the sandbox (``jail``), set the limits, check it from inside and tell the grader first (no student
     code has run yet, so that frame cannot be forged); a failed step ends the worker here;
  2. import torch, block imports of the grader and of the reference, install the prerequisites the grader
     sent, and only then execute the student's code.
"""

from __future__ import annotations

import json
import marshal
import os
import sys

from .jail import (BlockImports, close_sandbox, enter_namespaces, mount_points, namespaces_work, own_address_space,
                   reserve, set_limits, verify_sandbox)
from .procedure import MAX_STRUCTURE_ENTRIES, FixedDropout, answer, build_module_arg, marks
from .wire import encode_frame, pack_value, read_frame, unpack_value, write_all


def _run_chunks(chunks: list[str], namespace: dict) -> list[str]:
    """Execute each code chunk like a kernel cell: an error stops the chunk, not the rest.

    A chunk is normalised source (``extract.normalised``); it is known by its number alone, so
    nothing about the notebook's layout reaches this process. Each error reads
    ``"chunk N[, line L]: Exception: message"``, L a line of the chunk; the harness says which
    cell and line of the notebook that was (``Extraction.explain``).
    """
    import traceback

    errors = []
    for number, source in enumerate(chunks):
        label = f"chunk {number}"
        try:
            exec(compile(source, label, "exec"), namespace)  # noqa: S102 - this process exists to run it
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: a cell cannot end the worker
            if isinstance(exc, SyntaxError):  # (the compiler's: e.g. `return` outside a function)
                line, text = exc.lineno, f"SyntaxError: {exc.msg}"
            else:
                line, text = _failing_line(exc, label), "".join(traceback.format_exception_only(type(exc), exc))
            errors.append(f"{label}{f', line {line}' if line else ''}: {text.strip()}"[:2000])
    return errors


def _failing_line(exc: BaseException, label: str) -> int | None:
    """The line of the chunk ``label`` where ``exc`` was raised (the import that failed, say), or
    None when it was raised elsewhere only."""
    lineno = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == label:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return lineno


def serve(req_fd: int, resp_fd: int, isolated: bool) -> None:
    """One worker's life: close the sandbox, load the student's code, answer calls until killed.

    Student code can reach whatever this process holds (its frames lead back here, ``gc`` and
    ``ctypes`` reach the rest, memory included), so nothing sent here must stay secret: the code is
    the normalised code the seed hashed, a request holds the call's arguments and a seed drawn from
    the submission's (never that seed), the prerequisites are bytecode, and no path of the harness
    (submissions, results, the project) is ever named.
    """
    setup, setup_buffers = read_frame(req_fd)
    memory: dict = {}
    try:
        own = own_address_space()
        weaker = close_sandbox(setup, isolated)
        os.chdir(setup["cwd"])
        memory = set_limits(setup["limits"], own)
        problems = verify_sandbox(setup, isolated)
    except Exception as exc:  # noqa: BLE001 - any failed step: say which, and run nothing
        problems, weaker = [f"{type(exc).__name__}: {exc}"[:500]], []
    # The first frame, written before any student code runs, so it cannot be forged.
    write_all(resp_fd, encode_frame({"sandbox": {"ok": not problems, "problems": problems,
                                                 "weaker": weaker, "memory": memory}}, []))
    if problems:
        return

    import types

    # Prerequisites: reference objects the harness chose to provide, built from bytecode only.
    # No student code has run yet: a failure here is the grader's, and is reported as such.
    provided_ns: dict = {"__name__": "_provided"}
    try:
        exec(marshal.loads(setup_buffers.pop()), provided_ns)  # noqa: S102 - the harness's bytecode, no source
    except BaseException as exc:  # noqa: BLE001 - MemoryError included
        write_all(resp_fd, encode_frame({"ready": True, "found": False, "errors": [],
                                         "grader_error": f"{type(exc).__name__}: {exc}"[:500]}, []))
        return
    provided_names = {n: provided_ns[n] for n in setup["provided_names"]}
    modules = {m: {n: provided_ns[n] for n in names} for m, names in setup["provided_modules"].items()}
    sys.meta_path.insert(0, BlockImports(set(setup["blocked"]), modules))
    for blocked in list(sys.modules):
        if blocked.split(".")[0] in setup["blocked"]:
            del sys.modules[blocked]

    # Before the student's code runs, so that `from torch.nn.functional import dropout` finds it too.
    dropout = FixedDropout()
    dropout.install()
    install_convolution = marks("conv1d")[0]
    install_convolution()
    module = types.ModuleType("submission")
    sys.modules["submission"] = module
    namespace = module.__dict__
    errors = _run_chunks(setup["chunks"], namespace)
    namespace.update(provided_names)  # one early bug costs once: prerequisites are the reference's
    # ... those the course has released: the others are the student's own answers (a graded release).
    classes = {**{n: namespace[n] for n in setup.get("own_names", ()) if n in namespace}, **provided_names}
    name = setup["name"]
    found = name in namespace
    write_all(resp_fd, encode_frame({"ready": True, "found": found, "errors": errors,
                                    "type": type(namespace.get(name)).__name__}, []))
    sys.stdin = open(os.devnull)  # noqa: SIM115 - `input()` gets EOF at once
    while True:
        request, buffers = read_frame(req_fd)
        install_convolution()  # again before each request: the student's code may have put something else there
        reply, out = respond(namespace, name, request, buffers, classes, setup["max_result_bytes"], dropout)
        write_all(resp_fd, encode_frame(reply, out))


def respond(namespace: dict, name: str, request: dict, buffers: list[bytes], classes: dict, max_bytes: int,
            dropout: FixedDropout) -> tuple[dict, list[bytes]]:
    """One request of the harness answered with ``namespace[name]``: ``(reply header, its buffers)``.

    Every request starts alike: torch seeded with the request's seed, float32 as the default dtype, the
    dropout stand-in reset and installed again (the student's code may have replaced it). Whatever the
    answer raises is the reply.
    """
    import torch

    # The CPU generator only: torch.manual_seed also queues seeds for other devices, at a cost per call.
    torch.default_generator.manual_seed(request["seed"])
    torch.set_default_dtype(torch.float32)
    dropout.reset(request["seed"])
    dropout.install()  # again: the student's code may have put something else in its place
    out: list[bytes] = []
    try:
        args = [build_module_arg(unpack_value(a, buffers), classes) for a in request["args"]]
        kwargs = {k: build_module_arg(unpack_value(v, buffers), classes) for k, v in request["kwargs"].items()}
        construct = None if request.get("construct") is None else [
            build_module_arg(unpack_value(a, buffers), classes) for a in request["construct"]]
        state = {k: unpack_value(v, buffers) for k, v in request.get("state", {}).items()}
        result, structures, unloaded = answer(namespace[name], request, args, kwargs, construct, state, classes)
        reply = {"id": request.get("id"), "ok": True, "value": pack_value(result, out, max_bytes),
                 "unloaded": unloaded[:MAX_STRUCTURE_ENTRIES]}
        if structures is not None:
            reply["structure"] = {"builds": structures}
    except BaseException as exc:  # noqa: BLE001 - whatever the student raised is their answer
        out = []
        text = f"{type(exc).__name__}: {exc}"[:2000]  # as grade.error_text, to match declared mistakes
        reply = {"id": request.get("id"), "ok": False, "error": text}
    reply["buffers"] = [len(b) for b in out]
    return reply, out



def _spawn(libc, fds: list[int], isolate: bool, pid_w: int) -> None:
    """In the forked child: new namespaces, then fork the worker (PID 1 there) and wait for it."""
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    # Die with the fork server (which ends with its harness), taking the worker along: no
    # worker outlives a harness that was killed.
    if libc.prctl(1, 9, 0, 0, 0) != 0 or os.getppid() == 1:  # PR_SET_PDEATHSIG
        os._exit(72)
    req_r, resp_w, out_w = fds
    if isolate and not enter_namespaces(libc):
        os._exit(70)
    worker = os.fork()
    if worker == 0:
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the waiting parent
        if isolate:
            ms_rec, ms_private = 16384, 262144
            # Without private propagation the covering mounts below would reach the host: fail closed.
            if libc.mount(None, b"/", None, ms_rec | ms_private, None) != 0:
                os._exit(71)
        import fcntl

        # Move the pipes out of the way first, so that placing them on 0-4 clobbers nothing.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1000) for fd in (os.open(os.devnull, os.O_RDONLY), out_w, out_w,
                                                                req_r, resp_w)]
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(5, 1 << 16)  # nothing of the harness's or the server's stays open
        try:
            serve(3, 4, isolate)
        finally:
            os._exit(0)
    write_all(pid_w, str(worker).encode())
    os.close(pid_w)
    os.close(req_r)
    os.close(out_w)
    _, status = os.waitpid(worker, 0)
    try:
        write_all(resp_w, encode_frame({"exited": os.waitstatus_to_exitcode(status), "buffers": []}, []))
    finally:
        os._exit(0)


def fork_server(ctl_fd: int) -> None:
    """Import torch once, then fork one sandboxed worker per request of the harness.

    Requests arrive on a SOCK_SEQPACKET socket with three descriptors (the worker's request
    pipe, reply pipe and output pipe); the answer names the waiting child's and the worker's
    PIDs, so the harness can kill both. Student code never runs in this process.
    """
    import ctypes
    import signal
    import socket

    sock = socket.socket(fileno=ctl_fd)
    hello = json.loads(sock.recv(1 << 20))
    sys.path[:] = hello["sys_path"]
    os.environ.pop("PWD", None)  # set by bubblewrap: the workers' environment is the harness's allowlist only
    import torch

    # One thread: the same reductions in the same order on every machine. (Not
    # use_deterministic_algorithms: it imports the compiler stack, seconds for nothing on CPU.)
    torch.set_num_threads(1)
    libc = ctypes.CDLL(None, use_errno=True)
    reserve(libc, int(hello.get("reserve_mb", 0)))
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back here to be reaped
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    namespaces = hello["view"] and namespaces_work(libc)
    sock.send(json.dumps({"namespaces": namespaces, "root": os.geteuid() == 0,
                          "mounts": mount_points() if hello["view"] else []}).encode())
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        if not message:
            return  # the harness is gone
        isolate = json.loads(message)["isolate"]
        pid_r, pid_w = os.pipe()
        child = os.fork()
        if child == 0:
            sock.close()
            os.close(pid_r)
            _spawn(libc, fds, isolate, pid_w)
        os.close(pid_w)
        for fd in fds:
            os.close(fd)
        worker = int(os.read(pid_r, 64) or b"0")
        os.close(pid_r)
        sock.send(json.dumps({"pid": child, "worker": worker}).encode())


if __name__ == "__main__":
    fork_server(int(sys.argv[1]))
