"""The decoding engine's linear maps ``y = x W^T + b``: one interface, three CPU kernels.

A decoding step is about fifty of these products over weights that do not change, so each weight is
stored once in the layout its kernel reads fastest (measured in ``benchmarks/prepacked_products.py``):

* ``DenseLinear`` with one row (batch 1, greedy): ``torch.addmm`` over the weight stored ``(in, out)``.
  A matrix-vector product streams the weight from memory, and the transposed layout streams faster.
* ``DenseLinear`` with several rows (a batch, or beams): MKL's packed GEMM (``cblas_sgemm_compute``
  through ``torch.ops.mkl._mkl_linear``, the kernel ``torch.compile`` uses for frozen float32
  weights). The weight is re-laid once, for one row count, by ``prepare(rows)``; a packed copy takes
  3 to 9 times the bytes of a base-size weight (about 430 MB for the base decoder's 105 MB), so
  only the latest row count is kept, and small weights (whose packed copies would be many times
  larger) are not packed; ``InferenceEngine(model, prepack=False)`` saves that memory. Where PyTorch
  has no MKL (ARM laptops), or for bfloat16, the product stays ``addmm``.
* ``Int8Linear``: dynamic int8 (``torch.ops.quantized.linear_dynamic``, FBGEMM on x86). The weight is
  quantized once, symmetrically per output row (``scale_j = max_k |W_jk| / 127``); at each call the
  input is quantized per tensor from its own range, multiplied in integers and scaled back to float32,
  the bias added in float32. Each element of ``W`` is off by at most half its row's step, each of
  ``x`` by half the input's step.

Every kernel takes ``x`` of shape ``(rows, in)`` and returns ``(rows, out)``.
"""

from __future__ import annotations

import warnings

import torch

# MKL's packed GEMM needs PyTorch built with both MKL and oneDNN (x86 wheels are).
MKL_PACKING = torch.backends.mkl.is_available() and torch.backends.mkldnn.is_available() and hasattr(
    torch.ops.mkl, "_mkl_linear")
# MKL packs into panels of a fixed size, about 8 MB at the least: a base-size weight packs into 3 to
# 9 times its bytes (512 x 2048: 3.9x, 512 x 512: 8.8x), the course model's small ones (128 x 128)
# into more than 100 times, for a gain of a tenth at most. Weights whose packed copy exceeds this
# many times their size stay unpacked (benchmarks/prepacked_products.py measured the base step's
# products at batch 8: 0.58x F.linear's time all packed, 0.83x with the 512 x 512 ones left out).
PACKED_SIZE_LIMIT = 10


def int8_available() -> bool:
    """Whether this PyTorch has the dynamic int8 linear kernel (FBGEMM on x86, QNNPACK on ARM)."""
    return torch.backends.quantized.engine != "none" and hasattr(torch.ops.quantized, "linear_dynamic")


class DenseLinear:
    """``x W^T + b`` in floating point: ``addmm`` over ``W^T`` for one row, MKL's packed GEMM for more.

    Args:
        weight: ``(out, in)``, as ``nn.Linear`` stores it; bias: ``(out,)``; dtype: the stored copy's.
        prepack: allow MKL-packed copies (``prepare``); False keeps ``addmm`` for every row count.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype, prepack: bool = True) -> None:
        self.weight_t = weight.detach().t().to(dtype).contiguous()  # (in, out)
        self.bias = bias.detach().to(dtype)
        self.prepack = prepack and MKL_PACKING and dtype == torch.float32 and weight.device.type == "cpu"
        self.packed: torch.Tensor | None = None
        self.rows = 1

    def prepare(self, rows: int) -> None:
        """Re-lay the weight for products of ``rows`` rows (a no-op for one row, or when it already is)."""
        if rows == self.rows or not self.prepack:
            return
        self.packed = None  # free the old copy before making the new one
        if rows > 1:
            packed = torch.ops.mkl._mkl_reorder_linear_weight(self.weight_t.t().contiguous(), rows)
            if packed.numel() > PACKED_SIZE_LIMIT * self.weight_t.numel():
                self.prepack = False  # the packed size does not depend on rows: never try again
                return
            self.packed = packed
        self.rows = rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.size(0) == self.rows:
            # The (out, in) weight it asks for is only read for its shape on this path: a view will do.
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight_t.t(), self.bias, self.rows)
        return torch.addmm(self.bias, x, self.weight_t)

    def nbytes(self) -> int:
        """Bytes held: the weight, the bias and the packed copy, if any."""
        own = (self.weight_t.numel() + self.bias.numel()) * self.weight_t.element_size()
        return own + (0 if self.packed is None else self.packed.numel() * 4)  # packing is float32 only


def vnni() -> bool:
    """Whether this CPU has AVX-512 VNNI, whose int8 instruction sums u8 x s8 products in 32 bits."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)  # PyTorch >= 2.6
    return bool(capabilities and capabilities().get("avx512_vnni", False))


class Int8Linear:
    """``x W^T + b`` with ``W`` in int8 (per output row) and ``x`` quantized per call (per tensor).

    Args:
        weight: ``(out, in)`` floating point; bias: ``(out,)``.
        reduce_range: quantize ``x`` to 7 bits instead of 8. Without VNNI, FBGEMM sums pairs of
            u8 x s8 products in 16 bits, which 8-bit inputs can overflow (255 * 127 * 2 > 32767)
            and 7-bit inputs cannot; default: only where the CPU lacks AVX-512 VNNI (the course
            model's greedy tokens on test_2016 agree with float32's at 89% of positions with 7 bits,
            94% with 8; ``benchmarks/int8_quality.py``).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, reduce_range: bool | None = None) -> None:
        w = weight.detach().float()
        out = w.size(0)
        self.scale = (w.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)  # (out,)
        # PyTorch warns that quantized tensors will get a successor API; this is the API it has today.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(w, self.scale.double(), torch.zeros(out, dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, bias.detach().float())
        self.reduce_range = not vnni() if reduce_range is None else reduce_range
        self.shape = tuple(w.shape)

    def prepare(self, rows: int) -> None:
        """Nothing to do: the int8 kernel packs its weight once for every row count."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)

    def nbytes(self) -> int:
        """Bytes of the int8 weight, its row scales and the float32 bias."""
        out, inp = self.shape
        return out * inp + out * 4 + out * 4
