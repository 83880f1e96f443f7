"""Checkpoints: a folder with the model config, weights, tokenizers and training state.

    config.json            model dimensions, run settings, TrainState
    model.safetensors      weights (safetensors: loading runs no pickled code)
    optimizer.pt           optimizer + scheduler state, read back with ``weights_only=True``
    tokenizer_src.json, tokenizer_tgt.json
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from .data import TokenizerPair
from .encoder_decoder import EncoderDecoder, make_model
from .training import TrainState


def save_checkpoint(folder: Path, model: EncoderDecoder, model_config: dict[str, Any], run_config: dict[str, Any],
                    tokenizers: TokenizerPair, state: TrainState,
                    optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None) -> None:
    """Write everything needed to translate with, or resume training from, ``model``."""
    folder.mkdir(parents=True, exist_ok=True)
    save_model(model, str(folder / "model.safetensors"))
    tokenizers.save(folder)
    if optimizer is not None:
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, folder / "optimizer.pt")
    meta = {"model": model_config, "run": run_config, "state": asdict(state)}
    (folder / "config.json").write_text(json.dumps(meta, indent=2))


def load_checkpoint(folder: Path, device: torch.device | str = "cpu"
                    ) -> tuple[EncoderDecoder, dict[str, Any], TokenizerPair, TrainState]:
    """Rebuild the model from ``config.json`` and load its weights; returns
    (model in eval mode, the saved config, tokenizers, training state)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a checkpoint (no config.json); train one with "
                                f"`python -m tfm_solution train --out {folder}`")
    meta = json.loads((folder / "config.json").read_text())
    model = make_model(**meta["model"])
    load_model(model, str(folder / "model.safetensors"))
    model.to(device).eval()
    return model, meta, TokenizerPair.load(folder), TrainState(**meta["state"])


def load_optimizer(folder: Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Restore optimizer and scheduler state saved by ``save_checkpoint`` (tensors only, no code)."""
    saved = torch.load(Path(folder) / "optimizer.pt", weights_only=True, map_location="cpu")
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
