#!/usr/bin/env bash
# One command from a fresh clone: set up .venv, train on the bundled MNIST sample, build
# model_store/embedding.mar, start TorchServe (token auth on, loopback only), classify a sample digit.
set -euo pipefail
cd "$(dirname "$0")"
./scripts/bootstrap.sh
PY=.venv/bin/python
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

./archive.sh "$@"
"$PY" -m serving stop >/dev/null   # restart so the freshly built archive is served
"$PY" -m serving samples --out samples >/dev/null
"$PY" -m serving start
echo
echo "Classifying samples/digit_7.png over HTTP with the inference token:"
"$PY" -m client predict samples/digit_7.png
echo
echo "Stop the server with: .venv/bin/python -m serving stop"
