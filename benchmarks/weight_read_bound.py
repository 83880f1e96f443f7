"""Cached greedy per-token time (batch 1 unless --batch) vs the time to read, once, every weight a decoding step
uses (decoder layers without the cross-attention K/V projections, which run once per sentence,
plus the generator), at the memory bandwidth this script measures.

Every decoding step is timed right after a streaming read of a buffer as large as those weights,
so both see the same machine load; the table gives medians over all steps. To say where the rest
goes, a third timing per step runs only the matrix products of a step (the engine's fused and
transposed weights, nothing else): bound -> products -> step.

Rows: the fast engine (tfm_solution.fast.InferenceEngine), the chapters' cached decoder, and the
engine with bfloat16 weights (half the bytes; its tokens are compared with float32's).

At a larger batch (``--batch 8``) the same weights are read once per step for the whole batch, and
the split says how much of a step the products take once they are matrix-matrix products.

Usage: python benchmarks/weight_read_bound.py [--quick] [--batch B]
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from tfm_solution.bench import machine_facts, random_model
from tfm_solution.decoding import IncrementalDecoder
from tfm_solution.fast import InferenceEngine


def step_weight_bytes(model) -> int:
    """Bytes of the parameters one cached decoding step reads."""
    once = {id(p) for layer in model.decoder.layers for lin in layer.src_attn.linears[1:3] for p in lin.parameters()}
    used = [p for p in list(model.decoder.parameters()) + list(model.generator.parameters()) if id(p) not in once]
    return sum(p.numel() * p.element_size() for p in used)


def products_only(engine: InferenceEngine, batch: int) -> Callable[[], None]:
    """One step's matrix products (``batch`` rows each) over the engine's weights, and nothing else.
    Call it after ``engine.start`` for the same batch, which prepares the products for that many rows."""
    linears = engine.weights().step_linears()
    inputs = [torch.randn(batch, lin.weight_t.size(0), dtype=lin.weight_t.dtype) for lin in linears]
    return lambda: [lin(x) for lin, x in zip(linears, inputs)]


def timed_steps(step: Callable[[], object], products: Callable[[], None], buffer: torch.Tensor, scale: float,
                n: int) -> tuple[list[float], list[float], list[float]]:
    """Per step: (read time scaled to the weights' bytes, products time, step time)."""
    read_s, prod_s, step_s = [], [], []
    for _ in range(n):
        for fn, out in ((buffer.sum, read_s), (products, prod_s), (step, step_s)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [t * scale for t in read_s], prod_s, step_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model: proves the script runs")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--batch", type=int, default=1, help="sentences decoded together (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, vocab, n = ("tiny", 100, 8) if args.quick else ("base", 8000, 128)
    model = random_model(config, vocab)
    weights = step_weight_bytes(model)
    buffer = torch.ones(max(weights, 1 << 26) // 4)  # as large as the weights (64 MiB at least): beyond the caches
    scale = weights / (buffer.numel() * 4)
    batch = args.batch
    src = torch.randint(4, vocab, (batch, 32), generator=torch.Generator().manual_seed(0))
    src_mask = torch.ones(batch, 1, 32, dtype=torch.bool)
    fp32, bf16 = InferenceEngine(model), InferenceEngine(model, torch.bfloat16)

    def engine_run(engine: InferenceEngine):
        state, tokens = engine.start(src, src_mask, n), [torch.ones(batch, dtype=torch.long)]
        return lambda: tokens.append(engine.step(state, tokens[-1]).argmax(-1)), tokens

    def chapters_run():
        dec, ys = IncrementalDecoder(model, src, src_mask, use_cache=True), [torch.ones(batch, 1, dtype=torch.long)]
        return lambda: ys.append(torch.cat([ys[-1], dec.step(ys[-1]).argmax(-1, keepdim=True)], dim=1)), ys

    rows = {}
    with torch.no_grad():
        for _ in range(2):  # the first round warms up
            for name, (run, engine) in {"fast engine, float32": (lambda: engine_run(fp32), fp32),
                                        "chapters' cached decoder": (chapters_run, None),
                                        "fast engine, bfloat16 weights": (lambda: engine_run(bf16), bf16)}.items():
                step, tokens = run()
                products = products_only(engine, batch) if engine is not None else lambda: None
                rows[name] = timed_steps(step, products, buffer, scale, n) + (tokens,)
    bf16_bytes = sum(lin.nbytes() for lin in bf16.weights().step_linears())
    fp32_tokens = torch.stack(rows["fast engine, float32"][3][1:], dim=1)
    same_chapters = torch.equal(fp32_tokens, rows["chapters' cached decoder"][3][-1][:, 1:])
    differ = (torch.stack(rows["fast engine, bfloat16 weights"][3][1:], dim=1) != fp32_tokens).any(0).nonzero()
    bf16_note = f"the first token that differs is number {int(differ[0]) + 1}" if len(differ) else "all equal"
    print(machine_facts())
    print(f"config {config}, vocab {vocab}, batch {batch}, cached greedy, {n} steps, each timed after a read of "
          f"{weights / 1e6:.1f} MB (float32 weights per step)\n")
    print("| decoder | read bandwidth | weight-read bound | products only | step | **step / bound** | "
          "products / bound | step / products |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, (read_s, prod_s, step_s, _) in rows.items():
        bound, step = statistics.median(read_s), statistics.median(step_s)
        cells = [f"{weights / bound / 1e9:.1f} GB/s", f"{bound * 1e3:.2f} ms", "—", f"{step * 1e3:.2f} ms",
                 f"**{step / bound:.2f}x**", "—", "—"]
        if not name.startswith("chapters"):
            prod = statistics.median(prod_s)
            cells[2], cells[5], cells[6] = f"{prod * 1e3:.2f} ms", f"{prod / bound:.2f}x", f"{step / prod:.2f}x"
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nThe chapters' decoder chose the same {n} tokens as the fast engine: {'yes' if same_chapters else 'NO'}. "
          f"bfloat16 weights: {bf16_bytes / 1e6:.1f} MB of projections per step (their own read bound is half the "
          f"float32 one); tokens against float32's: {bf16_note}.")


if __name__ == "__main__":
    main()
