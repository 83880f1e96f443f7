"""Measure what label smoothing does to a small German→English Transformer: chapter 9's experiment.

The paper says label smoothing "hurts perplexity, as the model learns to be more unsure, but
improves accuracy and BLEU score". This script trains the same small model on the same
Multi30k pairs twice per seed, with smoothing ε = 0 and ε = 0.1 (same data order, same
initial weights), and measures on the validation split:

- perplexity: exp of the mean negative log-likelihood of the reference tokens (teacher forcing);
- token accuracy: how often the most likely next token is the reference token;
- confidence: the mean probability the model gives its most likely token;
- BLEU of greedy translations (sacreBLEU).

It writes a small JSON that chapter 9 loads; the chapter shows this command:

    python scripts/label_smoothing_effect.py --data-dir path/to/multi30k

(or ``$MULTI30K_DIR``). Each of the four runs takes about 4 minutes of one CPU core; ``--jobs``
runs them side by side (every run is seeded on its own, so the results do not depend on it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
import math
import platform
import sys
import time
from pathlib import Path

import sacrebleu
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tfm_solution.data import PAD, iterate_batches, load_multi30k, multi30k_dir, token_batches  # noqa: E402
from tfm_solution.encoder_decoder import make_model  # noqa: E402
from tfm_solution.experiment import decode_texts, default_run, model_config, prepare_data, with_overrides  # noqa: E402
from tfm_solution.training import LabelSmoothing, SimpleLossCompute, make_optimizer, train_with_accumulation  # noqa: E402

OUT = REPO / "tfm_solution" / "assets" / "label_smoothing_effect.json"


@torch.no_grad()
def validation_metrics(model, examples, max_tokens: int) -> dict[str, float]:
    """Perplexity, token accuracy and mean top-1 probability on ``examples`` (teacher forcing)."""
    model.eval()
    nll = correct = confidence = tokens = 0.0
    for batch in iterate_batches(examples, token_batches(examples, max_tokens)):
        out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
        log_probs = model.generator(out)
        real = batch.tgt_y != PAD
        gold = log_probs.gather(-1, batch.tgt_y.unsqueeze(-1)).squeeze(-1)
        top, best = log_probs.max(-1)
        nll -= float(gold[real].sum())
        correct += float((best == batch.tgt_y)[real].sum())
        confidence += float(top.exp()[real].sum())
        tokens += float(real.sum())
    return {"perplexity": math.exp(nll / tokens), "nll_per_token": nll / tokens,
            "token_accuracy": correct / tokens, "confidence": confidence / tokens}


def one_run(run, data, val_pairs: list[tuple[str, str]], seed: int, threads: int = 1) -> dict[str, float]:
    """Train one model with ``run.smoothing`` from ``seed``; its validation figures."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = model_config(run, data.tokenizers)
    model = make_model(**cfg)
    optimizer, scheduler = make_optimizer(model, cfg["d_model"], run.factor, run.warmup)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(cfg["tgt_vocab"], PAD, run.smoothing))
    start, steps = time.perf_counter(), 0
    for epoch in range(run.epochs):
        order = torch.Generator().manual_seed(seed * 1000 + epoch)  # the same data order for both ε
        batches = token_batches(data.train, run.max_tokens, order)
        steps += train_with_accumulation(model, iterate_batches(data.train, batches), loss_compute, optimizer,
                                         scheduler, run.accum_iter)
    seconds = time.perf_counter() - start
    metrics = validation_metrics(model, data.val, run.max_tokens)
    model.eval()
    hyps = decode_texts(model, data.tokenizers, [de for de, _ in val_pairs], "greedy")
    metrics["bleu"] = sacrebleu.corpus_bleu(hyps, [[en for _, en in val_pairs]]).score
    return {"smoothing": run.smoothing, "seed": seed, "steps": steps, "train_seconds": round(seconds, 1),
            **{k: round(v, 4) for k, v in metrics.items()}}


def _run_setting(setting) -> dict[str, float]:
    """One run in a worker process: the data prepared again (deterministic), then ``one_run``."""
    run, data_dir, sentences, seed, threads = setting
    val_pairs = load_multi30k("val", multi30k_dir(data_dir))[:sentences]
    return one_run(run, prepare_data(run, data_dir), val_pairs, seed, threads)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="folder with the Multi30k .gz files (else $MULTI30K_DIR)")
    parser.add_argument("--train-subset", type=int, default=10_000, help="first N training pairs")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--smoothings", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--bleu-sentences", type=int, default=1014, help="validation sentences translated")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at the same time")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = with_overrides(default_run("multi30k", "tiny"), train_subset=args.train_subset, epochs=args.epochs,
                          max_tokens=1000, warmup=400, dropout=0.1)
    data = prepare_data(base, args.data_dir)
    settings = [(with_overrides(base, smoothing=smoothing), args.data_dir, args.bleu_sentences, seed, args.threads)
                for seed in args.seeds for smoothing in args.smoothings]
    # Fresh processes (spawn), each preparing its own copy of the data: nothing is shared between runs.
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = []
        for result in pool.map(_run_setting, settings):
            print(json.dumps(result), flush=True)
            runs.append(result)
    command = "python scripts/label_smoothing_effect.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report = {
        "command": command.strip(),
        "model": model_config(base, data.tokenizers),
        "training": {"train_pairs": len(data.train), "epochs": base.epochs, "max_tokens": base.max_tokens,
                     "warmup": base.warmup, "factor": base.factor, "dropout": base.dropout},
        "validation_pairs": len(data.val), "bleu_sentences": min(args.bleu_sentences, len(data.val)),
        "machine": f"{platform.machine()}, torch {torch.__version__}, {args.threads} thread(s) per run",
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
