"""Timing helpers shared by ``python -m tfm_solution bench`` and the scripts in ``benchmarks/``.

Ratios are measured side by side in one process, alternating the contenders, so that a
load change on a shared machine hits both alike; each figure is the median of the repeats.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from .decoding import greedy_decode
from .encoder_decoder import EncoderDecoder, make_model
from .experiment import MODEL_SIZES


def machine_facts() -> str:
    """One line: CPU model, cores, torch threads, load average, Python and torch versions."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"{cpu}; {os.cpu_count()} cores; torch {torch.__version__} with {torch.get_num_threads()} threads; "
            f"Python {platform.python_version()}; load average {load}")


def median_times(fns: dict[str, Callable[[], object]], repeat: int = 3, warmup: int = 1) -> dict[str, float]:
    """Median wall seconds of each function, run round-robin ``repeat`` times after ``warmup`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(warmup + repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if r >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def random_model(config: str, vocab: int, kernel: str = "sdpa") -> EncoderDecoder:
    """A model of a named size with random weights, in eval mode."""
    return make_model(vocab, vocab, attention_kernel=kernel, **MODEL_SIZES[config]).eval()


def greedy_runner(model: EncoderDecoder, batch: int, src_len: int, new_tokens: int, use_cache: bool
                  ) -> Callable[[], torch.Tensor]:
    """A closure decoding exactly ``new_tokens`` tokens greedily (no end symbol) for a random batch.

    It returns the ids on the CPU, so on a GPU the timing includes all queued work."""
    vocab = model.src_embed[0].lut.num_embeddings
    device = next(model.parameters()).device
    src = torch.randint(4, vocab, (batch, src_len), generator=torch.Generator().manual_seed(0)).to(device)
    src_mask = torch.ones(batch, 1, src_len, dtype=torch.bool, device=device)
    return lambda: greedy_decode(model, src, src_mask, new_tokens + 1, 1, None, 0, use_cache).cpu()


def cache_speedup_table(config: str, batch: int, new_tokens: int, vocab: int, threads: int, src_len: int = 32,
                        repeat: int = 1, device: str = "cpu") -> str:
    """Cached vs uncached greedy decoding of one setting, as a small text table."""
    torch.set_num_threads(threads)
    model = random_model(config, vocab).to(device)
    cached = greedy_runner(model, batch, src_len, new_tokens, True)
    uncached = greedy_runner(model, batch, src_len, new_tokens, False)
    if not torch.equal(cached(), uncached()):
        raise AssertionError("cached and uncached greedy decoding disagree")
    t = median_times({"uncached": uncached, "cached": cached}, repeat=repeat, warmup=0)
    return (f"{machine_facts()}\nconfig {config} on {device}, batch {batch}, {new_tokens} new tokens, vocab {vocab}\n"
            f"uncached {t['uncached']:.3f} s | cached {t['cached']:.3f} s | "
            f"speedup {t['uncached'] / t['cached']:.1f}x (identical tokens)")
