"""Closing the sandbox around a worker, and checking it from inside, before any student code runs.

In order: (in namespaces) private, empty writable folders, everything else read-only, a private /proc, the
kernel's keys hidden; no new privileges, an empty session keyring and no keyring calls, a user of its own if
the grader is root (else no capabilities); the resource limits; then a check from inside. Every step is
checked: one that fails raises ``OSError`` naming it, and no student code runs.
"""

from __future__ import annotations

import os
import sys


def close_sandbox(setup: dict, isolated: bool) -> list[str]:
    """Close the sandbox around this process; the steps it could only do in a weaker way, in words.

    In namespaces (inside the fork server's view, which holds only what grading needs): every
    writable folder (``setup["writable"]``) becomes a private, empty tmpfs, keeping the view's
    folders named for it; then the whole tree turns read-only but for the writable folders, so
    nothing a later process imports can change; a private /proc. Then no new privileges, and a
    user of its own (``setup["uid"]``, when the harness is root) or no capabilities at all. Every
    step is checked: one that fails raises ``OSError`` naming it, and no student code runs.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind, ms_rec, ms_nosuid, ms_nodev = 4096, 16384, 2, 4
    weaker: list[str] = []

    def check(ok: bool, step: str) -> None:
        if not ok:
            err = ctypes.get_errno()
            raise OSError(err, f"{step}: {os.strerror(err)}")

    def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> bool:
        return libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                          data.encode() if data else None) == 0

    if isolated:
        for top, keep in setup["writable"].items():
            kept = [(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY)) for path in keep if os.path.isdir(path)]
            check(mount("tmpfs", top, "tmpfs", ms_nosuid | ms_nodev, "size=64m,mode=1777"), f"empty folder on {top}")
            for path, fd in kept:
                os.makedirs(path, mode=0o755, exist_ok=True)
                check(mount(f"/proc/self/fd/{fd}", path, None, ms_bind | ms_rec, None), f"keeping {path}")
                os.close(fd)
        _read_only(libc, "/", recursive=True)
        for top in setup["writable"]:
            if os.path.isdir(top):
                _read_only(libc, top, recursive=False, writable=True)
        # A private /proc shows this PID namespace only. Where the host forbids mounting one (a
        # container's masked /proc, in a user namespace), an empty folder replaces the host's.
        if not mount("proc", "/proc", "proc", ms_nosuid | ms_nodev, None):
            why = os.strerror(ctypes.get_errno())
            check(mount("tmpfs", "/proc", "tmpfs", ms_nosuid | ms_nodev, "size=1k,mode=0555"), "empty /proc")
            weaker.append(f"no private /proc could be mounted ({why}): workers get an empty /proc")
        # The kernel's keys: /proc/keys would list those of the grader's session the worker may view.
        for listing in ("/proc/keys", "/proc/key-users"):
            if os.path.exists(listing) and not mount("/dev/null", listing, None, ms_bind, None):
                weaker.append(f"{listing} could not be hidden ({os.strerror(ctypes.get_errno())})")
    check(libc.prctl(38, 1, 0, 0, 0) == 0, "no new privileges")  # PR_SET_NO_NEW_PRIVS
    # A session keyring of its own (empty), then no keyring calls at all: neither the grader's
    # session keys (pam_keyinit gives a login one) nor what another worker left reach this one.
    libc.syscall(_KEY_CALLS.get(os.uname().machine, (0, 0, -1))[2], 1, None)  # KEYCTL_JOIN_SESSION_KEYRING
    if not _block_key_calls(libc):
        weaker.append(f"keyring calls are not blocked on {os.uname().machine}")
    if os.geteuid() == 0:
        for cap in range(_last_capability() + 1):
            check(libc.prctl(24, cap, 0, 0, 0) == 0, f"dropping capability {cap} from the bounding set")
    if setup["uid"] is not None:
        os.setgroups([])
        os.setgid(setup["uid"])
        os.setuid(setup["uid"])
    elif isolated:
        # Root of a user namespace could unmount what hides the harness: no capabilities left.
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        check(libc.capset(header, (ctypes.c_uint32 * 6)()) == 0, "dropping capabilities")
    return weaker


# (add_key, request_key, keyctl) system call numbers, and the audit architecture seccomp reports.
_KEY_CALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _block_key_calls(libc) -> bool:
    """A seccomp filter that fails ``add_key``, ``request_key`` and ``keyctl`` with EPERM (and, on x86_64, every
    x32 call, which would reach them by other numbers); False where the architecture is not known here."""
    import ctypes

    machine = os.uname().machine
    if machine not in _KEY_CALLS:
        return False

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    load, equal, at_least, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    add_key, request_key, keyctl = _KEY_CALLS[machine]
    steps = [(load, 0, 0, 4), (equal, 0, 5, _AUDIT_ARCH[machine]), (load, 0, 0, 0), (at_least, 4, 0, 0x40000000),
             (equal, 3, 0, add_key), (equal, 2, 0, request_key), (equal, 1, 0, keyctl), (ret, 0, 0, allow),
             (ret, 0, 0, deny)]
    table = (Filter * len(steps))(*[Filter(*step) for step in steps])
    program = Program(len(steps), table)
    if libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        err = ctypes.get_errno()
        raise OSError(err, f"blocking keyring calls: {os.strerror(err)}")
    return True


def _last_capability() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except OSError:
        return 40


def _read_only(libc, path: str, recursive: bool, writable: bool = False) -> None:
    """Make the mount at ``path`` (and every mount below it, if ``recursive``) read-only, or writable again."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    rdonly, at_recursive, at_fdcwd, mount_setattr = 1, 0x8000, -100, 442  # same number on every architecture
    attr = MountAttr(0 if writable else rdonly, rdonly if writable else 0, 0, 0)
    if libc.syscall(mount_setattr, at_fdcwd, path.encode(), at_recursive if recursive else 0,
                    ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"making {path} {'writable' if writable else 'read-only'}: {os.strerror(err)}"
                           + (" (needs Linux 5.12)" if err == 38 else ""))


def verify_sandbox(setup: dict, isolated: bool) -> list[str]:
    """Check the sandbox from inside, as the student's code will find it: the problems found.

    A problem fails the exercise closed. The environment and the interpreter must not be
    writable (a later run would import what lands there); the writable folders must be empty;
    /proc must be private; no capabilities, no new privileges, the user asked for.
    """
    import ctypes

    problems = []
    for folder in dict.fromkeys([*sys.path, sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)]):
        if folder and os.path.isdir(folder) and os.access(folder, os.W_OK):
            problems.append(f"the worker can write {folder}")
    if isolated:
        for top, keep in setup["writable"].items():
            allowed = {os.path.relpath(k, top).split(os.sep)[0] for k in keep}
            try:
                if set(os.listdir(top)) - allowed:
                    problems.append(f"{top} is not empty")
            except OSError:
                continue
        if os.listdir("/proc") and os.readlink("/proc/self") != str(os.getpid()):
            problems.append("/proc is the host's")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(39, 0, 0, 0, 0) != 1:  # PR_GET_NO_NEW_PRIVS
        problems.append("new privileges are possible")
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    if libc.capget(header, data) != 0 or data[0] or data[3]:  # effective capabilities, both words
        problems.append("the worker kept capabilities")
    if setup["uid"] is not None and (os.getuid(), os.geteuid()) != (setup["uid"],) * 2:
        problems.append("the worker did not become its own user")
    calls = _KEY_CALLS.get(os.uname().machine)
    if calls and (libc.syscall(calls[2], 0, -3, 0) != -1 or ctypes.get_errno() != 1):  # KEYCTL_GET_KEYRING_ID
        problems.append("the worker can reach a keyring")
    if isolated and os.path.exists("/proc/keys"):
        with open("/proc/keys") as handle:
            if handle.read(1):
                problems.append("/proc/keys lists the kernel's keys")
    return problems


def own_address_space() -> int:
    """Bytes of address space this process holds (``VmSize``): the interpreter, torch and whatever
    its build maps or reserves (the CUDA build reserves gigabytes it never touches)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def set_limits(limits: dict, own: int) -> dict:
    """Set the resource limits; return how memory is limited (shown with the results).

    The address-space limit is ``own`` (what the worker holds, measured before its sandbox is
    closed, since /proc may be gone after) plus the exercise's budget: it counts what the
    submission allocates, whatever the build of torch reserved while importing.
    """
    import resource

    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (own + limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["nproc"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))  # no POSIX message queue outlives the worker
    return {"kind": "address space", "own_mb": own // mb, "budget_mb": limits["memory_mb"]}


class BlockImports:
    """Meta-path finder: the harness and the reference package cannot be imported."""

    def __init__(self, blocked: set[str], provided: dict) -> None:
        self.blocked, self.provided = blocked, provided

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if fullname in self.provided:
            import importlib.machinery

            return importlib.machinery.ModuleSpec(fullname, self)
        if top in self.blocked:
            raise ImportError(f"`{fullname}` is not available while grading: an answer may not import the "
                              f"course's reference or its grader; write the exercise yourself")
        return None

    def create_module(self, spec):
        import types

        module = types.ModuleType(spec.name)
        module.__dict__.update(self.provided[spec.name])
        module.__path__ = []  # lets `tfm_solution.x` resolve below the package
        return module

    def exec_module(self, module) -> None:
        pass



# ----------------------------------------------------------------------------- fork server

_CLONE_NEWNS, _CLONE_NEWNET, _CLONE_NEWPID, _CLONE_NEWUSER = 0x20000, 0x40000000, 0x20000000, 0x10000000
_CLONE_NEWIPC = 0x08000000


def enter_namespaces(libc) -> bool:
    """New mount, network, IPC and PID namespaces (in a user namespace unless we are root).

    SysV shared memory, semaphores and message queues live in the IPC namespace and go
    with it: nothing a worker leaves there reaches another one.
    """
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWPID | (0 if root else _CLONE_NEWUSER)
    if libc.unshare(flags) != 0:
        return False
    if not root:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)
    return True


def reserve(libc, megabytes: int) -> None:
    """Reserve ``megabytes`` of address space that is never touched (``PROT_NONE``), as the CUDA
    build of torch does on import: the tests' stand-in for that build. Kept for the server's life,
    and every worker inherits it."""
    if megabytes <= 0:
        return
    import ctypes

    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    prot_none, map_private, map_anonymous, map_noreserve = 0, 0x02, 0x20, 0x4000
    address = libc.mmap(None, megabytes << 20, prot_none, map_private | map_anonymous | map_noreserve, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "reserving address space")


def namespaces_work(libc) -> bool:
    """Whether a worker can get the namespaces of its own (tried in a child that exits at once)."""
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    probe = os.fork()
    if probe == 0:
        os._exit(0 if enter_namespaces(libc) else 1)
    _, status = os.waitpid(probe, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    return os.waitstatus_to_exitcode(status) == 0


def mount_points() -> list[str]:
    """Where something is mounted in this process's view (``/proc/self/mountinfo``, octal escapes undone)."""
    import re

    with open("/proc/self/mountinfo") as handle:
        return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) for line in handle]
