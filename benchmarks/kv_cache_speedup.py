"""Cached vs uncached greedy decoding of the base model (random weights), side by side, and the
fast engine (tfm_solution.fast.InferenceEngine: cached, fused weights, preallocated cache).

Usage: python benchmarks/kv_cache_speedup.py [--quick]
"""

import argparse

import torch

from tfm_solution.bench import greedy_runner, machine_facts, median_times, random_model
from tfm_solution.fast import InferenceEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths: proves the script runs")
    parser.add_argument("--repeat", type=int, default=1, help="timed rounds per setting (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--settings", default="1x64,1x128,1x256,8x64,8x128,8x256",
                        help="comma-separated BATCHxNEW_TOKENS settings (default: batch 1 and 8, 64/128/256 tokens)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, vocab = ("tiny", 100) if args.quick else ("base", 8000)
    settings = [(1, 8), (2, 16)] if args.quick else [tuple(map(int, s.split("x"))) for s in args.settings.split(",")]
    model = random_model(config, vocab)
    engine = InferenceEngine(model)
    print(machine_facts())
    print(f"config {config}, vocab {vocab}, source length 32, greedy, no end symbol\n")
    print("| batch | new tokens | uncached (s) | cached (s) | fast engine (s) | uncached / cached | "
          "uncached / fast | identical tokens |")
    print("|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for batch, n in settings:
        cached = greedy_runner(model, batch, 32, n, True)
        uncached = greedy_runner(model, batch, 32, n, False)
        src = torch.randint(4, vocab, (batch, 32), generator=torch.Generator().manual_seed(0))  # greedy_runner's
        fast = (lambda src: lambda: engine.greedy_decode(src, torch.ones(batch, 1, 32, dtype=torch.bool), n + 1, 1,
                                                         None, 0))(src)
        reference = uncached()  # also the warm-up round
        same = torch.equal(cached(), reference) and torch.equal(fast(), reference)
        t = median_times({"uncached": uncached, "cached": cached, "fast": fast}, repeat=args.repeat, warmup=0)
        print(f"| {batch} | {n} | {t['uncached']:.2f} | {t['cached']:.2f} | {t['fast']:.2f} | "
              f"{t['uncached'] / t['cached']:.1f}x | {t['uncached'] / t['fast']:.1f}x | {'yes' if same else 'NO'} |",
              flush=True)


if __name__ == "__main__":
    main()
