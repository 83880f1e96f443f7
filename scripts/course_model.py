"""Export a trained run as the course model and write its model card (run by ``make course-model``).

    python scripts/course_model.py [RUN_FOLDER] [--data-dir DIR]

Exports RUN_FOLDER's best checkpoint (float16 weights without the sinusoid tables, which loading
rebuilds exactly; the shared tokenizer, the config and the metrics log) into
``tfm_solution/assets/course_model/``, then measures it on the CPU:
sacreBLEU on test_2016 with greedy and beam search, BLEU of the first 100 validation
sentences (the figure the tests recompute), decoding speed, ten validation examples and an
error analysis, written to ``card.json`` and ``MODEL_CARD.md`` in the same folder. Without
RUN_FOLDER it only measures the model already there and rewrites the card.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from collections import Counter
from pathlib import Path

import sacrebleu
import torch

from tfm_solution.course_model import COURSE_MODEL_DIR, course_model_config, export_course_model, load_course_model
from tfm_solution.data import load_multi30k, multi30k_dir
from tfm_solution.encoder_decoder import make_model
from tfm_solution.experiment import decode_texts

COMMAND = ("python -m tfm_solution train --task multi30k --config course --device cpu --seed 0 --out runs/course"
           " && python scripts/course_model.py runs/course")
VAL_SUBSET = 100  # sentences of the validation split whose BLEU the tests recompute
BEAM = 4


def bleu(hyps: list[str], refs: list[str]) -> float:
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def repeats_a_word(text: str) -> bool:
    """Three or more copies of one word in a row, or a bigram said twice in a row: the model looping."""
    words = text.lower().split()
    tripled = any(words[i] == words[i + 1] == words[i + 2] for i in range(len(words) - 2))
    bigram = any(words[i:i + 2] == words[i + 2:i + 4] for i in range(len(words) - 3))
    return tripled or bigram


def measure(data_dir: str | None) -> dict:
    torch.set_num_threads(2)
    folder = multi30k_dir(data_dir)
    test, val = load_multi30k("test", folder), load_multi30k("val", folder)
    model, tok = load_course_model()
    params = sum(p.numel() for p in model.parameters())  # a tied matrix counts once
    with torch.device("meta"):
        untied = make_model(**{**course_model_config()["model"], "tie_embeddings": False})
    files = {p.name: p.stat().st_size for p in COURSE_MODEL_DIR.iterdir()
             if p.is_file() and p.name not in ("card.json", "MODEL_CARD.md")}  # what the card describes

    timed = {}
    hyps = {}
    for name, strategy in (("greedy", "greedy"), ("beam", "beam")):
        start = time.perf_counter()
        hyps[name] = decode_texts(model, tok, [de for de, _ in test], strategy, beam_size=BEAM)
        timed[name] = time.perf_counter() - start
    refs = [en for _, en in test]
    val_hyps = decode_texts(model, tok, [de for de, _ in val[:VAL_SUBSET]], "greedy")
    val_bleu = bleu(val_hyps, [en for _, en in val[:VAL_SUBSET]])

    # where it goes wrong: by source length, looping, words it cannot read
    lengths = [len(tok.encode_src(de)) - 1 for de, _ in test]
    buckets = {}
    for lo, hi in ((0, 10), (10, 15), (15, 20), (20, 1000)):
        idx = [i for i, n in enumerate(lengths) if lo <= n < hi]
        if idx:
            label = f"{lo}-{hi - 1}" if hi < 1000 else f"{lo}+"
            buckets[label] = {"sentences": len(idx),
                              "bleu": bleu([hyps["beam"][i] for i in idx], [refs[i] for i in idx])}
    unk_words = Counter(w for de, _ in test for w in tok.unknown_words(de))
    loops = [i for i, h in enumerate(hyps["greedy"]) if repeats_a_word(h)]
    short = [i for i, (h, r) in enumerate(zip(hyps["beam"], refs)) if len(h.split()) < 0.6 * len(r.split())]
    worst = sorted(range(len(test)), key=lambda i: sacrebleu.sentence_bleu(hyps["beam"][i], [refs[i]]).score)[:5]
    examples = [{"source": de, "reference": en, "output": o}
                for (de, en), o in zip(val[:10], val_hyps[:10])]
    return {
        "parameters": params, "parameters_untied": sum(p.numel() for p in untied.parameters()), "bytes": files,
        "test_2016": {"sentences": len(test), "bleu_greedy": bleu(hyps["greedy"], refs),
                      f"bleu_beam{BEAM}": bleu(hyps["beam"], refs),
                      "seconds_greedy": timed["greedy"], f"seconds_beam{BEAM}": timed["beam"]},
        "val_first_100_bleu_greedy": val_bleu,
        "bleu_by_source_length_beam": buckets,
        "unknown_source_words": {"tokens": sum(unk_words.values()), "distinct": len(unk_words),
                                 "most_common": unk_words.most_common(8)},
        "greedy_outputs_that_loop": len(loops),
        "loop_examples": [{"source": test[i][0], "output": hyps["greedy"][i]} for i in loops[:3]],
        "beam_outputs_under_60_percent_of_reference_length": len(short),
        "worst_beam_sentences": [{"source": test[i][0], "reference": refs[i], "output": hyps["beam"][i]}
                                 for i in worst],
        "examples": examples,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, 2 threads",
    }


def card(figures: dict) -> str:
    cfg = course_model_config()
    log = [json.loads(line) for line in (COURSE_MODEL_DIR / "metrics.jsonl").read_text().splitlines()]
    m, run = cfg["model"], cfg["run"]
    t = figures["test_2016"]
    best = min(log, key=lambda e: e["val_loss"])
    rows = "\n".join(f"| {e['epoch']} | {e['step']} | {e['train_loss']:.3f} | {e['val_loss']:.3f} | "
                     f"{e['lr']:.2e} | {e['tokens_per_s']:.0f} | {e['seconds'] / 60:.1f} |" for e in log)
    examples = "\n".join(f"| {x['source']} | {x['reference']} | {x['output']} |" for x in figures["examples"])
    buckets = ", ".join(f"{k} tokens: {v['bleu']:.1f} ({v['sentences']} sentences)"
                        for k, v in figures["bleu_by_source_length_beam"].items())
    worst = "\n".join(f"- *{x['source']}* → {x['output']} (reference: {x['reference']})"
                      for x in figures["worst_beam_sentences"])
    unk = ", ".join(f"{w} ({n})" for w, n in figures["unknown_source_words"]["most_common"])
    size = sum(figures["bytes"].values())
    return f"""# The course model

A small encoder–decoder Transformer that translates German to English, trained on the
Multi30k training split (29,000 image captions) on a CPU. The chapters load it with
`model, tok = tfm_solution.course_model.load_course_model()` to show real attention heads,
cross-attention alignments, loss curves, translations and cached decoding.

## What it is
- Architecture: the notes' model (`make_model`), {m['N']} encoder and {m['N']} decoder layers, d_model {m['d_model']},
  d_ff {m['d_ff']}, {m['h']} heads, dropout {m['dropout']}, Pre-LN with the notes' LayerNorm, attention kernel
  `{m['attention_kernel']}`; one shared BPE vocabulary of {m['src_vocab']} subwords (trained on the training split
  only) and tied embeddings (source, target and output projection share one matrix).
- Special ids are the notes': `<s>` 0, `</s>` 1, `<blank>` 2 (padding), `<unk>` 3.
- {figures['parameters']:,} parameters, because the three embedding-sized matrices are one (untied, the same
  sizes would have {figures['parameters_untied']:,}); weights stored as float16:
  {figures['bytes']['model.safetensors'] / 1e6:.2f} MB (with the tokenizer, the config and the training log: {size / 1e6:.2f} MB). The file holds the parameters
  only: the positional encodings' sinusoid tables are buffers, which loading rebuilds from the
  dimensions and rounds to float16 like the rest of the export, so that the loaded model is exactly
  the one measured on this card.
- Training: Adam (0.9, 0.98, 1e-9), the notes' schedule with factor {run['factor']} and {run['warmup']} warm-up steps,
  label smoothing {run['smoothing']}, batches of at most {run['max_tokens']} source and {run['max_tokens']} target
  positions, {run['epochs']} epochs ({log[-1]['step']} optimizer steps), seed {run['seed']}. The exported weights are
  those of the epoch with the lowest validation loss (epoch {best['epoch']}, step {best['step']}).

## How it was made
```bash
make course-model   # = {COMMAND}
```
Training took {log[-1]['seconds'] / 60:.0f} minutes of wall time ({log[-1]['tokens_per_s']:.0f} target tokens/s in the
last epoch) on a shared 2-core machine (`{figures['machine']}`), other jobs running beside it: on a quiet machine it
is faster. The run is seeded: a rerun draws the same initialisation, data order and dropout masks.

## How good it is
| test_2016 (1,000 sentences) | sacreBLEU |
|---|---|
| greedy | {t['bleu_greedy']:.2f} |
| beam search, width {BEAM}, length penalty 0.6 | {t[f'bleu_beam{BEAM}']:.2f} |

Decoding all 1,000 test sentences on this CPU took {t['seconds_greedy']:.0f} s greedy and
{t[f'seconds_beam{BEAM}']:.0f} s with beams. The first 100 validation sentences score
{figures['val_first_100_bleu_greedy']:.2f} BLEU greedy (the tests recompute this figure).

Loss per epoch (label-smoothed, per target token; `metrics.jsonl` holds it with five sample
translations after every epoch):

| epoch | step | train loss | val loss | learning rate | tokens/s | minutes |
|---|---|---|---|---|---|---|
{rows}

## Ten validation sentences (greedy)
| source | reference | output |
|---|---|---|
{examples}

## What it gets wrong
- Long sentences: BLEU by source length (beam) — {buckets}.
- Words it cannot read: {figures['unknown_source_words']['tokens']} subword pieces of the test sources map to
  `<unk>` ({figures['unknown_source_words']['distinct']} distinct): {unk or 'none'}.
- Looping: {figures['greedy_outputs_that_loop']} of 1,000 greedy outputs repeat a word three times or a bigram twice.
- Dropped content: {figures['beam_outputs_under_60_percent_of_reference_length']} beam outputs are under 60% of the
  reference's length.
- Its five worst test sentences (sentence BLEU, beam):
{worst}

It knows only the world of Multi30k captions (people, dogs, streets, sports): anything else is
out of its depth, and it is far from a production system. Use it to look inside a Transformer.
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, nargs="?", help="the training run's folder (none: re-measure the model there)")
    p.add_argument("--data-dir", help="Multi30k folder (else $MULTI30K_DIR)")
    args = p.parse_args()
    if args.run is not None:
        export_course_model(args.run)
    figures = measure(args.data_dir)
    (COURSE_MODEL_DIR / "card.json").write_text(json.dumps(figures, indent=2, ensure_ascii=False) + "\n")
    (COURSE_MODEL_DIR / "MODEL_CARD.md").write_text(card(figures))
    print(re.sub(r"\n{3,}", "\n\n", json.dumps(figures["test_2016"], indent=2)))


if __name__ == "__main__":
    main()
