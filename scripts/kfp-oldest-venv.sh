#!/usr/bin/env bash
# Create build/kfp-oldest-venv with the protobuf messages of the oldest supported Kubeflow Pipelines backend
# (requirements-kfp-oldest.txt). Its protobuf 4 conflicts with kfp's, so it never shares .venv. Idempotent:
# reinstalls only when the pins changed. Prints the venv's python on success.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build/kfp-oldest-venv
PY=${PYTHON:-python3}
want=$(sha256sum requirements-kfp-oldest.txt | cut -d' ' -f1)
if [ "$(cat "$VENV/.deps-stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" >&2 || { echo "kfp-oldest-venv: could not create $VENV" >&2; exit 1; }
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    -r requirements-kfp-oldest.txt >&2 2> >(grep -v '^WARNING: Location' >&2) \
    || { echo "kfp-oldest-venv: pip install failed (see above)" >&2; exit 1; }
  echo "$want" > "$VENV/.deps-stamp"
fi
echo "$PWD/$VENV/bin/python"
