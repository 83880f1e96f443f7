"""Command line: ``python -m tfm_solution {train,translate,evaluate,bench} ...``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .data import DataUnavailableError
from .experiment import ResumeMismatchError


class UsageError(ValueError):
    """Options that cannot go together: reported as ``error: ...`` with exit status 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tfm_solution",
                                description="Train, translate with, evaluate and benchmark the reference Transformer.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model and write a checkpoint folder")
    t.add_argument("--task", choices=["copy", "multi30k"],
                   help="copy: learn to copy random digit sequences; multi30k: German to English (default copy)")
    t.add_argument("--config", choices=["tiny", "small", "course", "base"],
                   help="model size; course = the course model's recipe on multi30k (default tiny)")
    t.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps (default auto)")
    t.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    t.add_argument("--max-seconds", type=float, help="stop after this many seconds of training")
    t.add_argument("--save-every", type=int,
                   help="also save a checkpoint every N optimizer steps (default: after each epoch)")
    t.add_argument("--epochs", type=int, help="number of passes over the training data")
    t.add_argument("--out", type=Path, required=True, help="checkpoint folder (config, weights, tokenizers, metrics)")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest checkpoint, with its saved settings and "
                        "tokenizer (only --epochs, --max-steps and --max-seconds may change)")
    t.add_argument("--data-dir", help="folder with the Multi30k .gz files (else $MULTI30K_DIR, else download)")
    t.add_argument("--train-subset", type=int, help="use only the first N training pairs")
    t.add_argument("--val-subset", type=int, help="use only the first N validation pairs")
    t.add_argument("--max-tokens", type=int, help="token budget per batch (source and target positions)")
    t.add_argument("--accum-iter", type=int, help="micro-batches per optimizer step (gradient accumulation)")
    t.add_argument("--vocab-size", type=int, help="subword vocabulary size (Multi30k)")
    t.add_argument("--separate-vocab", action="store_true", help="one tokenizer per language instead of a shared one")
    t.add_argument("--kernel", choices=["matmul", "sdpa"], help="attention kernel (default sdpa)")
    t.add_argument("--dropout", type=float, help="dropout rate (default 0.1; 0 for the copy task)")
    t.add_argument("--seed", type=int, help="random seed")
    t.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")

    def add_decoding(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("checkpoint", type=Path, help="checkpoint folder written by train")
        sp.add_argument("--strategy", choices=["greedy", "beam", "sample"], default="greedy",
                        help="decoding strategy (default greedy)")
        sp.add_argument("--beam-size", type=int, default=4, help="beams for --strategy beam (default 4)")
        sp.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")

    tr = sub.add_parser("translate", help="translate sentences given as arguments or on stdin, one per line")
    add_decoding(tr)
    tr.add_argument("sentences", nargs="*", help="sentences to translate (default: read stdin)")
    tr.add_argument("--no-cache", action="store_true", help="decode without the KV cache (slower, same output)")
    tr.add_argument("--int8", action="store_true",
                    help="decode on the CPU with int8 weights (tfm_solution.fast): a quarter of the weights' bytes; "
                         "a few tokens change (the course model's test BLEU stays within 0.3 of float32, "
                         "benchmarks/RESULTS.md); the KV cache stays float32 (chapter 11's memory calculator)")
    tr.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    tr.add_argument("--top-k", type=int, help="sample from the k most likely tokens only")
    tr.add_argument("--top-p", type=float, help="sample from the smallest set of tokens with mass >= p")
    tr.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")

    ev = sub.add_parser("evaluate", help="sacreBLEU (and exact match) of a checkpoint on a split")
    add_decoding(ev)
    ev.add_argument("--split", choices=["val", "test"], default="test", help="split to score (default test)")
    ev.add_argument("--limit", type=int, help="score only the first N sentences")
    ev.add_argument("--data-dir", help="folder with the Multi30k .gz files (else $MULTI30K_DIR, else download)")

    b = sub.add_parser("bench", help="time cached against uncached greedy decoding with random weights")
    b.add_argument("--config", choices=["tiny", "small", "base"], default="base", help="model size (default base)")
    b.add_argument("--batch", type=int, default=1, help="sentences decoded together (default 1)")
    b.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sentence (default 64)")
    b.add_argument("--vocab", type=int, default=8000, help="vocabulary size (default 8000)")
    b.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    b.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto)")
    return p


def _train(args: argparse.Namespace) -> None:
    from .checkpoint import read_run
    from .experiment import default_run, resume_settings, train, with_overrides

    overrides = dict(task=args.task, config=args.config, max_steps=args.max_steps, max_seconds=args.max_seconds,
                     save_every=args.save_every, epochs=args.epochs, train_subset=args.train_subset,
                     val_subset=args.val_subset, max_tokens=args.max_tokens, accum_iter=args.accum_iter,
                     vocab_size=args.vocab_size,
                     attention_kernel=args.kernel, seed=args.seed, dropout=args.dropout,
                     shared_vocab=False if args.separate_vocab else None)
    if args.resume and read_run(args.out) is not None:
        run = resume_settings(args.out, overrides)
    else:
        run = with_overrides(default_run(args.task or "copy", args.config or "tiny"), **overrides)
    metrics = train(run, args.out, args.device, args.data_dir, args.resume, progress=not args.quiet)
    print(json.dumps(metrics))
    print(f"checkpoint written to {args.out}")


def _translate(args: argparse.Namespace) -> None:
    from .checkpoint import load_checkpoint
    from .experiment import decode_texts
    from .training import select_device

    engine = None
    if args.int8:
        if args.no_cache:
            raise UsageError("--int8 decodes with the KV cache; leave out --no-cache")
        if args.device not in ("auto", "cpu"):
            raise UsageError(f"--int8 runs on the CPU; got --device {args.device}")
        args.device = "cpu"
    model, _, tokenizers, _ = load_checkpoint(args.checkpoint, select_device(args.device))
    if args.int8:
        from .fast import InferenceEngine

        engine = InferenceEngine(model, int8=True)
    texts = args.sentences or [line.strip() for line in sys.stdin if line.strip()]
    for number, text in enumerate(texts, 1):
        unknown = tokenizers.unknown_words(text)
        if unknown:
            print(f"warning: sentence {number} has words the model's vocabulary lacks, read as <unk>: "
                  f"{', '.join(repr(w) for w in unknown)}", file=sys.stderr)
    for line in decode_texts(model, tokenizers, texts, args.strategy, not args.no_cache, args.beam_size,
                             temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                             engine=engine):
        print(line)


def _evaluate(args: argparse.Namespace) -> None:
    from .experiment import evaluate

    scores = evaluate(args.checkpoint, args.split, args.strategy, args.data_dir, args.limit, args.device,
                      args.beam_size)
    print(f"{args.split}: BLEU {scores['bleu']:.2f}, exact match {100 * scores['exact_match']:.1f}% "
          f"({int(scores['sentences'])} sentences, {args.strategy})")


def _bench(args: argparse.Namespace) -> None:
    from .bench import cache_speedup_table
    from .training import select_device

    device = str(select_device(args.device))
    print(cache_speedup_table(args.config, args.batch, args.new_tokens, args.vocab, args.threads, device=device))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        {"train": _train, "translate": _translate, "evaluate": _evaluate, "bench": _bench}[args.command](args)
    except (DataUnavailableError, FileNotFoundError, FileExistsError, ResumeMismatchError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
