"""The course model: a small German→English Transformer trained on Multi30k, shipped with the package.

Chapters 5, 8, 9, 10 and 11 look inside it (attention heads, cross-attention alignments, its
training log, its translations, cached decoding). ``make course-model`` retrains it from scratch
with one seeded command and exports it here; ``MODEL_CARD.md`` beside the weights says what it is
and how good it is.

    model, tok = load_course_model()          # EncoderDecoder in eval mode, TokenizerPair
    log = load_training_log()                 # one dict per epoch, with five sample translations
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .checkpoint import export_model, load_checkpoint
from .data import TokenizerPair
from .encoder_decoder import EncoderDecoder

COURSE_MODEL_DIR = Path(__file__).parent / "assets" / "course_model"


def load_course_model(device: torch.device | str = "cpu", folder: Path = COURSE_MODEL_DIR
                      ) -> tuple[EncoderDecoder, TokenizerPair]:
    """The course model in eval mode (float32 on ``device``) and its shared tokenizer."""
    model, _, tokenizers, _ = load_checkpoint(folder, device)
    return model, tokenizers


def course_weights(folder: Path = COURSE_MODEL_DIR) -> dict[str, torch.Tensor]:
    """The course model's weights (float16, as exported) under the names of the notes' ``make_model``: the model
    ties its embeddings and output projection (``tie_embeddings``), so the one matrix stands under all three names.
    Load them into a model built by any notes' ``make_model`` with ``tfm_solution.capstone.load_weights``."""
    from safetensors.torch import load_file

    weights = load_file(Path(folder) / "model.safetensors")
    for shared in ("src_embed.0.lut.weight", "tgt_embed.0.lut.weight"):
        weights.setdefault(shared, weights["generator.proj.weight"])
    return weights


def load_training_log(folder: Path = COURSE_MODEL_DIR) -> list[dict[str, Any]]:
    """The course model's metrics, one dict per epoch: ``epoch``, ``step``, ``train_loss``,
    ``val_loss``, ``lr``, ``seconds``, ``tokens_per_s`` and ``samples`` (five validation sentences
    as ``{"source", "reference", "output"}``, translated greedily at the end of that epoch)."""
    return [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines() if line]


def course_model_config(folder: Path = COURSE_MODEL_DIR) -> dict[str, Any]:
    """The saved ``config.json``: the model's dimensions (``model``) and the run's settings (``run``)."""
    return json.loads((Path(folder) / "config.json").read_text())


def export_course_model(run: Path, folder: Path = COURSE_MODEL_DIR) -> None:
    """Export the best checkpoint of the training run ``run`` (weights in float16) into ``folder``."""
    model, meta, tokenizers, state = load_checkpoint(run)
    metrics = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line]
    export_model(folder, model, {"model": meta["model"], "run": meta["run"], "optimizer_steps": state.accum_step},
                 tokenizers, torch.float16, metrics)
