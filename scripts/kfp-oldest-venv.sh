#!/usr/bin/env bash
# Create build/kfp-oldest-venv with the protobuf messages of the oldest supported Kubeflow Pipelines backend
# (requirements/kfp-oldest.txt). Its protobuf 4 conflicts with kfp's, so it never shares .venv. Idempotent:
# reinstalls only when the pins changed. Prints the venv's python on success.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv-lib.sh
VENV=build/kfp-oldest-venv
PY=${PYTHON:-python3}
want=$(sha256sum requirements/kfp-oldest.txt | cut -d' ' -f1)
if [ "$(cat "$VENV/.deps-stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$VENV"
  make_venv "$PY" "$VENV" --no-deps -r requirements/kfp-oldest.txt \
    || { echo "kfp-oldest-venv: installing requirements/kfp-oldest.txt into $VENV failed (see above)" >&2; exit 1; }
  echo "$want" > "$VENV/.deps-stamp"
fi
echo "$PWD/$VENV/bin/python"
