"""Training tokens/s of make_model vs torch.nn.Transformer of the same dimensions (embeddings,
positional encoding and generator included), same batch, forward + backward + Adam step, measured
side by side (the contenders alternate), eager against eager.

make_model runs twice per LayerNorm flavour (the notes' and torch's): through its own forward (the
chapters' modules) and through tfm_solution.fast.FastTraining (the same parameters, fused
projections, fewer LayerNorm kernels, masks made additive once per pass).

Usage: python benchmarks/training_throughput.py [--quick]
"""

import argparse
import math
import warnings

import torch
from torch import nn

from tfm_solution import PositionalEncoding
from tfm_solution.bench import MODEL_SIZES, machine_facts, median_times
from tfm_solution.data import PAD
from tfm_solution.encoder_decoder import make_model
from tfm_solution.fast import FastTraining
from tfm_solution.masks import Batch
from tfm_solution.training import LabelSmoothing, make_optimizer


class TorchTransformer(nn.Module):
    """nn.Transformer (Pre-LN, batch first) with the same embeddings, positions and generator."""

    def __init__(self, vocab: int, N: int, d_model: int, d_ff: int, h: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.d_model = d_model
        self.src_embed, self.tgt_embed = nn.Embedding(vocab, d_model), nn.Embedding(vocab, d_model)
        self.position = PositionalEncoding(d_model, dropout)
        with warnings.catch_warnings():  # its note that Pre-LN disables the nested-tensor fast path
            warnings.simplefilter("ignore", UserWarning)
            self.core = nn.Transformer(d_model, h, N, N, d_ff, dropout, batch_first=True, norm_first=True)
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        scale = math.sqrt(self.d_model)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        out = self.core(self.position(self.src_embed(src) * scale), self.position(self.tgt_embed(tgt) * scale),
                        tgt_mask=causal, tgt_is_causal=True)
        return self.proj(out).log_softmax(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and batch: proves the script runs")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, vocab, batch, length = ("tiny", 100, 4, 8) if args.quick else ("base", 8000, 32, 32)
    size = MODEL_SIZES[config]
    g = torch.Generator().manual_seed(0)
    data = Batch(torch.randint(4, vocab, (batch, length), generator=g),
                 torch.randint(4, vocab, (batch, length + 1), generator=g), pad=PAD)
    criterion = LabelSmoothing(vocab, PAD, 0.1)
    tokens = int(data.ntokens)

    def trainer(model: nn.Module, forward):
        opt, sched = make_optimizer(model, size["d_model"], warmup=4000)

        def step() -> None:
            log_probs = forward(model)
            loss = criterion(log_probs.reshape(-1, vocab), data.tgt_y.reshape(-1)) / tokens
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
        return step

    def chapters(model):
        return model.generator(model(data.src, data.tgt, data.src_mask, data.tgt_mask))

    def fast(model):
        return model.generator(FastTraining(model)(data.src, data.tgt, data.src_mask, data.tgt_mask))

    def model(layer_norm: str):
        return make_model(vocab, vocab, **size, attention_kernel="sdpa", layer_norm=layer_norm).train()

    contenders = {
        "nn.Transformer": trainer(TorchTransformer(vocab, **size).train(), lambda m: m(data.src, data.tgt)),
        "make_model, notes' LayerNorm, chapters' forward": trainer(model("notes"), chapters),
        "make_model, notes' LayerNorm, fast forward": trainer(model("notes"), fast),
        "make_model, torch LayerNorm, chapters' forward": trainer(model("torch"), chapters),
        "make_model, torch LayerNorm, fast forward": trainer(model("torch"), fast),
    }
    times = median_times(contenders, repeat=args.repeat, warmup=1)
    base = tokens / times["nn.Transformer"]
    print(machine_facts())
    print(f"config {config}, vocab {vocab}, batch {batch} x {length} tokens ({tokens} target tokens per step), "
          f"median of {args.repeat} steps\n")
    print("| model | s / step | target tokens / s | vs nn.Transformer |")
    print("|---|---:|---:|---:|")
    for name, t in times.items():
        print(f"| {name} | {t:.3f} | {tokens / t:.0f} | {tokens / t / base:.2f}x |")


if __name__ == "__main__":
    main()
