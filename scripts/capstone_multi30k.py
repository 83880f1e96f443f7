"""Chapter 12, Part B, on the solution's own code: train at the course model's size on Multi30k, translate
the test split with beams, and write the figures the chapter shows.

    python scripts/capstone_multi30k.py                      # the full run (about 50 minutes on a 2-core CPU)
    python scripts/capstone_multi30k.py --epochs 1 --max-steps 50 --out /tmp/x.json   # a smoke test
    python scripts/capstone_multi30k.py --score solutions/12_capstone/my_model   # the record's BLEU of those weights

The model, the loss, the schedule, the loop, the masks and the beam search's pieces are the answer cells
of ``solutions/`` (chapters 1-11 and the capstone's glue), run as a student's would be
(``autograder.course_code.run_course``); the recipe is ``tfm_solution.capstone.train_multi30k``. Multi30k
comes from ``$MULTI30K_DIR`` (or is downloaded). Writes ``tfm_solution/assets/capstone_multi30k.json``;
with ``--export DIR`` also the weights, as a student's notebook exports them. The BLEU is that of the weights
rounded to float16 as the export stores them, so the grader, reading the exported file, finds the same score;
``--score DIR`` translates an exported model again and rewrites only the record's translation figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import sacrebleu
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autograder.capstone import write_published_fingerprint  # noqa: E402
from autograder.course_code import run_course  # noqa: E402
from tfm_solution.capstone import TranslationTask, train_multi30k, translate_part_b  # noqa: E402
from tfm_solution.course_model import COURSE_MODEL_DIR  # noqa: E402
from tfm_solution.data import PAD, TokenizerPair, load_multi30k, multi30k_dir, pad_batch  # noqa: E402

OUT = REPO / "tfm_solution" / "assets" / "capstone_multi30k.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    parser.add_argument("--sentences", type=int, default=None, help="translate only the first N test sentences")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--export", type=Path, default=None, help="also export the weights into this folder")
    parser.add_argument("--device", default=None, help="where to train (default: the GPU when there is one)")
    parser.add_argument("--score", type=Path, default=None,
                        help="no training: translate this exported model's weights and update the record's BLEU")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    parts = run_course(REPO / "solutions")
    task = TranslationTask()
    if args.score is not None:
        return rescore(parts, task, args.score, args.out)
    start = time.time()
    trained = train_multi30k(parts, task, epochs=args.epochs, max_steps=args.max_steps, device=args.device,
                             on_epoch=lambda e, loss: print(f"epoch {e}: validation loss {loss:.3f}", flush=True))
    minutes = (time.time() - start) / 60
    tokenizer = TokenizerPair.load(COURSE_MODEL_DIR)
    # The weights as the export stores them (float16): the score the grader will find in the exported file.
    state = {k: v.detach().half() for k, v in trained.model.state_dict().items()}
    test, hypotheses, bleu, decode_cpu = translated(parts, task, state, tokenizer, args.sentences)
    if args.export is not None:
        from tfm_solution.checkpoint import export_model

        export_model(args.export, trained.model, {"model": vars(task)}, tokenizer, torch.float16)
        if args.export.resolve() == (REPO / "solutions" / "12_capstone" / "my_model").resolve():
            write_published_fingerprint(args.export / "model.safetensors")
    options = {"--epochs": (args.epochs, 10), "--max-steps": (args.max_steps, None),
               "--sentences": (args.sentences, None), "--threads": (args.threads, 2)}
    command = "python scripts/capstone_multi30k.py" + "".join(
        f" {flag} {value}" for flag, (value, default) in options.items() if value != default)
    result = {
        "command": command,
        "hardware": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads"
                    + (f", trained on {args.device}" if args.device else ""),
        "minutes": round(minutes, 1), "train_cpu_s": round(trained.train_cpu_s),
        "epochs": trained.epochs, "steps": trained.steps,
        "validation_loss": [round(loss, 4) for _, loss in trained.curve],
        "sentences": len(test), "bleu": round(bleu, 2), "decode_cpu_s": round(decode_cpu),
        "examples": [{"source": test[i][0], "reference": test[i][1], "output": hypotheses[i]} for i in range(3)],
    }
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}))
    return 0


def translated(parts: dict, task: TranslationTask, state: dict, tokenizer: TokenizerPair, sentences: int | None
               ) -> tuple[list, list[str], float, float]:
    """The test split (or its first ``sentences``) translated as the grader does, from the weights ``state``:
    (the pairs, the translations, their sacreBLEU, the CPU seconds of decoding)."""
    test = load_multi30k("test", multi30k_dir())[:sentences]
    sources = pad_batch([tokenizer.encode_src(de) for de, _ in test], PAD)
    begin = time.process_time()
    ids = translate_part_b(parts, state, sources, task)
    decode_cpu = time.process_time() - begin
    hypotheses = [tokenizer.decode_tgt(row[1:]) for row in ids.tolist()]
    return test, hypotheses, sacrebleu.corpus_bleu(hypotheses, [[en for _, en in test]]).score, decode_cpu


def rescore(parts: dict, task: TranslationTask, exported: Path, out: Path) -> int:
    """Translate the exported model in ``exported`` again and rewrite the record's translation figures."""
    from autograder.capstone import read_weights

    state = read_weights((exported / "model.safetensors").read_bytes())
    test, hypotheses, bleu, decode_cpu = translated(parts, task, state, TokenizerPair.load(COURSE_MODEL_DIR), None)
    record = json.loads(out.read_text())
    record.update({"scored": f"python scripts/capstone_multi30k.py --score {exported.resolve().relative_to(REPO)}",
                   "sentences": len(test), "bleu": round(bleu, 2), "decode_cpu_s": round(decode_cpu),
                   "examples": [{"source": test[i][0], "reference": test[i][1], "output": hypotheses[i]}
                                for i in range(3)]})
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "examples"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
