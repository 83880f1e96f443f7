"""Greedy decoding with and without the KV cache against length, and the cache's two layouts.

Usage: python scripts/kv_cache_timing.py [--quick] [--out PATH]

For the course model and for a model of the paper's base size (random weights: the time does not
depend on them), decodes exactly L new tokens (no end symbol) of one 20-token source, for several
L, with the cache and without it, alternating the two, and keeps the fastest of a few repeats. The
time is the process's CPU time (one thread), not the wall clock: on a shared machine the wall clock
also counts the time other jobs hold the CPU. Fits the exponent b of time ~ L^b to every length but
the shortest. Then times the cache grown by concatenation against a buffer preallocated for the whole
length (a length pointer marks the filled part), again side by side. Last, real sentences: the
reference ``greedy_decode`` of the course model, with and without the cache, on the 40 validation
sentences stored by ``scripts/decoding_quality.py``, one sentence at a time and all in one batch.

Writes ``tfm_solution/assets/kv_cache_timing.json`` (a few kilobytes); chapter 11 loads it.
Seeded; the times depend on the machine, their ratios much less. One thread. About 10 minutes on
two busy CPU cores (``--quick``: a minute, fewer lengths).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

import torch

from tfm_solution.course_model import course_model_config, load_course_model
from tfm_solution.data import BOS, EOS, PAD, pad_batch
from tfm_solution.decoding import IncrementalDecoder, greedy_decode
from tfm_solution.encoder_decoder import EncoderDecoder, make_model

OUT = Path(__file__).resolve().parents[1] / "tfm_solution" / "assets" / "kv_cache_timing.json"
SRC_LEN = 20


def decode_seconds(model: EncoderDecoder, src: torch.Tensor, new_tokens: int, use_cache: bool,
                   capacity: int | None = None) -> float:
    """CPU seconds to decode ``new_tokens`` tokens greedily (encoding included)."""
    start = time.process_time()
    with torch.no_grad():
        dec = IncrementalDecoder(model, src, torch.ones(1, 1, src.size(1), dtype=torch.bool), use_cache, capacity)
        ys = torch.full((1, 1), BOS)
        for _ in range(new_tokens):
            ys = torch.cat([ys, dec.step(ys).argmax(-1, keepdim=True)], dim=1)
    return time.process_time() - start


def fastest(runs: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """The fastest of ``repeats`` rounds for each run, the runs alternating within a round."""
    best = {name: math.inf for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            best[name] = min(best[name], run())
    return best


def exponent(lengths: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(length)."""
    x = torch.tensor(lengths, dtype=torch.float64).log()
    y = torch.tensor(seconds, dtype=torch.float64).log()
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x * x).sum())


def measure(name: str, model: EncoderDecoder, lengths: list[int], repeats: int) -> dict:
    src = torch.randint(4, model.generator.proj.out_features, (1, SRC_LEN), generator=torch.Generator().manual_seed(0))
    decode_seconds(model, src, 4, True), decode_seconds(model, src, 4, False)  # warm-up
    rows = []
    for n in lengths:
        t = fastest({"cached": lambda: decode_seconds(model, src, n, True),
                     "uncached": lambda: decode_seconds(model, src, n, False)}, repeats)
        rows.append({"length": n, "cached_s": t["cached"], "uncached_s": t["uncached"],
                     "speedup": t["uncached"] / t["cached"]})
        print(name, rows[-1], flush=True)
    upper = rows[1:]
    fit = {kind: round(exponent([r["length"] for r in upper], [r[f"{kind}_s"] for r in upper]), 3)
           for kind in ("cached", "uncached")}
    longest = lengths[-1]
    layout = fastest({"concatenate": lambda: decode_seconds(model, src, longest, True),
                      "preallocate": lambda: decode_seconds(model, src, longest, True, capacity=longest + 1)}, repeats)
    d = model.src_embed[0].lut.embedding_dim
    return {"name": name, "d_model": d, "layers": len(model.decoder.layers), "rows": rows,
            "fitted_exponent": fit, "fit_lengths": [r["length"] for r in upper],
            "layout": {"length": longest, "concatenate_s": layout["concatenate"],
                       "preallocate_s": layout["preallocate"]}}


def sentence_seconds(model: EncoderDecoder, sources: list[list[int]], batch: int, use_cache: bool) -> float:
    """CPU seconds for the reference ``greedy_decode`` of ``sources`` in batches of ``batch``."""
    start = time.process_time()
    with torch.no_grad():
        for i in range(0, len(sources), batch):
            src = pad_batch(sources[i: i + batch])
            greedy_decode(model, src, (src != PAD).unsqueeze(-2), src.size(1) + 40, BOS, EOS, PAD, use_cache)
    return time.process_time() - start


def measure_sentences(model: EncoderDecoder, tok, repeats: int) -> dict:
    """Cached against uncached greedy search on real sentences, one at a time and all together."""
    pairs = json.loads(files("tfm_solution").joinpath("assets/decoding_quality.json").read_text())["val_pairs"]
    sources = [tok.encode_src(de) for de, _ in pairs]
    rows = []
    for batch in (1, len(sources)):
        t = fastest({"cached": lambda: sentence_seconds(model, sources, batch, True),
                     "uncached": lambda: sentence_seconds(model, sources, batch, False)}, repeats)
        rows.append({"batch": batch, "cached_s": t["cached"], "uncached_s": t["uncached"],
                     "speedup": t["uncached"] / t["cached"]})
        print("sentences", rows[-1], flush=True)
    return {"count": len(sources), "source": "the 40 validation pairs of decoding_quality.json", "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer lengths and repeats")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    course, tok = load_course_model()
    base = make_model(8000, 8000, N=6, d_model=512, d_ff=2048, h=8, attention_kernel="sdpa").eval()
    repeats = 2 if args.quick else 3
    course_lengths = [8, 16, 32, 64] if args.quick else [8, 16, 32, 64, 128, 256]
    base_lengths = [8, 16, 32] if args.quick else [8, 16, 32, 64]
    dims = course_model_config()["model"]
    results = [measure(f"course model (N={dims['N']}, d_model={dims['d_model']})", course, course_lengths, repeats),
               measure("base size (N=6, d_model=512, random weights)", base, base_lengths, repeats)]
    result = {"command": "python scripts/kv_cache_timing.py", "source_tokens": SRC_LEN, "batch": 1,
              "threads": 1, "repeats": repeats, "clock": "process CPU time", "models": results,
              "sentences": measure_sentences(course, tok, repeats),
              "note": "fastest of the repeats; cached and uncached alternate; compare ratios, not seconds"}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
