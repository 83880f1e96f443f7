"""Chapter 4 — masks (掩码): padding masks, the causal (subsequent) mask and the training ``Batch``."""

from __future__ import annotations

import torch

from .attention import mask_fill_value


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis in which hidden entries get exactly zero weight.

    The hidden scores are *replaced* (not shifted) by the dtype's most negative finite number,
    the rule ``attention`` applies: finite in float16 (where the notes' ``-1e9`` overflows), and
    a row with every entry hidden becomes uniform instead of NaN (which ``-inf`` would give).

    Args:
        scores: ``(..., len_q, len_k)`` floating point.
        mask: broadcastable to ``scores``; nonzero/True = visible, 0/False = hidden.

    Returns:
        Same shape and dtype as ``scores``; every row sums to 1.
    """
    if not scores.is_floating_point():
        raise TypeError(f"scores must be floating point, got {scores.dtype}")
    if mask is not None:
        scores = scores.masked_fill(mask == 0, mask_fill_value(scores.dtype))
    return scores.softmax(dim=-1)


def subsequent_mask(size: int) -> torch.Tensor:
    """Causal mask: position ``i`` may attend to positions ``j <= i`` only.

    Returns a bool tensor of shape ``(1, size, size)``; True = allowed (lower triangle
    and diagonal), False = a future position.
    """
    return torch.ones(1, size, size, dtype=torch.bool).tril()


class Batch:
    """A batch of source and target ids with their masks, ready for teacher forcing.

    Args:
        src: ``(batch, src_len)`` source ids.
        tgt: ``(batch, tgt_len)`` target ids starting with the start symbol, or None at inference.
        pad: the padding id.

    Attributes:
        src_mask: ``(batch, 1, src_len)`` bool, True at real (non-pad) source tokens. It masks
            *keys* only; rows of padded queries are still computed and simply ignored later.
        tgt: ``(batch, tgt_len - 1)`` decoder input (the target without its last token).
        tgt_y: ``(batch, tgt_len - 1)`` labels (the target shifted left by one).
        tgt_mask: ``(batch, tgt_len - 1, tgt_len - 1)`` bool, padding mask AND causal mask.
        ntokens: number of non-pad labels (a 0-dim tensor), the loss normaliser.
    """

    def __init__(self, src: torch.Tensor, tgt: torch.Tensor | None = None, pad: int = 2) -> None:
        self.src = src
        self.src_mask = (src != pad).unsqueeze(-2)
        if tgt is not None:
            self.tgt = tgt[:, :-1]
            self.tgt_y = tgt[:, 1:]
            self.tgt_mask = self.make_std_mask(self.tgt, pad)
            self.ntokens = (self.tgt_y != pad).sum()

    @staticmethod
    def make_std_mask(tgt: torch.Tensor, pad: int) -> torch.Tensor:
        """Hide padding and future words: ``(batch, len) -> (batch, len, len)`` bool."""
        tgt_pad_mask = (tgt != pad).unsqueeze(-2)
        return tgt_pad_mask & subsequent_mask(tgt.size(-1)).to(tgt.device)

    def to(self, device: torch.device | str) -> "Batch":
        """Move every tensor attribute to ``device`` (in place); returns self."""
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device))
        return self
