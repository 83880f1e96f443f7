"""What int8 costs the course model: BLEU on Multi30k test_2016 (greedy and beam 4), float32 against
the int8 engine, with the share of output tokens the two agree on and the time each took.

Float32 runs through the fast engine, whose tokens are the chapters' decoders' (the script checks
this on the first batch against ``decoding.greedy_decode`` and ``decoding.beam_search``); it
decodes as ``scripts/decoding_quality.py`` does: batches of 50 sentences, at most source length
+ 40 tokens, beam search with length penalty alpha = 0.6, one thread. BLEU is sacreBLEU's corpus
score of the detokenized outputs.

Token agreement: over all sentences, the positions where both outputs have the same token,
divided by the longer output's length (summed); and the share of sentences output identically.

Usage: python benchmarks/int8_quality.py [--data-dir DIR] [--limit N]   (Multi30k: --data-dir or $MULTI30K_DIR)
"""

from __future__ import annotations

import argparse
import time

import sacrebleu
import torch

from tfm_solution.bench import machine_facts
from tfm_solution.course_model import load_course_model
from tfm_solution.data import BOS, EOS, PAD, load_multi30k, multi30k_dir, pad_batch
from tfm_solution.decoding import beam_search, greedy_decode
from tfm_solution.fast import InferenceEngine
from tfm_solution.fast.linear import vnni

BATCH, EXTRA, BEAM, ALPHA = 50, 40, 4, 0.6


def strip(row: list[int]) -> list[int]:
    """The ids after ``<s>``, up to (not including) ``</s>``."""
    row = row[1:]
    return row[: row.index(EOS)] if EOS in row else row


def decode(engine: InferenceEngine, srcs: list[list[int]], beam: bool) -> tuple[list[list[int]], float]:
    """Every source's output ids with greedy search or beam search, and the seconds it took."""
    out: list[list[int]] = []
    start = time.perf_counter()
    for i in range(0, len(srcs), BATCH):
        src = pad_batch(srcs[i: i + BATCH])
        mask, max_len = (src != PAD).unsqueeze(-2), src.size(1) + EXTRA
        if beam:
            out += [strip(h[0].tokens) for h in engine.beam_search(src, mask, max_len, BOS, EOS, beam_size=BEAM,
                                                                     alpha=ALPHA)]
        else:
            out += [strip(row) for row in engine.greedy_decode(src, mask, max_len, BOS, EOS, PAD).tolist()]
    return out, time.perf_counter() - start


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    """(share of token positions equal, share of outputs identical)."""
    same = sum(sum(x == y for x, y in zip(s, t)) for s, t in zip(a, b))
    total = sum(max(len(s), len(t), 1) for s, t in zip(a, b))
    return same / total, sum(s == t for s, t in zip(a, b)) / len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="folder with the Multi30k files (else $MULTI30K_DIR)")
    parser.add_argument("--limit", type=int, help="only the first N test sentences")
    parser.add_argument("--reduce-range", choices=["auto", "yes", "no"], default="auto",
                        help="7-bit activations (yes), 8-bit (no), or as the engine chooses for this CPU (auto)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = load_course_model()
    test = load_multi30k("test", multi30k_dir(args.data_dir))[: args.limit]
    srcs = [tok.encode_src(s) for s, _ in test]
    refs = [r for _, r in test]
    fp32, int8 = InferenceEngine(model), InferenceEngine(model, int8=True)
    if args.reduce_range != "auto":
        for lin in int8.weights().linears():
            lin.reduce_range = args.reduce_range == "yes"
    bits = 7 if int8.weights().generator.reduce_range else 8

    first = pad_batch(srcs[:BATCH])
    mask = (first != PAD).unsqueeze(-2)
    n = first.size(1) + EXTRA
    assert torch.equal(fp32.greedy_decode(first, mask, n, BOS, EOS, PAD),
                       greedy_decode(model, first, mask, n, BOS, EOS, PAD))
    assert [h[0].tokens for h in fp32.beam_search(first, mask, n, BOS, EOS, beam_size=BEAM, alpha=ALPHA)] == \
        [h[0].tokens for h in beam_search(model, first, mask, n, BOS, EOS, beam_size=BEAM, alpha=ALPHA)]

    print(machine_facts())
    print(f"course model, Multi30k test_2016 ({len(test)} sentences), one thread; {bits}-bit activations "
          f"(AVX-512 VNNI: {'yes' if vnni() else 'no'}); int8 weights "
          f"{int8.nbytes() / 1e6:.2f} MB against float32 {fp32.nbytes() / 1e6:.2f} MB (the engine's projections)\n")
    print("| decoding | float32 BLEU | int8 BLEU | int8 - float32 | tokens agreeing | outputs identical | "
          "float32 (s) | int8 (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, beam in (("greedy", False), (f"beam {BEAM}", True)):
        (a, ta), (b, tb) = decode(fp32, srcs, beam), decode(int8, srcs, beam)
        bleu_a = sacrebleu.corpus_bleu([tok.decode_tgt(ids) for ids in a], [refs]).score
        bleu_b = sacrebleu.corpus_bleu([tok.decode_tgt(ids) for ids in b], [refs]).score
        tokens, identical = agreement(a, b)
        print(f"| {name} | {bleu_a:.2f} | {bleu_b:.2f} | {bleu_b - bleu_a:+.2f} | {tokens:.1%} | {identical:.1%} | "
              f"{ta:.1f} | {tb:.1f} |", flush=True)


if __name__ == "__main__":
    main()
