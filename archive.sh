#!/usr/bin/env bash
# Build model_store/embedding.mar (trains on the bundled MNIST sample first if no artifacts exist).
# Usage: ./archive.sh [--artifacts DIR] [--model-name NAME] [--model-version V] [--export-path DIR] [--no-train]
# (./archive.sh --help lists every option)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
"$ROOT/scripts/bootstrap.sh" >&2
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$ROOT/.venv/bin/python" -m serving.archive "$@"
