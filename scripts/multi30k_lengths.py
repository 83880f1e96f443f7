"""Count the lengths of the Multi30k training pairs in the course model's subword tokens: chapter 9's
batching measurement.

Writes ``tfm_solution/assets/multi30k_lengths.json``: a histogram ``{"src_len,tgt_len": count}``
over the training split, where a source is its subwords + ``</s>`` and a target ``<s>`` + its
subwords + ``</s>``, exactly as the course's data pipeline encodes them. Chapter 9 batches
examples of these lengths at random and sorted by length, and measures the padding. Command:

    python scripts/multi30k_lengths.py --data-dir path/to/multi30k

(or ``$MULTI30K_DIR``). It takes a few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tfm_solution.course_model import load_course_model  # noqa: E402
from tfm_solution.data import BOS, EOS, load_multi30k, multi30k_dir  # noqa: E402

OUT = REPO / "tfm_solution" / "assets" / "multi30k_lengths.json"


def length_histogram(pairs: list[tuple[str, str]], tokenizers) -> dict[str, int]:
    """``{"src_len,tgt_len": count}`` of the encoded pairs, keys in increasing order."""
    counts = Counter()
    for de, en in pairs:
        src = tokenizers.encode_src(de)
        tgt = [BOS, *tokenizers.tgt.encode(en).ids, EOS]
        counts[(len(src), len(tgt))] += 1
    return {f"{s},{t}": n for (s, t), n in sorted(counts.items())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="folder with the Multi30k .gz files (else $MULTI30K_DIR)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    _, tokenizers = load_course_model()
    pairs = load_multi30k("train", multi30k_dir(args.data_dir))
    histogram = length_histogram(pairs, tokenizers)
    report = {"command": "python scripts/multi30k_lengths.py", "split": "train", "pairs": len(pairs),
              "tokenizer": "the course model's (tfm_solution.course_model)", "histogram": histogram}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=0) + "\n")
    print(f"{len(pairs):,} pairs, {len(histogram)} distinct (source, target) lengths -> {args.out}")


if __name__ == "__main__":
    main()
