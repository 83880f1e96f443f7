#!/usr/bin/env bash
# One command, under 8 minutes on one GPU: train the base model on Multi30k (bf16 autocast),
# then print training tokens/s and validation loss, test BLEU with greedy and beam search, and
# the speedup of cached over uncached greedy decoding.
#
#   MULTI30K_DIR=path/to/multi30k scripts/gpu_run.sh     (without it the data is downloaded)
#
# Environment overrides (a CPU smoke test uses them): CONFIG (base), DEVICE (cuda),
# TRAIN_SECONDS (300), MAX_STEPS, SUBSET (training pairs), LIMIT (test sentences),
# BENCH_TOKENS (128), OUT (runs/gpu_run), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
CONFIG=${CONFIG:-base}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-runs/gpu_run}
train_extra=()
[ -n "${MAX_STEPS:-}" ] && train_extra+=(--max-steps "$MAX_STEPS")
[ -n "${SUBSET:-}" ] && train_extra+=(--train-subset "$SUBSET" --val-subset "$SUBSET")
eval_extra=()
[ -n "${LIMIT:-}" ] && eval_extra+=(--limit "$LIMIT")

"$PY" -c "import torch, platform; print('torch', torch.__version__, '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or 'cpu')"
rm -rf "$OUT"
echo "== train ($CONFIG, $DEVICE); last line: tokens_per_s and val_loss of the final epoch"
"$PY" -m tfm_solution train --task multi30k --config "$CONFIG" --device "$DEVICE" --out "$OUT" \
    --max-seconds "${TRAIN_SECONDS:-300}" --epochs 1000 --quiet "${train_extra[@]}"
echo "== test BLEU"
"$PY" -m tfm_solution evaluate "$OUT" --split test --strategy greedy --device "$DEVICE" "${eval_extra[@]}"
"$PY" -m tfm_solution evaluate "$OUT" --split test --strategy beam --beam-size 4 --device "$DEVICE" "${eval_extra[@]}"
echo "== cached vs uncached greedy decoding (random weights, batch 1)"
"$PY" -m tfm_solution bench --config "$CONFIG" --device "$DEVICE" --new-tokens "${BENCH_TOKENS:-128}"
