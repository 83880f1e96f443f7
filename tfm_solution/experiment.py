"""Experiments end to end: named configs, the training driver (copy task or Multi30k),
translation and evaluation of a checkpoint. The CLI (``python -m tfm_solution``) calls these.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from .checkpoint import load_checkpoint, load_optimizer, save_checkpoint
from .data import (BOS, EOS, PAD, Example, TokenizerPair, copy_examples, copy_tokenizer, iterate_batches,
                   load_multi30k, multi30k_dir, pad_batch, token_batches)
from .decoding import beam_search, greedy_decode, sample
from .encoder_decoder import EncoderDecoder, make_model
from .training import (LabelSmoothing, SimpleLossCompute, TrainState, distributed_context, make_optimizer,
                       run_epoch, select_device)

MODEL_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(N=2, d_model=64, d_ff=256, h=4),
    "small": dict(N=3, d_model=256, d_ff=1024, h=4),
    "base": dict(N=6, d_model=512, d_ff=2048, h=8),
}
COPY_VOCAB, COPY_LEN = 11, 10


@dataclass
class RunConfig:
    """Everything a training run depends on (saved in the checkpoint)."""

    task: str = "copy"  # "copy" or "multi30k"
    config: str = "tiny"
    dropout: float = 0.1
    attention_kernel: str = "sdpa"
    vocab_size: int = 8000  # Multi30k subword vocabulary (per side unless shared)
    shared_vocab: bool = True
    max_len: int = 100  # longer pairs are left out (and counted), never cropped
    max_tokens: int = 4000  # padded source (and target) positions per batch
    train_subset: int | None = None  # use the first N training pairs
    val_subset: int | None = None
    smoothing: float = 0.1
    factor: float = 1.0
    warmup: int = 3000
    accum_iter: int = 1
    epochs: int = 20
    max_steps: int | None = None
    max_seconds: float | None = None
    seed: int = 0
    copy_train_size: int = 2000  # fresh random sequences per epoch (copy task)


def default_run(task: str, config: str) -> RunConfig:
    """Sensible settings per task and size."""
    if config not in MODEL_SIZES:
        raise ValueError(f"config must be one of {sorted(MODEL_SIZES)}, got {config!r}")
    if task == "copy":
        return RunConfig(task, config, dropout=0.0, max_tokens=600, smoothing=0.0, warmup=200, factor=0.25, epochs=12)
    if task == "multi30k":
        vocab = {"tiny": 2000, "small": 4000, "base": 8000}[config]
        return RunConfig(task, config, vocab_size=vocab, max_tokens={"base": 6000}.get(config, 3000),
                         warmup={"base": 2000}.get(config, 800), epochs=8)
    raise ValueError(f"task must be 'copy' or 'multi30k', got {task!r}")


@dataclass
class Prepared:
    tokenizers: TokenizerPair
    train: list[Example]
    val: list[Example]
    too_long: int


def prepare_data(run: RunConfig, data_dir: str | Path | None = None) -> Prepared:
    """Tokenizers (trained on the training split only) and id sequences of train and val."""
    if run.task == "copy":
        tok = copy_tokenizer(COPY_VOCAB)
        val = copy_examples(200, COPY_LEN, COPY_VOCAB, torch.Generator().manual_seed(run.seed + 10_000))
        return Prepared(TokenizerPair(tok, tok), [], val, 0)
    folder = multi30k_dir(data_dir)
    train_pairs = load_multi30k("train", folder)[: run.train_subset]
    val_pairs = load_multi30k("val", folder)[: run.val_subset]
    tokenizers = TokenizerPair.train(train_pairs, run.vocab_size, run.shared_vocab)
    train, too_long = tokenizers.encode_pairs(train_pairs, run.max_len)
    val, val_too_long = tokenizers.encode_pairs(val_pairs, run.max_len)
    return Prepared(tokenizers, train, val, too_long + val_too_long)


def model_config(run: RunConfig, tokenizers: TokenizerPair) -> dict[str, Any]:
    return dict(src_vocab=tokenizers.src.get_vocab_size(), tgt_vocab=tokenizers.tgt.get_vocab_size(),
                dropout=run.dropout, attention_kernel=run.attention_kernel, **MODEL_SIZES[run.config])


def train(run: RunConfig, out: Path, device: str = "auto", data_dir: str | Path | None = None,
          resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train, validating after every epoch; returns the last epoch's metrics.

    The checkpoint in ``out`` is rewritten whenever the validation loss improves.

    Under ``torchrun`` each process takes every ``world``-th batch and DDP averages gradients.
    Metrics go to ``out/metrics.jsonl``, one JSON object per epoch.
    """
    dev = select_device(device)
    out = Path(out)
    with distributed_context() as (rank, world):
        torch.manual_seed(run.seed)
        data = prepare_data(run, data_dir)
        mcfg = model_config(run, data.tokenizers)
        model = make_model(**mcfg).to(dev)
        optimizer, scheduler = make_optimizer(model, mcfg["d_model"], run.factor, run.warmup)
        state = TrainState()
        if resume and (out / "config.json").is_file():
            saved, _, _, state = load_checkpoint(out, dev)
            model.load_state_dict(saved.state_dict())
            load_optimizer(out, optimizer, scheduler)
        wrapped = DistributedDataParallel(model) if world > 1 else model
        criterion = LabelSmoothing(mcfg["tgt_vocab"], PAD, run.smoothing)
        loss_compute = SimpleLossCompute(model.generator, criterion)
        start, metrics, best = time.perf_counter(), {}, math.inf
        tokens_at_start = state.tokens

        def limit_reached(st: TrainState, _loss: float = 0.0) -> bool:
            return (run.max_steps is not None and st.accum_step >= run.max_steps) or (
                run.max_seconds is not None and time.perf_counter() - start >= run.max_seconds)

        epoch = 0
        while epoch < run.epochs and not limit_reached(state):
            gen = torch.Generator().manual_seed(run.seed + 1 + epoch + state.accum_step)
            train_examples = data.train or copy_examples(run.copy_train_size, COPY_LEN, COPY_VOCAB, gen)
            batches = token_batches(train_examples, run.max_tokens, gen)
            batches = batches[rank: len(batches) - len(batches) % world: world]
            bar = tqdm(batches, desc=f"epoch {epoch}", disable=not progress or rank != 0, leave=False)
            wrapped.train()
            train_loss, state = run_epoch(iterate_batches(train_examples, bar), wrapped, loss_compute, optimizer,
                                          scheduler, "train", run.accum_iter, state, dev, limit_reached)
            model.eval()
            val_loss, _ = run_epoch(iterate_batches(data.val, token_batches(data.val, run.max_tokens)), model,
                                    loss_compute, mode="eval", device=dev)
            elapsed = time.perf_counter() - start
            metrics = dict(epoch=epoch, step=state.accum_step, train_loss=train_loss, val_loss=val_loss,
                           lr=scheduler.get_last_lr()[0], seconds=elapsed, too_long=data.too_long,
                           tokens_per_s=world * (state.tokens - tokens_at_start) / elapsed)
            if rank == 0:
                if val_loss < best:  # the checkpoint is the best epoch so far on validation loss
                    best = val_loss
                    save_checkpoint(out, model, mcfg, asdict(run), data.tokenizers, state, optimizer, scheduler)
                with open(out / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(metrics) + "\n")
                if progress:
                    print(f"epoch {epoch} step {state.accum_step} train loss {train_loss:.3f} "
                          f"val loss {val_loss:.3f} ({metrics['tokens_per_s']:.0f} tokens/s)")
            epoch += 1
    return metrics


def decode_texts(model: EncoderDecoder, tokenizers: TokenizerPair, texts: list[str], strategy: str = "greedy",
                 use_cache: bool = True, beam_size: int = 4, max_extra: int = 50, batch_size: int = 64,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 seed: int = 0) -> list[str]:
    """Translate ``texts`` with ``strategy`` (greedy, beam or sample), in batches."""
    if strategy not in ("greedy", "beam", "sample"):
        raise ValueError(f"strategy must be greedy, beam or sample, got {strategy!r}")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    results: list[str] = []
    for i in range(0, len(texts), batch_size):
        src = pad_batch([tokenizers.encode_src(t) for t in texts[i: i + batch_size]]).to(device)
        src_mask = (src != PAD).unsqueeze(-2)
        max_len = src.size(1) + max_extra
        if strategy == "beam":
            hyps = beam_search(model, src, src_mask, max_len, BOS, EOS, beam_size=beam_size, use_cache=use_cache)
            rows = [h[0].tokens for h in hyps]
        elif strategy == "greedy":
            rows = greedy_decode(model, src, src_mask, max_len, BOS, EOS, PAD, use_cache).tolist()
        else:
            rows = sample(model, src, src_mask, max_len, BOS, EOS, PAD, use_cache, temperature, top_k, top_p,
                          generator).tolist()
        results += [tokenizers.decode_tgt(row[1:]) for row in rows]
    return results


def evaluation_pairs(meta: dict[str, Any], split: str, data_dir: str | Path | None, limit: int | None
                     ) -> list[tuple[str, str]]:
    """(source, reference) text pairs of ``split``; for the copy task, fresh held-out sequences."""
    run = RunConfig(**meta["run"])
    if run.task == "copy":
        seed = {"val": 10_000, "test": 20_000}.get(split, 30_000) + run.seed
        examples = copy_examples(limit or 200, COPY_LEN, COPY_VOCAB, torch.Generator().manual_seed(seed))
        texts = [" ".join(map(str, src[:-1])) for src, _ in examples]
        return list(zip(texts, texts))
    return load_multi30k(split, multi30k_dir(data_dir))[:limit]


def evaluate(folder: Path, split: str = "test", strategy: str = "greedy", data_dir: str | Path | None = None,
             limit: int | None = None, device: str = "auto", beam_size: int = 4) -> dict[str, float]:
    """sacreBLEU and exact-match rate of a checkpoint's translations of ``split``."""
    model, meta, tokenizers, _ = load_checkpoint(folder, select_device(device))
    pairs = evaluation_pairs(meta, split, data_dir, limit)
    hyps = decode_texts(model, tokenizers, [p[0] for p in pairs], strategy, beam_size=beam_size)
    refs = [p[1] for p in pairs]
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
    exact = sum(h == r for h, r in zip(hyps, refs)) / max(len(refs), 1)
    return {"bleu": bleu, "exact_match": exact, "sentences": float(len(refs))}


def with_overrides(run: RunConfig, **overrides: Any) -> RunConfig:
    """``run`` with the overrides that are not None."""
    return replace(run, **{k: v for k, v in overrides.items() if v is not None})
