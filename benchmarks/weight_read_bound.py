"""Cached greedy per-token time vs the time to read, once, every weight a decoding step uses
(decoder layers without the cross-attention K/V projections, which run once per sentence, plus
the generator), at the memory bandwidth this script measures.

Each decoding step is timed right after a streaming read of a buffer as large as those
weights, so both see the same machine load; the table gives medians over all steps.

Usage: python benchmarks/weight_read_bound.py [--quick]
"""

import argparse
import statistics
import time

import torch

from tfm_solution.bench import machine_facts, random_model
from tfm_solution.decoding import IncrementalDecoder


def step_weight_bytes(model) -> int:
    """Bytes of the parameters one cached decoding step reads."""
    once = {id(p) for layer in model.decoder.layers for lin in layer.src_attn.linears[1:3] for p in lin.parameters()}
    used = [p for p in list(model.decoder.parameters()) + list(model.generator.parameters()) if id(p) not in once]
    return sum(p.numel() * p.element_size() for p in used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model: proves the script runs")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, vocab, n = ("tiny", 100, 8) if args.quick else ("base", 8000, 128)
    model = random_model(config, vocab)
    weights = step_weight_bytes(model)
    buffer = torch.ones(max(weights, 1 << 26) // 4)  # as large as the weights (64 MiB at least): beyond the caches
    src = torch.randint(4, vocab, (1, 32), generator=torch.Generator().manual_seed(0))
    read_s, step_s = [], []
    with torch.no_grad():
        for _ in range(2):  # the first round warms up
            read_s, step_s = [], []
            dec = IncrementalDecoder(model, src, torch.ones(1, 1, 32, dtype=torch.bool), use_cache=True)
            ys = torch.ones(1, 1, dtype=torch.long)
            for _ in range(n):
                start = time.perf_counter()
                buffer.sum()
                read_s.append((time.perf_counter() - start) * weights / (buffer.numel() * 4))
                start = time.perf_counter()
                ys = torch.cat([ys, dec.step(ys).argmax(-1, keepdim=True)], dim=1)
                step_s.append(time.perf_counter() - start)
    bound, per_token = statistics.median(read_s), statistics.median(step_s)
    print(machine_facts())
    print(f"config {config}, vocab {vocab}, batch 1, cached greedy, {n} steps each timed after a read\n")
    print("| measured read bandwidth | weights read per step | weight-read bound | cached per token | ratio |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {weights / bound / 1e9:.1f} GB/s | {weights / 1e6:.1f} MB | {bound * 1e3:.2f} ms | "
          f"{per_token * 1e3:.2f} ms | {per_token / bound:.2f}x |")


if __name__ == "__main__":
    main()
