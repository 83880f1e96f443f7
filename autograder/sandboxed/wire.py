"""The wire format between the grader and a worker: length-prefixed JSON frames plus raw tensor bytes.

A frame is a 4-byte length, a JSON header, then the raw bytes of the tensors the header describes.
Nothing is ever pickled in either direction.
"""

from __future__ import annotations

import json
import os
import struct


# Shared with the harness (it imports this module for these functions only).

LENGTH = struct.Struct(">I")
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
    return LENGTH.pack(len(head)) + head + b"".join(buffers)


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
    (n,) = LENGTH.unpack(read_exact(fd, LENGTH.size))
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
