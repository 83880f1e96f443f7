"""Checkpoints that survive a crash at any instant, and the flat folder a finished model ships as.

A training run's folder (``python -m tfm_solution train --out RUN``)::

    run.json                  model config and run settings, written once before the first step
    tokenizer.json            the shared subword tokenizer (or tokenizer_src.json + tokenizer_tgt.json),
                              written once; a resumed run reads it and never trains another
    checkpoints/step-NNNNNNN/ model.safetensors and trainer.pt (optimizer, scheduler, RNG states,
                              TrainState, where in which epoch, best validation loss, the metrics so far)
    last                      names the newest complete checkpoint (what --resume continues)
    best                      names the checkpoint with the lowest validation loss (what translate uses)
    metrics.jsonl             one JSON object per finished epoch, rewritten from the newest checkpoint

A checkpoint is written into a temporary folder, flushed to disk and renamed into place; only then
do ``last`` (and ``best``) change, each by writing a temporary file and renaming it over the old
one, which POSIX makes atomic. A kill at any instant therefore leaves ``last`` naming a complete
checkpoint, either the previous one or the new one; folders no pointer names are removed at the
next save. The metrics log lives inside the checkpoint, so an epoch is logged exactly when its
checkpoint exists: never lost, never repeated by a resume.

An exported model (``export_model``; the course model is one) is flat: ``config.json``,
``model.safetensors``, the tokenizer file(s) and, optionally, ``metrics.jsonl``. Its weights leave out
the sinusoid tables (the ``pe`` buffers of the positional encodings): they are no parameters, and
``make_model`` rebuilds them from the dimensions in ``config.json``. Loading rounds the rebuilt tables
to the precision the weights were exported in, as an export of the whole model would have, so an
exported model loads as exactly the model that was measured. ``load_checkpoint`` reads both kinds,
with or without tables.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from .data import TokenizerPair
from .encoder_decoder import EncoderDecoder, make_model
from .positional_encoding import PositionalEncoding
from .training import TrainState

CHECKPOINTS = "checkpoints"


@dataclass
class Progress:
    """Where a run stands: what ``trainer.pt`` holds besides the optimizer and scheduler."""

    state: TrainState = field(default_factory=TrainState)
    epoch: int = 0  # the epoch under way (or next to start)
    batches_done: int = 0  # micro-batches of that epoch already trained on (by this rank)
    best: float = float("inf")  # lowest validation loss so far
    epoch_loss: float = 0.0  # summed token loss of the epoch under way so far
    epoch_tokens: int = 0  # its target tokens
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one entry per finished epoch


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so a reader sees the old file or the new one, never a mix."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        tmp.write(text)
        os.fchmod(tmp.fileno(), 0o666 & ~_umask())  # temporary files are private; the result is not
        tmp.flush()
        os.fsync(tmp.fileno())
    os.replace(tmp.name, path)
    _fsync_dir(path.parent)


@contextmanager
def atomic_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary folder next to ``target``; when the block ends without error, flush
    its files and rename it to ``target`` (which must not exist). On error it is removed."""
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        yield tmp
        for path in tmp.iterdir():
            os.chmod(path, 0o666 & ~_umask())  # some writers create private files
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        os.rename(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def start_run(folder: Path, model_config: dict[str, Any], run_config: dict[str, Any],
              tokenizers: TokenizerPair) -> None:
    """Write ``run.json`` and the tokenizer(s) of a new run, each atomically, once."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizers.save(folder)
    atomic_write_text(folder / "run.json", json.dumps({"model": model_config, "run": run_config}, indent=2))


def read_run(folder: Path) -> dict[str, Any] | None:
    """``run.json`` of a run folder (model and run configs), or None when there is none."""
    path = Path(folder) / "run.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _pointer(folder: Path, name: str) -> Path | None:
    path = folder / name
    if not path.is_file():
        return None
    return folder / CHECKPOINTS / path.read_text().strip()


def save_checkpoint(folder: Path, model: EncoderDecoder, optimizer: torch.optim.Optimizer, scheduler: Any,
                    progress: Progress, is_best: bool) -> Path:
    """Write a complete checkpoint of the run in ``folder`` and point ``last`` (and ``best`` when
    ``is_best``) at it, atomically; returns the checkpoint's folder."""
    root = folder / CHECKPOINTS
    root.mkdir(exist_ok=True)
    name = f"step-{progress.state.accum_step:07d}-{progress.epoch:04d}-{progress.batches_done:06d}"
    target = root / name
    if target.exists():  # the same point saved again (e.g. a limit reached at an epoch's end)
        shutil.rmtree(target)
    with atomic_folder(target) as tmp:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save({
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "progress": {**asdict(progress), "state": asdict(progress.state)},
        }, tmp / "trainer.pt")
    atomic_write_text(folder / "last", name)
    if is_best:
        atomic_write_text(folder / "best", name)
    atomic_write_text(folder / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in progress.metrics))
    keep = {p.name for p in (_pointer(folder, "last"), _pointer(folder, "best")) if p is not None}
    for old in root.iterdir():
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
    return target


def resume_checkpoint(folder: Path, model: EncoderDecoder, optimizer: torch.optim.Optimizer,
                      scheduler: Any) -> Progress | None:
    """Load the newest complete checkpoint of the run in ``folder`` into ``model``, ``optimizer``
    and ``scheduler``, restore the RNG states and return where the run stands (None: nothing saved)."""
    folder = Path(folder)
    last = _pointer(folder, "last")
    if last is None:
        return None
    load_model(model, str(last / "model.safetensors"))
    saved = torch.load(last / "trainer.pt", weights_only=True, map_location="cpu")
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng_cpu"])
    if saved["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["rng_cuda"])
    p = saved["progress"]
    progress = Progress(**{**p, "state": TrainState(**p["state"])})
    # the log on disk may lag the checkpoint if a crash came between the two: the checkpoint's copy wins
    atomic_write_text(folder / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in progress.metrics))
    return progress


def rebuilt_buffers(model: torch.nn.Module) -> set[str]:
    """The ``state_dict`` keys that ``make_model`` rebuilds exactly from the model's dimensions: the
    positional encodings' sinusoid tables. An export leaves them out of its weights file."""
    return {f"{name}.pe" for name, module in model.named_modules() if isinstance(module, PositionalEncoding)}


def export_model(folder: Path, model: EncoderDecoder, meta: dict[str, Any], tokenizers: TokenizerPair,
                 dtype: torch.dtype = torch.float32, metrics: list[dict[str, Any]] | None = None) -> None:
    """Write ``model`` as a flat folder (``config.json``, ``model.safetensors`` in ``dtype`` without the
    sinusoid tables, the tokenizer(s), ``metrics.jsonl``), replacing ``folder`` atomically."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(folder.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    with atomic_folder(staging) as tmp:
        exported = copy.deepcopy(model).to(dtype)
        for module in exported.modules():
            if isinstance(module, PositionalEncoding):
                module.register_buffer("pe", None)  # a None buffer is left out of the state_dict
        save_model(exported, str(tmp / "model.safetensors"))
        tokenizers.save(tmp)
        (tmp / "config.json").write_text(json.dumps({**meta, "dtype": str(dtype).removeprefix("torch.")}, indent=2))
        if metrics is not None:
            (tmp / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(folder, old)
        os.rename(staging, folder)
        shutil.rmtree(old)
    else:
        os.rename(staging, folder)


def load_checkpoint(folder: Path, device: torch.device | str = "cpu"
                    ) -> tuple[EncoderDecoder, dict[str, Any], TokenizerPair, TrainState]:
    """The model of a run folder (its ``best`` checkpoint) or of an exported folder, in eval mode
    and float32 on ``device``; returns (model, {"model": ..., "run": ...}, tokenizers, training state)."""
    folder = Path(folder)
    meta = read_run(folder)
    state = TrainState()
    if meta is not None:
        weights = _pointer(folder, "best") or _pointer(folder, "last")
        if weights is None:
            raise FileNotFoundError(f"{folder} holds a run with no checkpoint yet; train on with --resume")
        saved = torch.load(weights / "trainer.pt", weights_only=True, map_location="cpu")
        state = TrainState(**saved["progress"]["state"])
    elif (folder / "config.json").is_file():
        meta, weights = json.loads((folder / "config.json").read_text()), folder
    else:
        raise FileNotFoundError(f"{folder} is not a checkpoint (no run.json or config.json); train one with "
                                f"`python -m tfm_solution train --out {folder}`")
    model = make_model(**meta["model"])
    # float16 weights are copied into float32 ones; a file without the sinusoid tables keeps the exact
    # ones make_model built, and anything else missing or unexpected is an error
    missing, unexpected = load_model(model, str(weights / "model.safetensors"), strict=False)
    rebuilt = set(missing) & rebuilt_buffers(model)
    if set(missing) - rebuilt or unexpected:
        raise RuntimeError(f"{weights / 'model.safetensors'} does not fit the model of its config: missing "
                           f"{sorted(set(missing) - rebuilt)}, unexpected {sorted(unexpected)}")
    exported_as = getattr(torch, meta.get("dtype", "float32"))
    with torch.no_grad():
        for name in rebuilt:  # at the export's precision, like every other tensor of the file
            model.get_buffer(name).copy_(model.get_buffer(name).to(exported_as))
    model.to(device).eval()
    return model, meta, TokenizerPair.load(folder), state
