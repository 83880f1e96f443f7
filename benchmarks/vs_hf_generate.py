"""Cached greedy decoding vs Hugging Face MarianMTModel.generate(use_cache=True), same dimensions,
random weights, warmed up, the same number of new tokens, timed side by side (alternating).

Contenders: the chapters' path (greedy_decode with the KV cache), the fast engine
(tfm_solution.fast.InferenceEngine, eager), and with --compile the engine's step compiled
(torch.compile, fixed shapes), reported on its own line after a compilation round it does not time.

Usage: python benchmarks/vs_hf_generate.py [--quick] [--compile]
"""

import argparse
import functools
import time

import torch
from transformers import MarianConfig, MarianMTModel
from transformers.utils import logging as hf_logging

from tfm_solution.bench import MODEL_SIZES, greedy_runner, machine_facts, median_times, random_model
from tfm_solution.fast import InferenceEngine


def marian_like(config: str, vocab: int) -> MarianMTModel:
    size = MODEL_SIZES[config]
    cfg = MarianConfig(vocab_size=vocab, d_model=size["d_model"], encoder_layers=size["N"], decoder_layers=size["N"],
                       encoder_attention_heads=size["h"], decoder_attention_heads=size["h"],
                       encoder_ffn_dim=size["d_ff"], decoder_ffn_dim=size["d_ff"], max_position_embeddings=512,
                       pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, forced_eos_token_id=None)
    return MarianMTModel(cfg).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths: proves the script runs")
    parser.add_argument("--compile", action="store_true", help="also time the engine with a compiled step")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--settings", default="1x64,1x128,8x64,8x128",
                        help="comma-separated BATCHxNEW_TOKENS settings (default: batch 1 and 8, 64 and 128 tokens)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    config, vocab = ("tiny", 100) if args.quick else ("base", 8000)
    settings = [(1, 8)] if args.quick else [tuple(map(int, s.split("x"))) for s in args.settings.split(",")]
    ours, hf = random_model(config, vocab), marian_like(config, vocab)
    engine = InferenceEngine(ours)
    compiled = None
    if args.compile:
        compiled = InferenceEngine(ours)
        compiled.compile(cache_len=max(n for _, n in settings))  # one compilation per batch size, all lengths
    print(machine_facts())
    print(f"config {config}, vocab {vocab}, source length 32, greedy, all with a KV cache; "
          f"ratios are HF's time / ours (> 1: ours faster)\n")
    print("| batch | new tokens | HF generate (s) | chapters' cached (s) | fast engine (s) | "
          "HF / chapters' | **HF / fast** | same tokens |")
    print("|---:|---:|---:|---:|---:|---:|---:|:---:|")
    compiled_rows = []
    for batch, n in settings:
        src = torch.randint(4, vocab, (batch, 32), generator=torch.Generator().manual_seed(0))
        src_mask = torch.ones(batch, 1, 32, dtype=torch.bool)

        def hf_generate() -> torch.Tensor:
            with torch.no_grad():
                out = hf.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, num_beams=1, use_cache=True)
            assert out.size(1) == n + 1  # start token + n new ones
            return out

        chapters = greedy_runner(ours, batch, 32, n, True)
        contenders = {"hf": hf_generate, "chapters": chapters}
        for name, decoder in (("fast", engine), ("compiled", compiled)):
            if decoder is not None:  # the same start symbol (1) and padding (0) as greedy_runner
                contenders[name] = functools.partial(decoder.greedy_decode, src, src_mask, n + 1, 1, None, 0)
        fast = contenders["fast"]
        same = torch.equal(chapters(), fast())
        if compiled is not None:
            run_compiled = contenders["compiled"]
            start = time.perf_counter()
            same_compiled = torch.equal(run_compiled(), fast())  # compiles on the first new shape
            compiled_rows.append((batch, n, time.perf_counter() - start, same_compiled))
        t = median_times(contenders, repeat=args.repeat, warmup=1)
        print(f"| {batch} | {n} | {t['hf']:.2f} | {t['chapters']:.2f} | {t['fast']:.2f} | "
              f"{t['hf'] / t['chapters']:.2f}x | **{t['hf'] / t['fast']:.2f}x** | {'yes' if same else 'NO'} |",
              flush=True)
        if compiled is not None:
            compiled_rows[-1] += (t["compiled"], t["hf"] / t["compiled"], t["fast"] / t["compiled"])
    if compiled_rows:
        print("\ncompiled step (torch.compile, fixed shapes; the first round, with compilation, not timed):\n")
        print("| batch | new tokens | first round (s) | compiled (s) | HF / compiled | eager fast / compiled | "
              "same tokens as eager |")
        print("|---:|---:|---:|---:|---:|---:|:---:|")
        for batch, n, first, same, t, vs_hf, vs_fast in compiled_rows:
            print(f"| {batch} | {n} | {first:.1f} | {t:.2f} | {vs_hf:.2f}x | {vs_fast:.2f}x | "
                  f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
