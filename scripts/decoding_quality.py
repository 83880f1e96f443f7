"""BLEU, time and diversity of each decoding strategy on Multi30k test_2016, with the course model.

Usage: python scripts/decoding_quality.py [--data-dir DIR] [--limit N] [--out PATH]

Decodes the 1,000 sentences of ``test_2016`` with greedy search, beam search of widths 1 to 8
(length penalty alpha = 0.6, and width 4 with alpha = 0), and sampling (T = 1, T = 0.7, top-k 10,
top-p 0.9). For each: sacreBLEU, the output length relative to the references, and the time relative
to greedy search, all measured in this one process (CPU time of one thread: on a shared machine the
wall clock also counts the time other jobs hold the CPU). For the strategies that
can differ from run to run, five samples of the first 100 sentences give the share of distinct
bigrams across samples (deterministic strategies repeat one output five times). Every beam search
is compared with greedy search by paired bootstrap resampling (sacreBLEU's, 1,000 resamples of the
test sentences): the p-value says how often a difference as large would arise by chance. It also
checks that beam width 1 returns exactly greedy search's tokens, and stores 40 validation pairs for
chapter 10's on-page checks (so the notebook runs without the dataset).

Writes ``tfm_solution/assets/decoding_quality.json`` (a few kilobytes); chapter 10 loads it.
Seeded: the same machine gives the same numbers, except the times. Data: Multi30k from
``--data-dir`` (or ``$MULTI30K_DIR``, else downloaded). About half an hour of CPU time on one core.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import sacrebleu
import torch
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from tfm_solution.course_model import load_course_model
from tfm_solution.data import BOS, EOS, PAD, load_multi30k, multi30k_dir, pad_batch
from tfm_solution.decoding import beam_search, greedy_decode, sample
from tfm_solution.viz.decoding import distinct_ngrams

OUT = Path(__file__).resolve().parents[1] / "tfm_solution" / "assets" / "decoding_quality.json"
BATCH, EXTRA, SAMPLES, DIVERSITY_SENTENCES = 50, 40, 5, 100


def decode_all(strategy: Callable[[torch.Tensor, torch.Tensor, int], list[list[int]]],
               srcs: list[list[int]]) -> tuple[list[list[int]], float]:
    """Token ids (after ``<s>``, up to ``</s>``) of every source, and the CPU seconds it took."""
    out: list[list[int]] = []
    start = time.process_time()
    with torch.no_grad():
        for i in range(0, len(srcs), BATCH):
            src = pad_batch(srcs[i: i + BATCH])
            rows = strategy(src, (src != PAD).unsqueeze(-2), src.size(1) + EXTRA)
            for row in rows:
                row = row[1:]
                out.append(row[: row.index(EOS)] if EOS in row else row)
    return out, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="folder with the Multi30k files (else $MULTI30K_DIR)")
    parser.add_argument("--limit", type=int, help="only the first N test sentences (a quick run)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = multi30k_dir(args.data_dir)
    model, tok = load_course_model()
    test = load_multi30k("test", folder)[: args.limit]
    srcs = [tok.encode_src(s) for s, _ in test]
    refs = [r for _, r in test]

    def beam(width: int, alpha: float):
        return lambda s, m, n: [h[0].tokens for h in beam_search(model, s, m, n, BOS, EOS, beam_size=width,
                                                                   alpha=alpha)]

    def sampler(seed: int, **shape):
        def run(s, m, n):
            gen = torch.Generator().manual_seed(seed * 1_000_003 + int(s.sum()))
            return sample(model, s, m, n, BOS, EOS, PAD, generator=gen, **shape).tolist()
        return run

    deterministic = {"greedy": lambda s, m, n: greedy_decode(model, s, m, n, BOS, EOS, PAD).tolist()}
    deterministic |= {f"beam {w}": beam(w, 0.6) for w in range(1, 9)}
    deterministic["beam 4, alpha 0"] = beam(4, 0.0)
    sampling = {"sample T=1": {}, "sample T=0.7": {"temperature": 0.7}, "sample top-k 10": {"top_k": 10},
                "sample top-p 0.9": {"top_p": 0.9}}

    rows, outputs, greedy_time = [], {}, None
    for name, strategy in deterministic.items():
        ids, seconds = decode_all(strategy, srcs)
        outputs[name] = ids
        greedy_time = greedy_time or seconds
        rows.append({"name": name, "ids": ids, "seconds": seconds})
        print(f"{name}: {seconds:.0f} s", flush=True)
    for name, shape in sampling.items():
        ids, seconds = decode_all(sampler(0, **shape), srcs)
        extra = [decode_all(sampler(k, **shape), srcs[:DIVERSITY_SENTENCES])[0] for k in range(1, SAMPLES)]
        rows.append({"name": name, "ids": ids, "seconds": seconds, "samples": [ids[:DIVERSITY_SENTENCES], *extra]})
        print(f"{name}: {seconds:.0f} s", flush=True)

    result_rows = []
    for row in rows:
        hyps = [tok.decode_tgt(ids) for ids in row["ids"]]
        bleu = sacrebleu.corpus_bleu(hyps, [refs])
        entry = {"name": row["name"], "bleu": round(bleu.score, 2),
                 "time_ratio": round(row["seconds"] / greedy_time, 3),
                 "length_ratio": round(bleu.sys_len / bleu.ref_len, 4)}
        runs = row.get("samples") or [row["ids"][:DIVERSITY_SENTENCES]] * SAMPLES
        if row["name"] in ("greedy", "beam 4") or "samples" in row:
            per_sentence = [distinct_ngrams([tok.decode_tgt(run[i]).split() for run in runs], 2)
                            for i in range(len(runs[0]))]
            entry["distinct2"] = round(sum(per_sentence) / len(per_sentence), 4)
        result_rows.append(entry)
        print(entry, flush=True)

    # Paired bootstrap of each beam search against greedy search (the baseline is the first system).
    texts = {row["name"]: [tok.decode_tgt(ids) for ids in row["ids"]] for row in rows if row["name"] in outputs}
    compared = [name for name in texts if name.startswith("beam") and name != "beam 1"]
    _, scores = PairedTest([("greedy", texts["greedy"]), *((n, texts[n]) for n in compared)], {"BLEU": BLEU()},
                           [refs], test_type="bs", n_samples=1000)()
    for name, score in zip(compared, scores["BLEU"][1:]):
        entry = next(e for e in result_rows if e["name"] == name)
        entry["p_vs_greedy"] = round(score.p_value, 4)
        entry["bleu_ci95"] = round(score.ci, 2)
        print(name, "p =", entry["p_vs_greedy"], flush=True)

    val = load_multi30k("val", folder)[:40]
    result = {
        "command": "python scripts/decoding_quality.py",
        "split": "test_2016",
        "sentences": len(test),
        "rows": result_rows,
        "width1_equals_greedy": outputs["beam 1"] == outputs["greedy"],
        "val_pairs": [list(p) for p in val],
        "note": "times are ratios of CPU time to greedy search's, measured in the same process; one thread. "
                "p_vs_greedy: paired bootstrap (sacreBLEU, 1,000 resamples, seed 12345) against greedy search; "
                "bleu_ci95: half-width of the 95% bootstrap interval of the row's BLEU",
    }
    args.out.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
