"""What the chapters' demonstration and check cells run: the student's answer when it works, the
reference while it is a stub or crashes, and one line that says which.

A chapter's cells after an exercise often call the exercise's answer directly (``ffn =
PositionwiseFeedForward(8, 32)``, ``LambdaLR(..., lambda s: rate(s, ...))``). In a student's fresh
notebook that answer is still ``raise NotImplementedError()``, so those cells would stop with a bare
traceback. Instead they ask for the answer through :func:`yours_or_reference`::

    FFN = yours_or_reference(PositionwiseFeedForward)   # the class the cells below use
    ffn = FFN(8, 32, dropout=0.0)

which probes the answer on a small fixed input exactly as the widgets do (``student.resolve``) and
prints the reason the first time it is asked about that answer: "your own", "still a stub, so the
cells below run the reference", or a preview note in the notebooks ``make chapters`` executes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import feed_forward, norm, schedule, training
from ..encoder_decoder import EncoderLayer, make_model
from ..multihead import MultiHeadedAttention
from . import encoder_decoder as ch8
from . import feed_forward as ch6
from . import multihead as ch5
from . import norm as ch7
from . import training as ch9
from .language import said
from .student import fixed_weights, resolve


def _probe_conv1d(fn: Callable) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    w_1, b_1 = torch.randn(16, 4, generator=g), torch.randn(16, generator=g)
    w_2, b_2 = torch.randn(4, 16, generator=g), torch.randn(4, generator=g)
    return fn(torch.randn(2, 5, 4, generator=g), w_1, b_1, w_2, b_2)


def _probe_encoder_layer(cls: Callable) -> torch.Tensor:
    torch.manual_seed(7)
    d = 8

    def parts() -> tuple[MultiHeadedAttention, feed_forward.PositionwiseFeedForward]:
        return MultiHeadedAttention(2, d, 0.0), feed_forward.PositionwiseFeedForward(d, 16, 0.0)

    layer = fixed_weights(cls(d, *parts(), 0.0), 7)
    x = torch.randn(2, 5, d, generator=torch.Generator().manual_seed(7))
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, :]
    with torch.no_grad():
        return layer(x, mask)


#: Answer name -> (the reference, a probe that every correct answer answers alike).
ANSWERS: dict[str, tuple[Callable, Callable[[Callable], Any]]] = {
    "MultiHeadedAttention": (MultiHeadedAttention, ch5._probe_mha),
    "PositionwiseFeedForward": (feed_forward.PositionwiseFeedForward, ch6._probe_ffn),
    "conv1d_feed_forward": (feed_forward.conv1d_feed_forward, _probe_conv1d),
    "gelu": (feed_forward.gelu, ch6._probe_gelu),
    "LayerNorm": (norm.LayerNorm, ch7._probe_layer_norm),
    "EncoderLayer": (EncoderLayer, _probe_encoder_layer),
    "make_model": (make_model, ch8._probe_make_model),
    "LabelSmoothing": (training.LabelSmoothing, ch9._probe_smoothing),
    "rate": (schedule.rate, ch9._probe_rate),
    "train_with_accumulation": (training.train_with_accumulation, ch9._probe_trainer),
}

#: The answers this kernel has already reported on (so that each is explained once, not in every cell).
_told: set[tuple[str, int, str]] = set()


def yours_or_reference(answer: Callable) -> Callable:
    """The student's ``answer`` when it agrees with the reference or runs differently, the reference
    while it is a stub or raises; prints which, once per answer and outcome.

    Args:
        answer: a function or class the student wrote in an exercise cell, under its exercise name
            (a key of ``ANSWERS``).

    Returns:
        The function or class to call in the cells that follow.
    """
    name = getattr(answer, "__name__", "")
    if name not in ANSWERS:
        raise ValueError(f"no reference is known for {name or answer!r}; expected one of {sorted(ANSWERS)}")
    reference, probe = ANSWERS[name]
    with torch.random.fork_rng(devices=[]):   # the probes seed torch; the cells below draw as if no probe ran
        used = resolve(answer, reference, probe, name, purpose="check")
    key = (name, id(answer), used.status)
    if key not in _told:
        _told.add(key)
        print(said(used.message))
    return used.fn
