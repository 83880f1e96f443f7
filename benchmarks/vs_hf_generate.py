"""Cached greedy decoding of make_model vs Hugging Face MarianMTModel.generate(use_cache=True),
same dimensions, random weights, warmed up, the same number of new tokens.

Usage: python benchmarks/vs_hf_generate.py [--quick]
"""

import argparse

import torch
from transformers import MarianConfig, MarianMTModel
from transformers.utils import logging as hf_logging

from tfm_solution.bench import MODEL_SIZES, greedy_runner, machine_facts, median_times, random_model


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
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    config, vocab, lengths, batches = ("tiny", 100, [8], [1]) if args.quick else ("base", 8000, [64, 128], [1, 8])
    ours, hf = random_model(config, vocab), marian_like(config, vocab)
    print(machine_facts())
    print(f"config {config}, vocab {vocab}, source length 32, greedy, both with a KV cache\n")
    print("| batch | new tokens | HF generate (s) | ours cached (s) | ours faster by |")
    print("|---:|---:|---:|---:|---:|")
    for batch in batches:
        src = torch.randint(4, vocab, (batch, 32), generator=torch.Generator().manual_seed(0))
        for n in lengths:
            def hf_generate(src=src, n=n):
                with torch.no_grad():
                    out = hf.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, num_beams=1, use_cache=True)
                assert out.size(1) == n + 1  # start token + n new ones
                return out
            t = median_times({"hf": hf_generate, "ours": greedy_runner(ours, batch, 32, n, True)},
                             repeat=args.repeat, warmup=1)
            print(f"| {batch} | {n} | {t['hf']:.2f} | {t['ours']:.2f} | {t['hf'] / t['ours']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
