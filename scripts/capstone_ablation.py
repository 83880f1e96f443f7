"""Chapter 12's claim that reversal needs both the positional encoding and cross-attention, measured.

    python scripts/capstone_ablation.py       # all three, written to the file below
    python scripts/capstone_ablation.py 2     # only the third (printed)

Trains the course's reference model on Part A's task with Part A's budget (``tfm_solution.capstone``:
the same data, seeds and steps a student's model gets) three times: as it is, with the positional
encoding's table set to zero (the encoder then sees an unordered bag of symbols), and with every
decoder layer's cross-attention replaced by zeros (the decoder never sees the source). Writes the
held-out exact match and teacher-forced accuracy of each to ``tfm_solution/assets/capstone_ablation.json``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import tfm_solution  # noqa: E402
from autograder.exercises.ch12_capstone import TASK  # noqa: E402
from tfm_solution.capstone import ReversalTask, evaluate_reversal, scores, train_reversal  # noqa: E402
from tfm_solution.decoding import greedy_decode  # noqa: E402
from tfm_solution.training import train_with_accumulation  # noqa: E402

OUT = REPO / "tfm_solution" / "assets" / "capstone_ablation.json"


class NoCrossAttention(nn.Module):
    """Stands where a decoder layer's cross-attention was: it returns zeros, so the source never arrives."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask=None) -> torch.Tensor:
        return torch.zeros_like(query)


def without_positions(*args) -> nn.Module:
    model = tfm_solution.make_model(*args)
    for embed in (model.src_embed, model.tgt_embed):
        embed[1].pe.zero_()
    return model


def without_cross_attention(*args) -> nn.Module:
    model = tfm_solution.make_model(*args)
    for layer in model.decoder.layers:
        layer.src_attn = NoCrossAttention()
    return model


def reference_parts() -> dict:
    """The course's reference pieces, under the names ``train_reversal`` calls."""
    return {"make_model": tfm_solution.make_model, "Batch": tfm_solution.Batch,
            "LabelSmoothing": tfm_solution.LabelSmoothing, "SimpleLossCompute": tfm_solution.SimpleLossCompute,
            "rate": tfm_solution.rate, "train_with_accumulation": train_with_accumulation,
            "greedy_decode": functools.partial(greedy_decode, use_cache=False),
            # The ablation measures what a model learns, not its cache: a model without cross-attention has
            # nothing to cache for the source, so both decoders run uncached.
            "greedy_decode_cached": functools.partial(greedy_decode, use_cache=False)}


MODELS = (("the reference model", tfm_solution.make_model), ("without the positional encoding", without_positions),
          ("without cross-attention", without_cross_attention))


def main(argv: list[str] | None = None) -> int:
    """Every model of ``MODELS``, or those whose position (0, 1, 2) ``argv`` names (printed, not written)."""
    chosen = [int(a) for a in (argv if argv is not None else sys.argv[1:])] or range(len(MODELS))
    task = ReversalTask(**{k: v for k, v in TASK.items() if k != "module"})
    runs = []
    for label, make in (MODELS[i] for i in chosen):
        parts = {**reference_parts(), "make_model": make}
        trained = train_reversal(parts, task)
        found = evaluate_reversal(parts, trained.model, task, eval_seed=1)
        accuracy, forced, _ = scores(found.pairs, found.greedy, found.cached, found.forced, task.pad)
        runs.append({"model": label, "accuracy": accuracy, "forced": forced,
                     "train_cpu_s": round(trained.train_cpu_s, 1), "final_loss": round(trained.curve[-1][1], 4)})
        print(json.dumps(runs[-1]), flush=True)
    if len(runs) < len(MODELS):
        return 0
    OUT.write_text(json.dumps({"command": "python scripts/capstone_ablation.py", "task": TASK, "runs": runs},
                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
