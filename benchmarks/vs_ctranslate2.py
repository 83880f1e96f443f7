"""Greedy decoding against CTranslate2 (float32 and int8), the fast engine (float32 and int8) and
Hugging Face generate, on the same architecture, timed side by side in one run.

CTranslate2 is the engine OPUS-MT and Argos Translate run on for CPU translation. The script builds
its model from ours, with no download: ``TransformerSpec.from_config((N, N), h, pre_norm=True)``
filled with our random weights (self-attention Q/K/V fused into one ``(3d, d)`` matrix,
cross-attention K/V into one ``(2d, d)``, our sinusoid table as its position encodings), saved
once as float32 and once quantized to int8. Our model uses torch's LayerNorm (eps 1e-5), the
flavour CTranslate2 computes, so both engines run the same function: the script checks that
CTranslate2's float32 tokens equal the fast engine's. ``MarianMTModel`` gets the same dimensions
and its own random weights.

Every contender decodes exactly N new tokens (CTranslate2: ``min_decoding_length = max_decoding_length
= N``; ours: no end symbol; HF: ``min_new_tokens = max_new_tokens = N``) with the same thread
budget (torch's intra-op threads; CTranslate2's ``intra_threads``, one translator thread). Each
round runs every contender once, in turn; after a warm-up round, the table gives each one's
median time and the median over rounds of each round's time ratio (ours / theirs: <= 1.00x means
ours is at least as fast).

Then each contender's fastest round, and the fast engine's loop split in the same rounds: the
encoder with the cross-attention keys and values (``start``), the steps (each timed), what the
loop adds around them (choosing each token, bookkeeping), against ``greedy_decode``'s own time;
and after each step, the step's matrix products alone, so that a step splits into its products
and everything else (attention, LayerNorms, views, dispatch).

Usage: python benchmarks/vs_ctranslate2.py [--quick] [--repeat 5] [--threads 2] [--settings 1x64,1x128,8x64,8x128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tfm_solution.bench import machine_facts
from tfm_solution.encoder_decoder import EncoderDecoder, make_model
from tfm_solution.experiment import MODEL_SIZES
from tfm_solution.fast import InferenceEngine

sys.path.insert(0, str(Path(__file__).parent))
from weight_read_bound import products_only  # noqa: E402  (a script beside this one)

SRC_LEN, START, PAD = 32, 1, 0
VOCAB_SPECIALS = ["<blank>", "<s>", "</s>", "<unk>"]  # ids 0-3, as CTranslate2 names them; 1 starts a sentence


def vocabulary(size: int) -> list[str]:
    """Token strings for ids ``0 .. size - 1``: CTranslate2 reads and writes tokens, not ids."""
    return VOCAB_SPECIALS + [f"w{i}" for i in range(len(VOCAB_SPECIALS), size)]


def ctranslate2_spec(model: EncoderDecoder, vocab: list[str]):
    """A CTranslate2 ``TransformerSpec`` holding ``model``'s weights (Pre-LN, torch LayerNorm, untied)."""
    from ctranslate2.specs import transformer_spec

    enc, dec = model.encoder.layers, model.decoder.layers
    if any(layer.sublayer[0].norm_position != "pre" or layer.sublayer[0].norm.kind != "torch"
           for layer in [*enc, *dec]):
        raise ValueError("CTranslate2 computes Pre-LN with torch's LayerNorm: build the model with "
                         "norm_position='pre', layer_norm='torch'")

    def array(t: torch.Tensor) -> np.ndarray:
        return t.detach().float().numpy().copy()

    def linear(spec, *linears: torch.nn.Linear) -> None:  # several linears: fused along the output axis
        spec.weight = np.concatenate([array(lin.weight) for lin in linears])
        spec.bias = np.concatenate([array(lin.bias) for lin in linears])

    def norm(spec, module) -> None:
        spec.gamma, spec.beta = array(module.a_2), array(module.b_2)

    spec = transformer_spec.TransformerSpec.from_config((len(enc), len(dec)), enc[0].self_attn.h, pre_norm=True)
    spec.config.layer_norm_epsilon = enc[0].sublayer[0].norm.eps
    spec.encoder.embeddings[0].weight = array(model.src_embed[0].lut.weight)
    spec.decoder.embeddings.weight = array(model.tgt_embed[0].lut.weight)
    for side, embed in ((spec.encoder, model.src_embed), (spec.decoder, model.tgt_embed)):
        side.position_encodings.encodings = array(embed[1].pe[0, :1024])  # its table, not CTranslate2's layout
    for s, layer in zip(spec.encoder.layer, enc):
        norm(s.self_attention.layer_norm, layer.sublayer[0].norm)
        linear(s.self_attention.linear[0], *layer.self_attn.linears[:3])
        linear(s.self_attention.linear[1], layer.self_attn.linears[3])
        norm(s.ffn.layer_norm, layer.sublayer[1].norm)
        linear(s.ffn.linear_0, layer.feed_forward.w_1)
        linear(s.ffn.linear_1, layer.feed_forward.w_2)
    norm(spec.encoder.layer_norm, model.encoder.norm)
    for s, layer in zip(spec.decoder.layer, dec):
        norm(s.self_attention.layer_norm, layer.sublayer[0].norm)
        linear(s.self_attention.linear[0], *layer.self_attn.linears[:3])
        linear(s.self_attention.linear[1], layer.self_attn.linears[3])
        norm(s.attention.layer_norm, layer.sublayer[1].norm)
        linear(s.attention.linear[0], layer.src_attn.linears[0])
        linear(s.attention.linear[1], *layer.src_attn.linears[1:3])
        linear(s.attention.linear[2], layer.src_attn.linears[3])
        norm(s.ffn.layer_norm, layer.sublayer[2].norm)
        linear(s.ffn.linear_0, layer.feed_forward.w_1)
        linear(s.ffn.linear_1, layer.feed_forward.w_2)
    norm(spec.decoder.layer_norm, model.decoder.norm)
    linear(spec.decoder.projection, model.generator.proj)
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.validate()
    return spec


def ctranslate2_translator(model: EncoderDecoder, folder: Path, quantization: str | None, threads: int):
    """Save ``model`` as a CTranslate2 model in ``folder`` (weights quantized to ``quantization``,
    e.g. ``"int8"``, or float32) and load it for the CPU with ``threads`` intra-op threads."""
    import ctranslate2

    spec = ctranslate2_spec(model, vocabulary(model.generator.proj.out_features))
    spec.optimize(quantization=quantization)
    folder.mkdir(parents=True, exist_ok=True)
    spec.save(str(folder))
    return ctranslate2.Translator(str(folder), device="cpu", compute_type=quantization or "float32",
                                  inter_threads=1, intra_threads=threads)


def ctranslate2_greedy(translator, vocab: list[str], src: torch.Tensor, n: int) -> Callable[[], torch.Tensor]:
    """A closure decoding exactly ``n`` new tokens greedily; returns ids ``(batch, n)``."""
    index = {token: i for i, token in enumerate(vocab)}
    tokens = [[vocab[i] for i in row] for row in src.tolist()]

    def run() -> torch.Tensor:
        out = translator.translate_batch(tokens, beam_size=1, min_decoding_length=n, max_decoding_length=n)
        ids = [[index[t] for t in r.hypotheses[0]] for r in out]
        assert all(len(row) == n for row in ids), [len(row) for row in ids]
        return torch.tensor(ids)

    return run


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two ``(batch, n)`` token tables first differ, in words."""
    if torch.equal(a, b):
        return "all equal"
    rows, cols = (a != b).nonzero(as_tuple=True)
    return f"{(a == b).float().mean():.0%} equal, first difference at token {int(cols.min()) + 1}"


class SplitLoop:
    """The fast engine's greedy loop written out, timing its parts: ``start``, each ``step``, the
    loop around them; after each step, the step's matrix products alone (same weights, same rows),
    timed apart and left out of the loop's total."""

    def __init__(self, engine: InferenceEngine, src: torch.Tensor, n: int) -> None:
        self.engine, self.src, self.n = engine, src, n
        self.mask = torch.ones(src.size(0), 1, src.size(1), dtype=torch.bool)
        self.parts: dict[str, list[float]] = {k: [] for k in ("loop", "start", "steps", "step", "products")}

    def __call__(self) -> torch.Tensor:
        clock = time.perf_counter
        t0 = clock()
        state = self.engine.start(self.src, self.mask, self.n)
        t1 = clock()
        products = products_only(self.engine, self.src.size(0))
        token, out, steps, prods = torch.full((self.src.size(0),), START), [], [], []
        for _ in range(self.n):
            s = clock()
            log_probs = self.engine.step(state, token)
            steps.append(clock() - s)
            token = log_probs.argmax(-1)
            out.append(token)
            s = clock()
            with torch.inference_mode():
                products()
            prods.append(clock() - s)
        self.parts["loop"].append(clock() - t0 - sum(prods))
        self.parts["start"].append(t1 - t0)
        self.parts["steps"].append(sum(steps))
        self.parts["step"].append(statistics.median(steps))
        self.parts["products"].append(statistics.median(prods))
        return torch.stack(out, 1)

    def medians(self) -> dict[str, float]:
        """Each part's median over the calls since the last ``reset``, and the rest of the loop per
        call (the loop less its start and steps), whose median is taken call by call."""
        out = {k: statistics.median(v) for k, v in self.parts.items()}
        out["rest"] = statistics.median(a - b - c for a, b, c in zip(self.parts["loop"], self.parts["start"],
                                                                       self.parts["steps"]))
        return out

    def reset(self) -> None:
        self.parts = {k: [] for k in self.parts}


def timed_rounds(contenders: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Wall seconds of each contender in each of ``repeat`` rounds (after a warm-up round), in turn."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(repeat + 1):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - start)
    return times


def ratio(times: dict[str, list[float]], ours: str, theirs: str) -> float:
    """The median over rounds of ours / theirs, each round's pair timed back to back."""
    return statistics.median(a / b for a, b in zip(times[ours], times[theirs]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths: proves the script runs")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds after the warm-up round (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every contender (default 2)")
    parser.add_argument("--settings", default="1x64,1x128,8x64,8x128",
                        help="comma-separated BATCHxNEW_TOKENS (default: batch 1 and 8, 64 and 128 tokens)")
    parser.add_argument("--no-hf", action="store_true", help="leave out Hugging Face generate (the slowest)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, vocab = ("tiny", 100) if args.quick else ("base", 8000)
    settings = [(1, 8), (2, 8)] if args.quick else [tuple(map(int, s.split("x"))) for s in args.settings.split(",")]
    torch.manual_seed(0)
    model = make_model(vocab, vocab, attention_kernel="sdpa", layer_norm="torch", **MODEL_SIZES[config]).eval()
    with tempfile.TemporaryDirectory() as folder:  # a loaded translator no longer reads its files
        ct2 = {q or "float32": ctranslate2_translator(model, Path(folder) / (q or "float32"), q, args.threads)
               for q in (None, "int8")}
    tokens = vocabulary(vocab)
    engine, engine8 = InferenceEngine(model), InferenceEngine(model, int8=True)
    hf = None
    if not args.no_hf:
        from transformers.utils import logging as hf_logging
        from vs_hf_generate import marian_like

        hf_logging.set_verbosity_error()
        hf = marian_like(config, vocab)

    print(machine_facts())
    print(f"config {config} (vocab {vocab}, torch LayerNorm), source length {SRC_LEN}, greedy, exactly N new tokens, "
          f"{args.threads} threads each; median of {args.repeat} rounds after a warm-up round, contenders in turn; "
          f"process nice {os.nice(0)}\n")
    print("| batch | new tokens | CT2 float32 (s) | CT2 int8 (s) | fast float32 (s) | fast int8 (s) | HF generate (s) "
          "| **fast / CT2 float32** | **fast int8 / CT2 int8** | HF / fast | load |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    splits, checks, best = [], [], []
    for batch, n in settings:
        src = torch.randint(len(VOCAB_SPECIALS), vocab, (batch, SRC_LEN), generator=torch.Generator().manual_seed(0))
        mask = torch.ones(batch, 1, SRC_LEN, dtype=torch.bool)
        contenders: dict[str, Callable[[], object]] = {
            "ct2": ctranslate2_greedy(ct2["float32"], tokens, src, n),
            "ct2 int8": ctranslate2_greedy(ct2["int8"], tokens, src, n),
            "fast": lambda: engine.greedy_decode(src, mask, n + 1, START, None, PAD),
            "fast int8": lambda: engine8.greedy_decode(src, mask, n + 1, START, None, PAD),
        }
        if hf is not None:
            def hf_generate() -> torch.Tensor:
                with torch.no_grad():
                    out = hf.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, num_beams=1, use_cache=True)
                assert out.size(1) == n + 1  # start token + n new ones
                return out

            contenders["hf"] = hf_generate
        split = SplitLoop(engine, src, n)
        contenders["fast, parts timed"] = split
        fast_tokens = contenders["fast"]()[:, 1:]
        checks.append((batch, n, first_difference(contenders["ct2"](), fast_tokens),
                       first_difference(contenders["fast int8"]()[:, 1:], fast_tokens),
                       first_difference(contenders["ct2 int8"](), fast_tokens),
                       first_difference(split(), fast_tokens)))
        split.reset()
        t = timed_rounds(contenders, args.repeat)
        med = {k: statistics.median(v) for k, v in t.items()}
        hf_cells = (f"{med['hf']:.2f}", f"{ratio(t, 'hf', 'fast'):.2f}x") if hf is not None else ("—", "—")
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"| {batch} | {n} | {med['ct2']:.2f} | {med['ct2 int8']:.2f} | {med['fast']:.2f} "
              f"| {med['fast int8']:.2f} "
              f"| {hf_cells[0]} | **{ratio(t, 'fast', 'ct2'):.2f}x** | **{ratio(t, 'fast int8', 'ct2 int8'):.2f}x** "
              f"| {hf_cells[1]} | {load} |", flush=True)
        splits.append((batch, n, med["fast"], split.medians()))
        best.append((batch, n, {k: min(v) for k, v in t.items()}))

    print("\nEach contender's fastest round (on a loaded machine, the nearest to a quiet one; s):\n")
    print("| batch | new tokens | CT2 float32 | CT2 int8 | fast float32 | fast int8 | fast / CT2 float32 | "
          "fast int8 / CT2 int8 |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, n, m in best:
        print(f"| {batch} | {n} | {m['ct2']:.2f} | {m['ct2 int8']:.2f} | {m['fast']:.2f} | {m['fast int8']:.2f} | "
              f"{m['fast'] / m['ct2']:.2f}x | {m['fast int8'] / m['ct2 int8']:.2f}x |")
    print("\nTokens against the fast engine's float32 tokens (random weights: int8 changes some argmax choices):\n")
    print("| batch | new tokens | CT2 float32 | fast int8 | CT2 int8 | the loop written out |")
    print("|---:|---:|---|---|---|---|")
    for row in checks:
        print("| " + " | ".join(map(str, row)) + " |")
    print("\nThe fast engine's loop, split (medians over the same rounds; ms):\n")
    print("| batch | new tokens | greedy_decode | written out | start (encoder, cross K/V) | all steps "
          "| one step | its products alone | one step - products | loop - start - steps, per token |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, n, loop, p in splits:
        print(f"| {batch} | {n} | {loop * 1e3:.0f} | {p['loop'] * 1e3:.0f} | {p['start'] * 1e3:.1f} | "
              f"{p['steps'] * 1e3:.0f} | {p['step'] * 1e3:.2f} | {p['products'] * 1e3:.2f} | "
              f"{(p['step'] - p['products']) * 1e3:.2f} | {p['rest'] / n * 1e3:.3f} |")


if __name__ == "__main__":
    main()
