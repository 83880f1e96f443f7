"""One decoding step's matrix products under each CPU kernel PyTorch offers for prepacked weights,
timed side by side: what weight prepacking gives, and which kernel the fast engine should use.

The products are those of a base-size decoding step (6 decoder layers of Q/K/V, attention output,
cross-attention query and output, the two feed-forward matrices, then the generator: 37 distinct
weights, 105 MB in float32), applied to ``batch`` rows each. Routes:

* ``F.linear``: the chapters' layout, ``(out, in)``;
* ``addmm, W^T``: the weight stored ``(in, out)`` (the engine's kernel for one row);
* ``MKL packed``: ``torch.ops.mkl._mkl_reorder_linear_weight`` once, ``_mkl_linear`` per call
  (what ``torch.compile`` with ``freezing`` emits for float32 linears), every weight packed;
* ``oneDNN packed``: ``torch.ops.mkldnn._reorder_linear_weight`` once, ``_linear_pointwise`` per call;
* ``mkldnn_linear``: ``torch._C._nn.mkldnn_linear`` over ``weight.to_mkldnn()`` (``torch.utils.mkldnn``),
  the input converted to and from oneDNN's layout per call;
* ``jit.freeze + optimize_for_inference``: the scripted products, frozen and optimized;
* ``torch.compile, freezing``: Inductor with ``torch._inductor.config.freezing = True`` (compiled once
  per batch size before timing; the compile time is printed);
* ``engine (DenseLinear)``: the engine's kernel, MKL-packing only the weights whose packed copy is
  at most 4x their size; ``engine int8``: the dynamic int8 kernel, for scale.

Each round runs every route once in turn; the table gives medians and the largest difference from
``F.linear``'s output.

Usage: python benchmarks/prepacked_products.py [--quick] [--repeat 20] [--threads 2] [--no-compile]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tfm_solution.bench import machine_facts
from tfm_solution.fast.linear import DenseLinear, Int8Linear


class Products(nn.Module):
    """The step's products as a module, each applied to its own input (what jit and compile see)."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        self.linears = nn.ModuleList(linears)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for i, lin in enumerate(self.linears):  # TorchScript iterates a ModuleList, not a zip over one
            out.append(lin(xs[i]))
        return out


def step_shapes(d_model: int, d_ff: int, layers: int, vocab: int) -> list[tuple[int, int]]:
    """``(in, out)`` of each product of one decoding step."""
    layer = [(d_model, 3 * d_model), (d_model, d_model), (d_model, d_model), (d_model, d_model),
             (d_model, d_ff), (d_ff, d_model)]
    return layer * layers + [(d_model, vocab)]


def routes(linears: list[nn.Linear], batch: int, compile_: bool) -> tuple[dict[str, Callable], dict[str, float]]:
    """Each route as a closure over prepared weights and inputs; and the seconds spent compiling."""
    xs = [torch.randn(batch, lin.in_features) for lin in linears]
    ws, bs = [lin.weight.detach() for lin in linears], [lin.bias.detach() for lin in linears]
    wt = [w.t().contiguous() for w in ws]
    mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, batch) for w in ws]
    dnn = [torch.ops.mkldnn._reorder_linear_weight(w, batch) for w in ws]
    dnn_w = [w.to_mkldnn() for w in ws]
    engine = [DenseLinear(w, b, torch.float32) for w, b in zip(ws, bs)]
    for lin in engine:
        lin.prepare(batch)
    int8 = [Int8Linear(w, b) for w, b in zip(ws, bs)]
    frozen = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.script(Products(linears).eval())))
    out: dict[str, Callable] = {
        "F.linear": lambda: [F.linear(x, w, b) for x, w, b in zip(xs, ws, bs)],
        "addmm, W^T": lambda: [torch.addmm(b, x, w) for x, w, b in zip(xs, wt, bs)],
        "MKL packed": lambda: [torch.ops.mkl._mkl_linear(x, p, w, b, batch) for x, p, w, b in zip(xs, mkl, ws, bs)],
        "oneDNN packed": lambda: [torch.ops.mkldnn._linear_pointwise(x, p, b, "none", [], "")
                                  for x, p, b in zip(xs, dnn, bs)],
        "mkldnn_linear": lambda: [torch._C._nn.mkldnn_linear(x.to_mkldnn(), w, b).to_dense()
                                  for x, w, b in zip(xs, dnn_w, bs)],
        "jit.freeze + optimize_for_inference": lambda: frozen(xs),
        "engine (DenseLinear)": lambda: [lin(x) for lin, x in zip(engine, xs)],
        "engine int8 (Int8Linear)": lambda: [lin(x) for lin, x in zip(int8, xs)],
    }
    seconds = {}
    if compile_:
        import torch._inductor.config as inductor

        inductor.freezing = True
        compiled = torch.compile(Products(linears).eval(), dynamic=False)
        start = time.perf_counter()
        compiled(xs)
        seconds["torch.compile, freezing"] = time.perf_counter() - start
        out["torch.compile, freezing"] = lambda: compiled(xs)
    return out, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: proves the script runs")
    parser.add_argument("--repeat", type=int, default=20, help="timed rounds after a warm-up round (default 20)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--batches", default="1,8", help="comma-separated row counts (default 1,8)")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile (about a minute)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = step_shapes(64, 256, 2, 100) if args.quick else step_shapes(512, 2048, 6, 8000)
    linears = [nn.Linear(i, o) for i, o in shapes]
    weights = sum(i * o * 4 for i, o in shapes)
    print(machine_facts())
    print(f"{len(shapes)} products, {weights / 1e6:.1f} MB of float32 weights; median of {args.repeat} rounds, "
          f"routes in turn\n")
    print("| route | " + " | ".join(f"batch {b} (ms)" for b in args.batches.split(",")) + " | " +
          " | ".join(f"vs F.linear, batch {b}" for b in args.batches.split(",")) + " | largest difference |")
    print("|---|" + "---:|" * (2 * len(args.batches.split(",")) + 1))
    results, errors, compile_seconds = {}, {}, {}
    with torch.inference_mode():
        for batch in map(int, args.batches.split(",")):
            fns, seconds = routes(linears, batch, not args.no_compile)
            compile_seconds.update({f"{k}, batch {batch}": v for k, v in seconds.items()})
            reference = fns["F.linear"]()
            for name, fn in fns.items():
                errors[name] = max(errors.get(name, 0.0), max(float((y - r).abs().max()) for y, r in
                                                              zip(fn(), reference)))
            times: dict[str, list[float]] = {name: [] for name in fns}
            for _ in range(args.repeat):
                for name, fn in fns.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            ratios = {name: statistics.median(a / b for a, b in zip(times[name], times["F.linear"]))
                      for name in fns}
            for name in fns:
                results.setdefault(name, []).append((statistics.median(times[name]), ratios[name]))
    for name, cells in results.items():
        print(f"| {name} | " + " | ".join(f"{t * 1e3:.2f}" for t, _ in cells) + " | " +
              " | ".join(f"{r:.2f}x" for _, r in cells) + f" | {errors[name]:.1e} |")
    for name, seconds in compile_seconds.items():
        print(f"\n{name}: compiled in {seconds:.0f} s", end="")
    print()


if __name__ == "__main__":
    main()
