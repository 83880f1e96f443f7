"""The model's LayerNorm in as few kernels as it can be, with the same numbers.

The notes' flavour, ``a_2 * (x - mean) / (std + eps) + b_2`` with the unbiased standard deviation
and ``eps`` outside the root, costs six kernels written out (mean, std, subtract, add, divide,
scale and shift) and about as many again in its backward pass. Here it is rewritten around
PyTorch's fused layer normalization, which returns ``z = (x - mean) * rstd`` and ``rstd =
1 / sigma_b`` (biased ``sigma_b``) in one pass. With ``k = sqrt(d / (d - 1))`` the unbiased
deviation is ``sigma_u = k * sigma_b``, so

    (x - mean) / (sigma_u + eps) = z / (k + eps * rstd),

the notes' number exactly, eps still outside the root, from one row reduction. The backward pass is
written out by hand (``NotesLayerNormFunction``) in a handful of kernels.

Shapes everywhere: ``(..., d) -> (..., d)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..norm import LayerNorm

# Added to the variance inside the fused kernel only so that a constant row gives rstd = 1e15
# instead of infinity (then 0 * inf = NaN); next to any variance float32 can tell from zero, it
# vanishes, and the notes' own eps is applied exactly, outside the root.
_TINY = 1e-30


_K: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def _k(d: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``sqrt(d / (d - 1))`` as a 0-dim tensor, so that ``den`` is one kernel with no scalar to wrap."""
    key = (d, dtype, device)
    if key not in _K:
        _K[key] = torch.tensor(math.sqrt(d / (d - 1)), dtype=dtype, device=device)
    return _K[key]


def _normalise(x: torch.Tensor, eps: float, a_2: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(z, rstd, den)``: ``z = (x - mean) * rstd`` (times ``a_2`` if given), ``rstd = 1 / sigma_b``
    and ``den = k + eps * rstd`` (both ``(..., 1)``), so that ``z / den`` is the notes' normalisation."""
    d = x.size(-1)
    z, _, rstd = torch.native_layer_norm(x, (d,), a_2, None, _TINY)
    return z, rstd, torch.add(_k(d, rstd.dtype, rstd.device), rstd, alpha=eps)


class NotesLayerNormFunction(torch.autograd.Function):
    """The notes' LayerNorm with a hand-written backward pass.

    With ``n = (x - mean) / s``, ``s = sigma_u + eps``, ``g`` the incoming gradient and
    ``g_n = g * a_2``, the gradient with respect to the input is

        dx = (g_n - mean(g_n) - n * (s / ((d - 1) * sigma_u)) * sum(g_n * n)) / s,

    (means and sums over the feature axis), where ``1 / s = rstd / den`` and
    ``s / ((d - 1) sigma_u) = den / (k (d - 1))``; ``da_2 = sum(g * n)`` and ``db_2 = sum(g)``
    over every other axis.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, a_2: torch.Tensor, b_2: torch.Tensor, eps: float) -> torch.Tensor:
        z, rstd, den = _normalise(x, eps)
        n = z.div_(den)
        ctx.save_for_backward(n, a_2, rstd, den)
        return torch.addcmul(b_2, n, a_2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor):
        n, a_2, rstd, den = ctx.saved_tensors
        d = n.size(-1)
        dx = da = db = None
        if ctx.needs_input_grad[0]:
            g_n = g * a_2
            dot = (g_n * n).sum(-1, keepdim=True).mul_(den).div_(math.sqrt(d / (d - 1)) * (d - 1))
            dx = (g_n - g_n.mean(-1, keepdim=True)).addcmul_(n, dot, value=-1).mul_(rstd / den)
        if ctx.needs_input_grad[1]:
            da = (g * n).reshape(-1, d).sum(0)
        if ctx.needs_input_grad[2]:
            db = g.reshape(-1, d).sum(0)
        return dx, da, db, None


def layer_norm(x: torch.Tensor, norm: LayerNorm) -> torch.Tensor:
    """``norm(x)`` for either flavour of the model's ``LayerNorm``, same numbers, fewer kernels.

    Torch's flavour is one fused kernel already; the notes' takes three: the fused normalisation
    (scaled by ``a_2``), ``den`` and one ``addcdiv`` that divides and shifts by ``b_2``; with a
    gradient to compute, ``NotesLayerNormFunction``.
    """
    if norm.kind == "torch":
        return F.layer_norm(x, (x.size(-1),), norm.a_2, norm.b_2, norm.eps)
    if torch.is_grad_enabled() and (x.requires_grad or norm.a_2.requires_grad or norm.b_2.requires_grad):
        return NotesLayerNormFunction.apply(x, norm.a_2, norm.b_2, norm.eps)
    z, _, den = _normalise(x, norm.eps, norm.a_2)
    return torch.addcdiv(norm.b_2, z, den)


def apply_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """A stack's final norm: a ``LayerNorm`` (Pre-LN) through ``layer_norm``, else the module (Identity)."""
    return layer_norm(x, norm) if isinstance(norm, LayerNorm) else norm(x)
