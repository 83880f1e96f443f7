"""Cached greedy per-token time vs the time to read, once, every weight a decoding step uses
(decoder layers without the cross-attention K/V projections, which run once per sentence, plus
the generator), at the memory bandwidth this script measures.

Usage: python benchmarks/weight_read_bound.py [--quick]
"""

import argparse
import time

import torch

from tfm_solution.bench import greedy_runner, machine_facts, median_times, random_model


def read_bandwidth(nbytes: int, repeat: int = 5) -> float:
    """Bytes per second of a streaming read (sum of a float32 array larger than the caches); best of ``repeat``."""
    x = torch.ones(nbytes // 4)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def step_weight_bytes(model) -> int:
    """Bytes of the parameters one cached decoding step reads."""
    once = {id(p) for layer in model.decoder.layers for lin in layer.src_attn.linears[1:3] for p in lin.parameters()}
    used = [p for p in list(model.decoder.parameters()) + list(model.generator.parameters()) if id(p) not in once]
    return sum(p.numel() * p.element_size() for p in used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model: proves the script runs")
    args = parser.parse_args()
    torch.set_num_threads(2)
    config, vocab, n, buffer = ("tiny", 100, 8, 1 << 24) if args.quick else ("base", 8000, 128, 1 << 30)
    model = random_model(config, vocab)
    bandwidth = read_bandwidth(buffer)
    weights = step_weight_bytes(model)
    short, long = greedy_runner(model, 1, 32, n // 2, True), greedy_runner(model, 1, 32, n, True)
    t = median_times({"short": short, "long": long}, repeat=3, warmup=1)
    per_token = (t["long"] - t["short"]) / (n - n // 2)  # the difference cancels the encoder and set-up
    bound = weights / bandwidth
    print(machine_facts())
    print(f"config {config}, vocab {vocab}, batch 1, cached greedy, per-token time from {n // 2} vs {n} new tokens\n")
    print("| measured read bandwidth | weights read per step | weight-read bound | cached per token | ratio |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {bandwidth / 1e9:.1f} GB/s | {weights / 1e6:.1f} MB | {bound * 1e3:.2f} ms | {per_token * 1e3:.2f} ms "
          f"| {per_token / bound:.2f}x |")


if __name__ == "__main__":
    main()
