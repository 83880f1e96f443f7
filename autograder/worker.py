"""The grading worker: the only process that ever runs a student's code.

The harness starts this file as a script (``python -I -S -u -B worker.py``): a fork server that
imports torch once and forks one sandboxed worker per exercise. The harness never imports
it for its side effects, and talks to each worker over two private pipes with the framing
defined here:
a 4-byte length, a JSON header, then the raw bytes of the tensors the header describes.
Nothing is ever pickled in either direction. Everything the worker sends back is data that
the harness checks; nothing the worker says is a verdict.

Start-up order matters, because student code must find the sandbox already closed:
  0. (the fork server) inside bubblewrap's view, which holds only what grading needs (see
     ``sandbox.view_argv``); each worker forked from it inherits that view;
  1. in a mount namespace: private, empty writable folders, everything else read-only, a
     private /proc; then no new privileges, and a user of its own if we were root (else no
     capabilities at all); every step checked;
  2. set the resource limits (memory, CPU, file size, processes, no core files);
  3. check the sandbox from inside and tell the harness (the first frame: no student code
     has run yet, so it cannot be forged); a failed step ends the worker here;
  4. import torch, block imports of the harness and of the reference, install the
     prerequisites the harness sent, and only then execute the student's code.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import struct
import sys

# ----------------------------------------------------------------------------- wire format
# Shared with the harness (it imports this module for these functions only).

_LEN = struct.Struct(">I")
MAX_FRAME_BYTES = 256 * 1024 * 1024

# torch dtypes allowed on the wire, by name; numpy-compatible item sizes.
WIRE_DTYPES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
MAX_STRING_CHARS = 1000  # a string argument or result on the wire


def encode_frame(header: dict, buffers: list[bytes]) -> bytes:
    """One message: header JSON (which must describe ``buffers``' lengths) + raw buffers."""
    head = json.dumps(header, allow_nan=False).encode()
    return _LEN.pack(len(head)) + head + b"".join(buffers)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exact(fd: int, n: int) -> bytes:
    """Read exactly ``n`` bytes from ``fd``; ``EOFError`` if the other side is gone."""
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> tuple[dict, list[bytes]]:
    """Inverse of :func:`encode_frame` (blocking). Rejects oversized or malformed frames."""
    (n,) = _LEN.unpack(read_exact(fd, _LEN.size))
    if n > MAX_FRAME_BYTES:
        raise ValueError("frame header too large")
    header = json.loads(read_exact(fd, n))
    sizes = header.get("buffers", [])
    if not isinstance(sizes, list) or not all(isinstance(s, int) and 0 <= s for s in sizes):
        raise ValueError("malformed buffer list")
    if sum(sizes) > MAX_FRAME_BYTES:
        raise ValueError("frame payload too large")
    return header, [read_exact(fd, s) for s in sizes]


def pack_value(value, buffers: list[bytes], max_bytes: int):
    """JSON-able tree for ``value``; tensors become ``{"tensor": i, ...}`` + a raw buffer.

    Tensors are copied into plain, dense, contiguous CPU tensors first (``torch.Tensor``
    subclasses and ``__torch_function__`` overrides are stripped), so what crosses is bytes.
    Strings (at most ``MAX_STRING_CHARS``) and torch dtypes (those of ``WIRE_DTYPES``) cross by
    name: an argument such as ``norm_position="post"`` or ``torch.float16`` reaches the answer.
    """
    import torch

    if isinstance(value, torch.Tensor):
        with torch._C.DisableTorchFunction():
            plain = value.detach()
            if type(plain) is not torch.Tensor:
                plain = torch.Tensor._make_subclass(torch.Tensor, plain)
            plain = plain.to("cpu").contiguous()
            name = str(plain.dtype).removeprefix("torch.")
            if name not in WIRE_DTYPES:
                return {"unsupported": f"tensor of dtype {name}"}
            nbytes = plain.numel() * WIRE_DTYPES[name]
            if nbytes + sum(len(b) for b in buffers) > max_bytes:
                return {"unsupported": f"tensor of shape {list(plain.shape)} is larger than the size cap"}
            raw = plain.reshape(-1).view(torch.uint8).numpy().tobytes() if plain.numel() else b""  # 0-dim too
        buffers.append(raw)
        return {"tensor": len(buffers) - 1, "dtype": name, "shape": list(plain.shape)}
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        if len(value) > 64:
            return {"unsupported": f"a {type(value).__name__} of {len(value)} items"}
        return {"seq": [pack_value(v, buffers, max_bytes) for v in value]}
    if type(value) is str:
        if len(value) > MAX_STRING_CHARS:
            return {"unsupported": f"a string of {len(value)} characters"}
        return {"str": value}
    if type(value) is torch.dtype:
        name = str(value).removeprefix("torch.")
        return {"torch_dtype": name} if name in WIRE_DTYPES else {"unsupported": f"the dtype {name}"}
    if type(value) in (bool, int) or (type(value) is float and value == value and abs(value) != float("inf")):
        return {"scalar": value}
    if type(value) is float:
        return {"float": repr(value)}  # nan / inf: JSON has no literal for them
    if value is None:
        return {"none": True}
    if type(value) is Unsupported:
        return {"unsupported": value.why}
    return {"unsupported": f"a value of type {type(value).__name__}"}


def unpack_value(tree, buffers: list[bytes]):
    """Inverse of :func:`pack_value` (used on both sides; builds fresh tensors from bytes)."""
    import torch

    if not isinstance(tree, dict):
        raise ValueError("malformed value")
    if "tensor" in tree:
        name, shape = tree["dtype"], tree["shape"]
        if name not in WIRE_DTYPES or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise ValueError("malformed tensor")
        raw = buffers[tree["tensor"]]
        count = 1
        for s in shape:
            count *= s
        if len(raw) != count * WIRE_DTYPES[name]:
            raise ValueError("tensor bytes do not match its shape")
        if isinstance(raw, memoryview) and not raw.readonly and len(raw):
            # A slice of the one buffer a reply was read into: used in place, never copied per value.
            flat = torch.frombuffer(raw, dtype=torch.uint8)
            if flat.data_ptr() % WIRE_DTYPES[name] == 0:
                return flat.view(getattr(torch, name)).reshape(shape)
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if len(raw) else torch.empty(0, dtype=torch.uint8)
        return flat.view(getattr(torch, name)).reshape(shape).clone()
    if "seq" in tree:
        return tuple(unpack_value(v, buffers) for v in tree["seq"])
    if "scalar" in tree:
        return tree["scalar"]
    if "float" in tree:
        return float(tree["float"])
    if "str" in tree:
        if not isinstance(tree["str"], str) or len(tree["str"]) > MAX_STRING_CHARS:
            raise ValueError("malformed string")
        return tree["str"]
    if "torch_dtype" in tree:
        if tree["torch_dtype"] not in WIRE_DTYPES:
            raise ValueError("malformed dtype")
        return getattr(torch, tree["torch_dtype"])
    if "none" in tree:
        return None
    if "module" in tree:
        return tree  # resolved by the worker: see build_module_arg
    return Unsupported(str(tree.get("unsupported", "malformed value")))


class Unsupported:
    """Stands for a returned value that could not cross the boundary (with why)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"<{self.why}>"


# ----------------------------------------------------------------------------- sandbox set-up

def _close_sandbox(setup: dict, isolated: bool) -> list[str]:
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


def _verify_sandbox(setup: dict, isolated: bool) -> list[str]:
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


def _set_limits(limits: dict, own: int) -> dict:
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


class _BlockImports:
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


class _Scale:
    """Deterministic stand-in for a dropout module: multiplies its input by ``factor``."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


class FixedDropout:
    """Deterministic stand-in for every dropout call (``nn.Dropout`` and ``F.dropout`` alike).

    ``nn.Dropout`` calls ``torch.nn.functional.dropout``; both that and ``torch.dropout`` are
    replaced, so a module's dropouts and a functional one are treated the same. The k-th call
    after ``reset(seed)`` keeps the entries where a uniform draw from the generator seeded with
    ``(seed, k)`` is at least ``p`` and scales them by ``1 / (1 - p)``: the reference (in the
    harness) and the submission (here) drop the same entries when they call dropout at the
    same places with the same ``p``, while a dropout that is missing, doubled, misplaced or
    given another ``p`` changes the output. ``training=False`` is the identity, as in PyTorch.
    Used as a context manager, it is installed only inside the ``with`` block.
    """

    def __init__(self, seed: int = 0) -> None:
        self.reset(seed)
        self._saved: tuple | None = None

    def reset(self, seed: int) -> None:
        self.seed, self.calls = seed, 0

    def __call__(self, input, p=0.5, training=True, inplace=False, *, train=None):  # noqa: A002 - torch's names
        import torch

        if train is not None:  # torch.dropout(input, p, train)
            training = train
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        if not training:
            return input
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)
        self.calls += 1
        keep = torch.rand(input.shape, generator=gen) >= p
        factor = (keep / (1.0 - p) if p < 1.0 else torch.zeros(input.shape)).to(input.dtype)
        return input.mul_(factor) if inplace else input * factor

    def install(self) -> None:
        import torch

        self._saved = (torch.nn.functional.dropout, torch.dropout)
        torch.nn.functional.dropout = torch.dropout = self

    def __enter__(self) -> FixedDropout:
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.nn.functional.dropout, torch.dropout = self._saved


def _marked_convolution():
    """Stand-in for torch's 1-D convolution (``torch.conv1d`` and ``torch.nn.functional.conv1d``, one
    function, which ``nn.Conv1d`` calls too): ``(install, marking)``.

    ``install()`` puts it in place of the real one; the worker does so before the student's code runs
    (``from torch.nn.functional import conv1d`` gets it) and again before every request. Inside
    ``marking(key)`` the k-th call returns the real convolution plus a mark, one number added to every
    element: ``0.5 + sum(input * R) + sum(weight * S)``, with ``R`` and ``S`` drawn for call k from a
    generator seeded with ``key`` (a secret of the grader's that only the request carries) and scaled so
    the mark stays near 1. A case that marks it (``Case.marked``) runs the answer here and the reference in
    the harness with the same key, so an answer whose result the convolutions compute carries the same
    marks, call by call (the bias, given to conv1d or added after it, does not enter: both ways are right).
    One computed any other way misses them: ``@``, ``matmul``, ``einsum``, ``F.linear``, a convolution
    called on the side and thrown away, and a call made to learn a mark (it uses up that call's draw, and
    on other inputs than the real ones shows another mark). The marks' state lives in this closure, not in
    an attribute; reaching into closures or frames is refused before the answer runs (``autograder.reach``).
    """
    import torch

    real = torch.conv1d
    state: list = [None, 0]  # the key while marking, and how many calls were marked

    def mark(tensor, draw: torch.Generator):
        weights = torch.rand(tensor.shape, generator=draw, dtype=torch.float64) * 2 - 1
        return float((tensor.detach().double() * weights).sum()) / max(tensor.numel(), 1)

    def conv1d(input, weight, *args, **kwargs):
        out = real(input, weight, *args, **kwargs)
        if state[0] is None:
            return out
        draw = torch.Generator().manual_seed((state[0] + 7919 * state[1]) % (1 << 63))
        state[1] += 1
        return out + (0.5 + mark(input, draw) + mark(weight, draw))

    def install() -> None:
        torch.conv1d = torch.nn.functional.conv1d = conv1d

    @contextlib.contextmanager
    def marking(key: int):
        saved = (torch.conv1d, torch.nn.functional.conv1d)
        install()
        state[:] = [key, 0]
        try:
            yield
        finally:
            state[:] = [None, 0]
            torch.conv1d, torch.nn.functional.conv1d = saved

    return install, marking


_MARK_FACTORIES = {"conv1d": _marked_convolution}
_MARKS: dict = {}


def marks(name: str):
    """``(install, marking)`` of the stand-in for the torch function ``name`` a case may mark
    (``Case.marked``), made once per process."""
    if name not in _MARKS:
        _MARKS[name] = _MARK_FACTORIES[name]()
    return _MARKS[name]


MAX_STRUCTURE_ENTRIES, MAX_NAME_CHARS, MAX_BUILDS = 256, 200, 8
MAX_MODULE_DEPTH = 32  # nesting of submodules a walk follows (a module inside itself ends there)


def walk_module(module) -> dict:
    """A module's tensors, read from the modules' own ``_parameters``, ``_buffers`` and ``_modules``
    dicts (with ``dict``'s and ``object``'s functions), never through the instance's methods, which a
    submission may override to describe something else than what it holds.

    ``{"parameters": [(name, tensor)], "buffers": [(name, tensor)], "state_dict": [(key, tensor)],
    "all": {name: tensor}}``, as ``named_parameters``, ``named_buffers`` and ``state_dict`` would list
    them for a plain ``nn.Module``: a module or tensor reached twice is listed once by the first two
    and under every name by ``state_dict``; non-persistent buffers are left out of it.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"the object built is a {type(module).__name__}, not a torch.nn.Module")
    found: dict = {"parameters": [], "buffers": [], "state_dict": [], "all": {}}
    seen_modules: set[int] = set()
    seen = {"parameters": set(), "buffers": set()}

    def own(m, key: str, kind: type):
        value = object.__getattribute__(m, "__dict__").get(key)
        return value if isinstance(value, kind) else kind()

    def visit(m, prefix: str, depth: int, listed: bool) -> None:
        if depth > MAX_MODULE_DEPTH or len(found["all"]) > 16 * MAX_STRUCTURE_ENTRIES:
            raise ValueError("modules nested too deep, or too many of them (a module inside itself?)")
        listed = listed and id(m) not in seen_modules
        seen_modules.add(id(m))
        transient = own(m, "_non_persistent_buffers_set", set)
        for kind, table in (("parameters", "_parameters"), ("buffers", "_buffers")):
            for name, tensor in dict.items(own(m, table, dict)):
                if not isinstance(tensor, torch.Tensor):
                    continue
                full = prefix + str(name)
                found["all"].setdefault(full, tensor)
                if listed and id(tensor) not in seen[kind]:
                    seen[kind].add(id(tensor))
                    found[kind].append((full, tensor))
                if kind == "parameters" or not set.__contains__(transient, name):
                    found["state_dict"].append((full, tensor))
        for name, child in dict.items(own(m, "_modules", dict)):
            if isinstance(child, torch.nn.Module):
                visit(child, f"{prefix}{name}.", depth + 1, listed)

    visit(module, "", 0, True)
    return found


def _shape(tensor) -> list[int]:
    import torch

    with torch._C.DisableTorchFunction():
        return list(torch.Tensor.size(tensor))


def describe_structure(module) -> dict:
    """A module's parameters, buffers and ``state_dict``: names, shapes, ``requires_grad`` (JSON data).

    ``{"parameters": [[name, shape, requires_grad], ...], "buffers": [[name, shape], ...],
    "state_dict": [[key, shape or None], ...]}``; what the structure check compares. Read by
    ``walk_module``, not by the module's own (overridable) methods.
    """
    import torch

    found = walk_module(module)
    with torch._C.DisableTorchFunction():
        return {
            "parameters": [[str(n)[:MAX_NAME_CHARS], _shape(p), bool(torch.Tensor.requires_grad.__get__(p))]
                           for n, p in found["parameters"][:MAX_STRUCTURE_ENTRIES]],
            "buffers": [[str(n)[:MAX_NAME_CHARS], _shape(b)] for n, b in found["buffers"][:MAX_STRUCTURE_ENTRIES]],
            "state_dict": [[str(k)[:MAX_NAME_CHARS], _shape(v)]
                           for k, v in found["state_dict"][:MAX_STRUCTURE_ENTRIES]],
        }


def initial_values(module, names: list[str]) -> tuple:
    """The tensors ``names`` of ``module`` as built (``walk_module``), in chunks of at most 64 (what a
    tuple on the wire may hold); a name the module lacks is ``None``."""
    everything = walk_module(module)["all"]
    values = [everything.get(n) for n in names]
    values = [v.detach().clone() if v is not None else None for v in values]
    return tuple(tuple(values[i:i + 64]) for i in range(0, len(values), 64))


def load_fitting(module, state: dict) -> list[str]:
    """Load the entries of ``state`` whose name and shape fit ``module``; return the names that did not.

    Not strict: a ``state_dict`` that differs from the reference's costs the structure line,
    and the other cases judge what the module computes with the weights it could take. The
    module's tensors are found by ``walk_module`` and copied into directly.
    """
    import torch

    own = dict(walk_module(module)["state_dict"])
    loaded = set()
    with torch.no_grad(), torch._C.DisableTorchFunction():
        for key, tensor in own.items():
            value = state.get(key)
            if value is not None and _shape(tensor) == _shape(value):
                torch.Tensor.copy_(tensor, value)
                loaded.add(key)
    return sorted({*(k for k in own if k not in loaded), *(k for k in state if k not in loaded)})


def run_graded(target, args: list, kwargs: dict, gradients: list[str] | None, seed: int, module=None,
               inputs: list[int] | None = None) -> tuple:
    """Call ``target`` as a graded case does, here and in the harness alike: ``(answer, (args, kwargs)
    as the callee received them)``.

    ``gradients is None``: a plain call without autograd. Otherwise (a training-mode case) every
    floating-point result is followed by gradients: for each result in turn (one, or each item of a
    returned tuple), the gradients of ``(probe * result).sum()``, for a probe drawn from ``seed``, with
    respect to the floating-point arguments (those at ``inputs``, if given) and to the parameters named
    in ``gradients``: zeros where no gradient arrives (something detached, cut with ``.data`` or run
    under ``no_grad``), ``None`` for a parameter the module lacks. The answer is ``(result, gradients
    ...)``, or ``(*results, gradients through the first, through the second, ...)`` for a tuple. The
    parameters are ``module``'s when ``target`` is one of its methods or submodules, else ``target``'s
    own, found by ``walk_module``.
    """
    import torch

    if gradients is None:
        with torch.no_grad():
            return target(*args, **kwargs), (args, kwargs)
    chosen = range(len(args)) if inputs is None else inputs
    leaves = [a.detach().clone().requires_grad_() if i in chosen and isinstance(a, torch.Tensor)
              and a.is_floating_point() else None for i, a in enumerate(args)]
    # The callee gets a non-leaf copy, as it would in a model (whether it changes it is checked apart).
    given = [a if leaf is None else leaf.clone() for a, leaf in zip(args, leaves)]
    output = target(*given, **kwargs)
    many = isinstance(output, tuple)
    outputs = output if many else (output,)
    if not any(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outputs):
        return output, (given, kwargs)
    owner = target if module is None else module
    parameters = dict(walk_module(owner)["parameters"]) if isinstance(owner, torch.nn.Module) else {}
    wanted = [leaf for leaf in leaves if leaf is not None] + [parameters.get(n) for n in gradients]
    active = [t for t in wanted if t is not None and t.requires_grad]
    grads: list = []
    for i, out in enumerate(outputs):
        if not (isinstance(out, torch.Tensor) and out.is_floating_point()):
            continue
        found: dict[int, torch.Tensor] = {}
        if out.requires_grad and active:
            probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 7919 * i)).to(out.dtype)
            # A scalar, not grad_outputs=probe: that path imports sympy, seconds on a worker's first call.
            got = torch.autograd.grad((probe * out).sum(), active, allow_unused=True, retain_graph=True)
            found = {id(t): g for t, g in zip(active, got) if g is not None}
        grads += [None if t is None else found.get(id(t), torch.zeros_like(t)) for t in wanted]
    detached = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outputs)
    return (*detached, *grads), (given, kwargs)


class Generators:
    """Seeds torch's, Python's and NumPy's global generators with ``seed`` on entry; on exit keeps
    their states in ``after`` (what the harness compares with the states of that seed: a call that
    drew random numbers or reseeded a generator changed them) and puts back the states found on entry.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.after: tuple = ()

    def __enter__(self) -> Generators:
        import random

        import numpy
        import torch

        self._saved = (torch.get_rng_state(), random.getstate(), numpy.random.get_state())
        torch.default_generator.manual_seed(self.seed)
        random.seed(self.seed)
        numpy.random.seed(self.seed % 2**32)
        return self

    def __exit__(self, *exc) -> None:
        import random

        import numpy
        import torch

        self.after = generator_states(torch.get_rng_state(), random.getstate(), numpy.random.get_state())
        torch.set_rng_state(self._saved[0])
        random.setstate(self._saved[1])
        numpy.random.set_state(self._saved[2])


def generator_states(torch_state, python_state, numpy_state) -> tuple:
    """``(torch, Python, NumPy)`` generator states as three plain tensors (what crosses the wire)."""
    import numpy
    import torch

    version, words, gauss = python_state
    _, keys, pos, has_gauss, _ = numpy_state
    return (torch_state.clone(), torch.from_numpy(numpy.array([*words, gauss is not None], dtype=numpy.int64)),
            torch.from_numpy(numpy.concatenate([keys.astype(numpy.int64), numpy.array([pos, has_gauss])])))


def _attribute(obj, name: str):
    """``obj.name`` for the answer, or what stands for it when there is none."""
    try:
        return getattr(obj, name)
    except Exception:  # noqa: BLE001 - a missing attribute, or a property that raises
        return Unsupported(f"no attribute `{name}`")


def answer(target, request: dict, args: list, kwargs: dict, construct: list | None, state: dict | None,
           classes: dict) -> tuple:
    """What a request asks of ``target`` (the answer in the worker, the reference in the harness):
    ``(value, structures or None, names of weights that did not fit)``.

    A ``structure`` request builds ``target`` with each argument tuple of ``args``: the structures, and
    as value the initial tensors named in ``request["init"]`` (one list per build). A ``measure`` builds it
    (seeded) and turns it into data (``MEASURES``). Otherwise the module built with ``construct`` gets
    ``state`` (``load_fitting``), is converted to float64 (``double``) and put in training or eval mode;
    then ``target``, the module or its ``method``, is called on the case's arguments (``run_graded``), or
    run by a ``driver``. With ``watch``, the value is ``(answer, facts)``: the arguments after the call,
    the generators' states after it (``Generators``) and the module's attributes named in ``keep``.
    """
    import torch

    seed = request["seed"]
    if request.get("structure"):  # the module as built by each argument tuple, no weights loaded
        builds = args[:MAX_BUILDS]
        names = request.get("init") or [[] for _ in builds]
        modules = [target(*b) for b in builds]
        return (tuple(initial_values(m, list(n)) for m, n in zip(modules, names)),
                [describe_structure(m) for m in modules], [])
    if request.get("measure") is not None:  # the object as built is the answer, turned into data

        def build(s: int):
            torch.default_generator.manual_seed(s)
            return target(*construct)

        return MEASURES[request["measure"]](build, seed), None, []
    watch = Generators(seed) if request.get("watch") else None
    built, unloaded, received = None, [], None
    if construct is not None:
        target = built = target(*construct)
    if request.get("driver") is not None:  # the answer is called by a fixed procedure
        with watch or _Nothing():
            result = DRIVERS[request["driver"]](target, args, classes)
    else:
        if built is not None:
            unloaded = [str(k)[:MAX_NAME_CHARS] for k in load_fitting(built, state or {})]
            if request.get("double"):
                torch.nn.Module.double(built)
            built.train(bool(request.get("train")))
            if request.get("method"):  # a method or submodule of what was built is called
                target = getattr(built, str(request["method"]))
        with watch or _Nothing(), contextlib.ExitStack() as marked:
            for mark in request.get("marked") or ():
                marked.enter_context(marks(str(mark))[1](int(request["mark_key"])))
            result, received = run_graded(target, args, kwargs, request.get("gradients"), seed, built,
                                          request.get("inputs"))
    if request.get("attributes"):  # a class exercise: its instance's attributes are the answer
        result = tuple(getattr(result, a) for a in request["attributes"])
    if watch is not None:
        after = None
        if received is not None:
            given, named = received
            after = (tuple(a if isinstance(a, torch.Tensor) else None for a in given),
                     tuple(named[k] if isinstance(named[k], torch.Tensor) else None for k in sorted(named)))
        kept = tuple(_attribute(built, str(a)) for a in request.get("keep") or ())
        result = (result, (after, watch.after, kept))
    return result, None, unloaded


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


MAX_DESCRIPTION_DEPTH = 6


def build_module_arg(tree, classes: dict | None = None, depth: int = 0):
    """A module described by a case, built here: ``{"module": "scale", "factor": f}`` is the
    dropout-like stand-in ``_Scale``; ``{"module": "Name", **kwargs}`` is ``classes["Name"](**kwargs)``,
    its keyword values built the same way (a description may nest others). ``classes`` holds the
    reference's objects: the prerequisites in the worker, ``tfm_solution`` in the harness, so both
    sides build the same sublayers from the same description. Tuples are built item by item;
    anything else is returned as it is.
    """
    if depth > MAX_DESCRIPTION_DEPTH:
        raise ValueError("module description nested too deep")
    if isinstance(tree, dict) and "module" in tree:
        name = tree["module"]
        if name == "scale":
            return _Scale(float(tree["factor"]))
        if not isinstance(name, str) or name not in (classes or {}):
            raise ValueError(f"unknown module argument {str(name)[:MAX_NAME_CHARS]!r}")
        return classes[name](**{str(k): build_module_arg(v, classes, depth + 1) for k, v in tree.items()
                                if k != "module"})
    if isinstance(tree, tuple):
        return tuple(build_module_arg(t, classes, depth + 1) for t in tree)
    return tree


def matrices(model) -> tuple:
    """The parameters of ``model`` with more than one dimension, as built (found by ``walk_module``)."""
    return tuple(p.detach().clone() for _, p in walk_module(model)["parameters"] if len(_shape(p)) > 1)


def xavier_draws(build, seed: int) -> tuple:
    """A ``measure="xavier"`` case: ``(the matrices of build(seed), whether build(seed + 1) gave the same
    ones)``: initial weights must be drawn from the generator as the caller seeded it, so two seeds give
    two models; a function that reseeds the generator itself gives one model whatever the caller did."""
    import torch

    first, second = matrices(build(seed)), matrices(build(seed + 1))
    same = len(first) == len(second) and all(_shape(a) == _shape(b) and torch.equal(a, b)
                                             for a, b in zip(first, second))
    return first, same


MEASURES = {"xavier": xavier_draws}
"""What a ``Case.measure`` turns the object built by ``build(seed)`` into before it crosses: plain data only."""


def train_accumulated(fn, args: list, classes: dict) -> tuple:
    """Drive a ``train_with_accumulation(model, batches, loss_compute, optimizer, scheduler, accum_iter)``
    (chapter 9) as a ``driver="accumulation"`` case does, here and in the harness alike.

    ``args`` = ``(model, micro-batches ((src, tgt), ...), accum_iter, lr)``, the model built (seeded)
    from its description. It trains in float64 and arrives in eval mode (the function must switch it
    to training). The loss is the summed negative log-likelihood of the real labels through the
    reference's ``SimpleLossCompute``; the optimizer is SGD with momentum (its step is proportional to
    the gradient, unlike Adam's) and the schedule ``LambdaLR`` with ``1 / (1 + step)``, so stepping it
    per micro-batch shows. Returns ``(every parameter, flattened; the learning rate after; what fn returned)``.
    """
    import torch

    model, micro, accum_iter, lr = args
    model = model.double().eval()
    pad = 2  # the course's <blank>
    batches = [classes["Batch"](src, tgt, pad) for src, tgt in micro]

    def summed_nll(log_probs, labels):
        return torch.nn.functional.nll_loss(log_probs, labels, ignore_index=pad, reduction="sum")

    loss_compute = classes["SimpleLossCompute"](model.generator, summed_nll)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    returned = fn(model, iter(batches), loss_compute, optimizer, scheduler, accum_iter)
    parameters = torch.cat([p.detach().flatten() for p in model.parameters()])
    # The rate as a 0-dim tensor: a difference is then reported by its size, as every other number's.
    return parameters, torch.tensor(float(optimizer.param_groups[0]["lr"]), dtype=torch.float64), returned


_TRAINED: dict = {}
"""Chapter 12's runs, by task: the cases of one worker share one training run (one translation)."""


def _located(exc: BaseException) -> RuntimeError:
    """``exc`` with where in the student's code it was raised (the innermost of their cells on the stack)."""
    import traceback

    theirs = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(("/", "<"))]
    where = f" (raised in {theirs[-1].filename}, line {theirs[-1].lineno}, in `{theirs[-1].name}`)" if theirs else ""
    return RuntimeError(f"{type(exc).__name__}: {exc}{where}"[:2000])


def capstone_reversal(fn, args: list, classes: dict) -> tuple:
    """Chapter 12, Part A: train the submission's own model with its own loop on the reversal task
    (``tfm_solution.capstone.train_reversal``), then decode held-out sequences with its greedy decoders.

    ``args`` = ``(task, eval_seed)``. Everything the model computes comes from the submission's
    namespace; the course's procedure only draws the data, counts the optimizer's steps and decodes with
    its own greedy loop (the graded accuracy). One training run serves every case of this worker.
    Returns ids, never shares (the harness scores them against the sequences it draws itself):
    ``(the course loop's ids, their cached ids, teacher-forced predictions, cached tokens/s, uncached
    tokens/s, training CPU seconds, optimizer steps taken, planned steps, loss curve (chunks + 1, 2),
    their uncached ids)``.
    """
    import torch

    task, eval_seed = args
    parts = vars(sys.modules["submission"])
    try:
        key = repr(task)
        if key not in _TRAINED:
            _TRAINED[key] = classes["train_reversal"](parts, task)
        trained = _TRAINED[key]
        found = classes["evaluate_reversal"](parts, trained.model, task, int(eval_seed))
    except Exception as exc:  # noqa: BLE001 - reported with where it happened in the student's code
        raise _located(exc) from None
    return (found.greedy, found.cached, found.forced, found.tokens_per_s, found.uncached_tokens_per_s,
            trained.train_cpu_s, trained.steps, trained.planned_steps,
            torch.tensor(trained.curve, dtype=torch.float64), found.theirs)


def capstone_translation(fn, args: list, classes: dict):
    """Chapter 12, Part B: load the submitted weights into the submission's own model (built by its
    ``make_model`` at the course model's size) and translate with the course's beam-search loop over
    its model, its causal mask and its ``beam_step`` (``tfm_solution.capstone.translate_part_b``).

    ``args`` = ``(names, *weights, sources, config)``: the weights' names (a description the
    worker builds), one tensor per name, the source ids ``(sentences, longest)`` padded, and the
    decoding settings. Returns the output ids ``(sentences, longest output)``, padded; the cases of
    one worker share one translation.
    """
    names = args[0]
    weights = dict(zip(names, args[1:1 + len(names)], strict=True))
    sources, config = args[1 + len(names):]
    key = ("translation", repr(config), tuple(sources.shape))
    try:
        if key not in _TRAINED:
            _TRAINED[key] = classes["translate_part_b"](vars(sys.modules["submission"]), weights, sources, config)
    except Exception as exc:  # noqa: BLE001 - reported with where it happened in the student's code
        raise _located(exc) from None
    return _TRAINED[key]


DRIVERS = {"accumulation": train_accumulated, "reversal": capstone_reversal, "translation": capstone_translation}
"""What a ``Case.driver`` runs around the answer instead of calling it on the case's arguments."""


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
        weaker = _close_sandbox(setup, isolated)
        os.chdir(setup["cwd"])
        memory = _set_limits(setup["limits"], own)
        problems = _verify_sandbox(setup, isolated)
    except Exception as exc:  # noqa: BLE001 - any failed step: say which, and run nothing
        problems, weaker = [f"{type(exc).__name__}: {exc}"[:500]], []
    # The first frame, written before any student code runs, so it cannot be forged.
    write_all(resp_fd, encode_frame({"sandbox": {"ok": not problems, "problems": problems,
                                                 "weaker": weaker, "memory": memory}}, []))
    if problems:
        return

    import types

    import torch  # already imported by the fork server: free here

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
    sys.meta_path.insert(0, _BlockImports(set(setup["blocked"]), modules))
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
    name = setup["name"]
    found = name in namespace
    write_all(resp_fd, encode_frame({"ready": True, "found": found, "errors": errors,
                                    "type": type(namespace.get(name)).__name__}, []))
    sys.stdin = open(os.devnull)  # noqa: SIM115 - `input()` gets EOF at once
    while True:
        request, buffers = read_frame(req_fd)
        install_convolution()  # again before each request: the student's code may have put something else there
        reply, out = respond(namespace, name, request, buffers, provided_names, setup["max_result_bytes"], dropout)
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


# ----------------------------------------------------------------------------- fork server

_CLONE_NEWNS, _CLONE_NEWNET, _CLONE_NEWPID, _CLONE_NEWUSER = 0x20000, 0x40000000, 0x20000000, 0x10000000
_CLONE_NEWIPC = 0x08000000


def _enter_namespaces(libc) -> bool:
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
    if isolate and not _enter_namespaces(libc):
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


def _reserve(libc, megabytes: int) -> None:
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


def _namespaces_work(libc) -> bool:
    """Whether a worker can get the namespaces of its own (tried in a child that exits at once)."""
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    probe = os.fork()
    if probe == 0:
        os._exit(0 if _enter_namespaces(libc) else 1)
    _, status = os.waitpid(probe, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    return os.waitstatus_to_exitcode(status) == 0


def _mount_points() -> list[str]:
    """Where something is mounted in this process's view (``/proc/self/mountinfo``, octal escapes undone)."""
    import re

    with open("/proc/self/mountinfo") as handle:
        return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) for line in handle]


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
    _reserve(libc, int(hello.get("reserve_mb", 0)))
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back here to be reaped
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    namespaces = hello["view"] and _namespaces_work(libc)
    sock.send(json.dumps({"namespaces": namespaces, "root": os.geteuid() == 0,
                          "mounts": _mount_points() if hello["view"] else []}).encode())
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
