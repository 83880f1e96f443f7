"""Experiments end to end: named configs, the training driver (copy task or Multi30k),
translation and evaluation of a checkpoint. The CLI (``python -m tfm_solution``) calls these.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import sacrebleu
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from .checkpoint import Progress, load_checkpoint, read_run, resume_checkpoint, save_checkpoint, start_run
from .data import (BOS, EOS, PAD, Example, TokenizerPair, copy_examples, copy_tokenizer, iterate_batches,
                   load_multi30k, multi30k_dir, pad_batch, token_batches)
from .decoding import beam_search, greedy_decode, sample
from .encoder_decoder import EncoderDecoder, make_model
from .training import (LabelSmoothing, SimpleLossCompute, TrainState, data_parallel, distributed_context,
                       make_optimizer, rank_device, run_epoch, select_device)

MODEL_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(N=2, d_model=64, d_ff=256, h=4),
    "small": dict(N=3, d_model=256, d_ff=1024, h=4),
    "course": dict(N=3, d_model=128, d_ff=512, h=4),
    "base": dict(N=6, d_model=512, d_ff=2048, h=8),
}
COPY_VOCAB, COPY_LEN = 11, 10
SAMPLE_SENTENCES = 5  # validation sentences translated (greedy) after every epoch, for the log
# settings a resumed run may change: how long it goes on
RESUMABLE = frozenset({"epochs", "max_steps", "max_seconds", "save_every"})


@dataclass
class RunConfig:
    """Everything a training run depends on (saved in the checkpoint)."""

    task: str = "copy"  # "copy" or "multi30k"
    config: str = "tiny"
    dropout: float = 0.1
    attention_kernel: str = "sdpa"
    vocab_size: int = 8000  # Multi30k subword vocabulary (per side unless shared)
    shared_vocab: bool = True
    tie_embeddings: bool = False  # one matrix for both embeddings and the generator (needs shared_vocab)
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
    save_every: int | None = None  # also checkpoint every N optimizer steps (else after each epoch)
    seed: int = 0
    copy_train_size: int = 2000  # fresh random sequences per epoch (copy task)


def default_run(task: str, config: str) -> RunConfig:
    """Sensible settings per task and size; ``multi30k`` + ``course`` is the course model's recipe."""
    if config not in MODEL_SIZES:
        raise ValueError(f"config must be one of {sorted(MODEL_SIZES)}, got {config!r}")
    if task == "copy":
        return RunConfig(task, config, dropout=0.0, max_tokens=600, smoothing=0.0, warmup=200, factor=0.25, epochs=12)
    if task == "multi30k":
        if config == "course":
            return RunConfig(task, config, vocab_size=5000, tie_embeddings=True, max_tokens=3000, warmup=800,
                             factor=0.5, epochs=10)
        vocab = {"tiny": 2000, "small": 4000, "base": 8000}[config]
        return RunConfig(task, config, vocab_size=vocab, max_tokens={"base": 6000}.get(config, 3000),
                         warmup={"base": 2000}.get(config, 800), epochs=8)
    raise ValueError(f"task must be 'copy' or 'multi30k', got {task!r}")


class ResumeMismatchError(ValueError):
    """``--resume`` was given settings that contradict the saved run's."""


def resume_settings(out: Path, overrides: dict[str, Any]) -> RunConfig:
    """The saved run's settings with ``overrides`` applied; raises ``ResumeMismatchError`` when an
    override other than the run's length contradicts them (the model, its vocabulary and its data
    are fixed once a run has started)."""
    saved = read_run(out)
    if saved is None:
        raise FileNotFoundError(f"{out} holds no run to resume (no run.json)")
    run = RunConfig(**saved["run"])
    clashes = [f"{k}={v!r} (the run has {getattr(run, k)!r})" for k, v in overrides.items()
               if v is not None and k not in RESUMABLE and v != getattr(run, k)]
    if clashes:
        raise ResumeMismatchError(f"cannot resume {out} with different settings: {', '.join(clashes)}. "
                                  f"Drop them, or train a new run with another --out.")
    return with_overrides(run, **{k: v for k, v in overrides.items() if k in RESUMABLE})


@dataclass
class Prepared:
    tokenizers: TokenizerPair
    train: list[Example]
    val: list[Example]
    too_long: int
    samples: list[tuple[str, str]]  # (source, reference) of the sentences the log translates


def prepare_data(run: RunConfig, data_dir: str | Path | None = None, tokenizers: TokenizerPair | None = None
                 ) -> Prepared:
    """Tokenizers (trained on the training split only, unless given) and id sequences of train and val."""
    if run.task == "copy":
        tok = copy_tokenizer(COPY_VOCAB)
        val = copy_examples(200, COPY_LEN, COPY_VOCAB, torch.Generator().manual_seed(run.seed + 10_000))
        return Prepared(TokenizerPair(tok, tok), [], val, 0, [])
    folder = multi30k_dir(data_dir)
    train_pairs = load_multi30k("train", folder)[: run.train_subset]
    val_pairs = load_multi30k("val", folder)[: run.val_subset]
    tokenizers = tokenizers or TokenizerPair.train(train_pairs, run.vocab_size, run.shared_vocab)
    train, too_long = tokenizers.encode_pairs(train_pairs, run.max_len)
    val, val_too_long = tokenizers.encode_pairs(val_pairs, run.max_len)
    return Prepared(tokenizers, train, val, too_long + val_too_long, val_pairs[:SAMPLE_SENTENCES])


def model_config(run: RunConfig, tokenizers: TokenizerPair) -> dict[str, Any]:
    return dict(src_vocab=tokenizers.src.get_vocab_size(), tgt_vocab=tokenizers.tgt.get_vocab_size(),
                dropout=run.dropout, attention_kernel=run.attention_kernel, tie_embeddings=run.tie_embeddings,
                **MODEL_SIZES[run.config])


def _saved_tokenizers(run: RunConfig, out: Path) -> TokenizerPair | None:
    """The tokenizer(s) a run wrote when it started (None for the copy task, whose vocabulary is fixed)."""
    return None if run.task == "copy" else TokenizerPair.load(out)


def train(run: RunConfig, out: Path, device: str = "auto", data_dir: str | Path | None = None,
          resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train, validating after every epoch; returns the last epoch's metrics.

    ``out`` is a run folder (see ``checkpoint``): a crash-safe checkpoint after every epoch and
    when a limit stops the run, ``best`` naming the lowest validation loss, ``metrics.jsonl`` with
    one entry per epoch (``partial`` when a limit stopped it midway). ``resume=True`` continues
    from the newest checkpoint exactly: weights, optimizer, scheduler, RNG, epoch and position
    in it, best loss, metrics, tokenizers and settings (``resume_settings`` checks them).

    Under ``torchrun`` each process uses its own device (``rank_device``), takes every
    ``world``-th batch, and DDP averages gradients; rank 0 decides when to stop, for all.
    """
    out = Path(out)
    saved = read_run(out)
    if saved is not None and not resume:
        raise FileExistsError(f"{out} already holds a run; pass --resume to continue it, or choose another --out")
    resume = resume and saved is not None
    if resume:
        resume_settings(out, {k: v for k, v in asdict(run).items() if k not in RESUMABLE})
    dev = rank_device(device)
    with distributed_context("nccl" if dev.type == "cuda" else "gloo") as (rank, world):
        torch.manual_seed(run.seed)
        if resume:
            data = prepare_data(run, data_dir, _saved_tokenizers(run, out))
        else:  # only rank 0 trains the tokenizer; the others read what it wrote: one vocabulary for all
            if rank == 0:
                data = prepare_data(run, data_dir)
                start_run(out, model_config(run, data.tokenizers), asdict(run), data.tokenizers)
            if world > 1:
                dist.barrier()
            if rank != 0:
                data = prepare_data(run, data_dir, _saved_tokenizers(run, out))
        mcfg = model_config(run, data.tokenizers)
        model = make_model(**mcfg).to(dev)
        optimizer, scheduler = make_optimizer(model, mcfg["d_model"], run.factor, run.warmup)
        at = (resume_checkpoint(out, model, optimizer, scheduler) if resume else None) or Progress()
        wrapped = data_parallel(model, dev)
        criterion = LabelSmoothing(mcfg["tgt_vocab"], PAD, run.smoothing)
        loss_compute = SimpleLossCompute(model.generator, criterion)
        start = time.perf_counter()
        tokens_at_start = at.state.tokens
        stop = False

        def limit_reached(st: TrainState) -> bool:
            return (run.max_steps is not None and st.accum_step >= run.max_steps) or (
                run.max_seconds is not None and time.perf_counter() - start >= run.max_seconds)

        def on_step(st: TrainState, loss: float) -> bool:
            nonlocal stop, tokens_seen
            at.batches_done = st.step - steps_before + done_before
            at.epoch_loss += loss * (st.tokens - tokens_seen)  # the epoch's loss survives a resume midway
            at.epoch_tokens += st.tokens - tokens_seen
            tokens_seen = st.tokens
            stop = agreed(rank == 0 and limit_reached(st), dev)
            if run.save_every and st.accum_step % run.save_every == 0 and not stop and rank == 0:
                save_checkpoint(out, model, optimizer, scheduler, at, is_best=False)
            return stop

        metrics: dict[str, Any] = at.metrics[-1] if at.metrics else {}
        stop = agreed(rank == 0 and limit_reached(at.state), dev)
        while at.epoch < run.epochs and not stop:
            gen = torch.Generator().manual_seed(run.seed + 1 + at.epoch)
            train_examples = data.train or copy_examples(run.copy_train_size, COPY_LEN, COPY_VOCAB, gen)
            batches = token_batches(train_examples, run.max_tokens, gen)
            batches = batches[rank: len(batches) - len(batches) % world: world]
            steps_before, done_before, tokens_seen = at.state.step, at.batches_done, at.state.tokens
            todo = batches[at.batches_done:]
            bar = tqdm(todo, desc=f"epoch {at.epoch}", disable=not progress or rank != 0, leave=False)
            wrapped.train()
            _, at.state = run_epoch(iterate_batches(train_examples, bar), wrapped, loss_compute, optimizer,
                                             scheduler, "train", run.accum_iter, at.state, dev, on_step)
            finished = at.batches_done >= len(batches)
            train_loss = at.epoch_loss / max(at.epoch_tokens, 1)
            model.eval()
            val_loss, _ = run_epoch(iterate_batches(data.val, token_batches(data.val, run.max_tokens)), model,
                                    loss_compute, mode="eval", device=dev)
            elapsed = time.perf_counter() - start
            metrics = dict(epoch=at.epoch, step=at.state.accum_step, train_loss=train_loss, val_loss=val_loss,
                           lr=scheduler.get_last_lr()[0], seconds=elapsed, too_long=data.too_long,
                           tokens_per_s=world * (at.state.tokens - tokens_at_start) / elapsed)
            if not finished:
                metrics["partial"] = True
            if data.samples and rank == 0:
                outputs = decode_texts(model, data.tokenizers, [s for s, _ in data.samples])
                metrics["samples"] = [dict(source=s, reference=r, output=o) for (s, r), o in zip(data.samples, outputs)]
            at.metrics.append(metrics)
            is_best = val_loss < at.best
            at.best = min(at.best, val_loss)
            if finished:
                at.epoch, at.batches_done, at.epoch_loss, at.epoch_tokens = at.epoch + 1, 0, 0.0, 0
            if rank == 0:
                save_checkpoint(out, model, optimizer, scheduler, at, is_best)
                if progress:
                    print(f"epoch {metrics['epoch']} step {at.state.accum_step} train loss {train_loss:.3f} "
                          f"val loss {val_loss:.3f} ({metrics['tokens_per_s']:.0f} tokens/s)")
            if world > 1:
                dist.barrier()  # no rank runs ahead of the checkpoint
    return metrics


def agreed(stop_here: bool, device: torch.device) -> bool:
    """Rank 0's decision to stop, shared with every rank (one all-reduce), so all stop at the same step."""
    if not (dist.is_available() and dist.is_initialized()):
        return stop_here
    flag = torch.tensor([1.0 if stop_here else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def decode_texts(model: EncoderDecoder, tokenizers: TokenizerPair, texts: list[str], strategy: str = "greedy",
                 use_cache: bool = True, beam_size: int = 4, max_extra: int = 50, batch_size: int = 64,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 seed: int = 0, engine: Any = None) -> list[str]:
    """Translate ``texts`` with ``strategy`` (greedy, beam or sample), in batches.

    ``engine``: a ``tfm_solution.fast.InferenceEngine`` over ``model`` to decode with, in place of
    ``decoding``'s functions (``use_cache`` does not apply)."""
    if strategy not in ("greedy", "beam", "sample"):
        raise ValueError(f"strategy must be greedy, beam or sample, got {strategy!r}")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    results: list[str] = []
    for i in range(0, len(texts), batch_size):
        src = pad_batch([tokenizers.encode_src(t) for t in texts[i: i + batch_size]]).to(device)
        src_mask = (src != PAD).unsqueeze(-2)
        max_len = src.size(1) + max_extra
        if strategy == "beam" and engine is not None:
            rows = [h[0].tokens for h in engine.beam_search(src, src_mask, max_len, BOS, EOS, beam_size=beam_size)]
        elif strategy == "beam":
            hyps = beam_search(model, src, src_mask, max_len, BOS, EOS, beam_size=beam_size, use_cache=use_cache)
            rows = [h[0].tokens for h in hyps]
        elif strategy == "greedy":
            rows = (engine.greedy_decode(src, src_mask, max_len, BOS, EOS, PAD) if engine is not None
                    else greedy_decode(model, src, src_mask, max_len, BOS, EOS, PAD, use_cache)).tolist()
        else:
            draw = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
            rows = (engine.sample(src, src_mask, max_len, BOS, EOS, PAD, **draw) if engine is not None
                    else sample(model, src, src_mask, max_len, BOS, EOS, PAD, use_cache, **draw)).tolist()
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
