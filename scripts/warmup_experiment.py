"""Post-LN vs Pre-LN, with and without learning-rate warm-up: the training curves of chapter 7.

Small encoder-decoder stacks (``make_model`` with ``norm_position="post"`` or ``"pre"``) learn to
reverse random token sequences with Adam (the paper's betas and eps). For each peak learning
rate, four runs: Post-LN and Pre-LN, each with a constant learning rate from step 1 and with a
linear warm-up to the same peak. Every run sees the same batches and starts from the same seed.

    python scripts/warmup_experiment.py            # about 10 minutes on one CPU core

writes ``tfm_solution/assets/norm_warmup.json``, which chapter 7 loads.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from tfm_solution import Batch, make_model

OUT = Path(__file__).resolve().parents[1] / "tfm_solution" / "assets" / "norm_warmup.json"
SETTINGS = {
    "task": "reverse a random sequence of 10 tokens",
    "vocab": 24,  # ids 0-2 are <s>, </s>, <blank>; the sequences use the other 21
    "length": 10,
    "batch": 32,
    "N": 6,
    "d_model": 64,
    "d_ff": 256,
    "h": 4,
    "dropout": 0.0,
    "steps": 400,
    "warmup_steps": 200,
    "learning_rates": [3e-3],
    "adam": {"betas": [0.9, 0.98], "eps": 1e-9},
    "seed": 0,
    "log_every": 10,
}


def reversal_batch(gen: torch.Generator, batch: int, length: int, vocab: int) -> Batch:
    """Sources of random ids 3..vocab-1; targets ``<s>`` followed by the source reversed."""
    src = torch.randint(3, vocab, (batch, length), generator=gen)
    tgt = torch.cat([torch.zeros(batch, 1, dtype=torch.long), src.flip(1)], dim=1)
    return Batch(src, tgt, pad=2)


def train_run(norm_position: str, lr: float, warmup: int, s: dict) -> list[float]:
    """One run; returns the mean training loss of every ``log_every`` steps."""
    torch.manual_seed(s["seed"])
    model = make_model(s["vocab"], s["vocab"], N=s["N"], d_model=s["d_model"], d_ff=s["d_ff"], h=s["h"],
                       dropout=s["dropout"], norm_position=norm_position)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=tuple(s["adam"]["betas"]), eps=s["adam"]["eps"])
    gen = torch.Generator().manual_seed(s["seed"] + 1)
    losses, window = [], []
    for step in range(1, s["steps"] + 1):
        scale = min(1.0, step / warmup) if warmup else 1.0
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        b = reversal_batch(gen, s["batch"], s["length"], s["vocab"])
        log_probs = model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask))
        loss = torch.nn.functional.nll_loss(log_probs.reshape(-1, s["vocab"]), b.tgt_y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        window.append(loss.item())
        if step % s["log_every"] == 0:
            losses.append(round(sum(window) / len(window), 4))
            window = []
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = {**SETTINGS, "uniform_loss": round(math.log(SETTINGS["vocab"] - 3), 4)}
    runs = []
    for lr in settings["learning_rates"]:
        for norm_position in ("post", "pre"):
            for warmup in (0, settings["warmup_steps"]):
                start = time.perf_counter()
                loss = train_run(norm_position, lr, warmup, settings)
                runs.append({"norm_position": norm_position, "lr": lr, "warmup": warmup, "loss": loss})
                print(f"lr {lr:g} {norm_position:4s} warm-up {warmup:3d}: final loss {loss[-1]:.3f} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": settings, "runs": runs}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
