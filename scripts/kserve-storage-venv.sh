#!/usr/bin/env bash
# Usage: scripts/kserve-storage-venv.sh [REQUIREMENTS]   (default requirements/kserve-storage.txt)
# Create a virtual environment holding exactly the pins of REQUIREMENTS (installed with --no-deps, by uv: scripts/venv-lib.sh) under
# build/venvs/<name>-<sha256 of the file>, and print its python. Used for KServe's storage-initializer code (one
# file per KServe version: their pins conflict with kfp's and with each other) and the loopback GCS emulator.
# Cached: while the file is unchanged a second call only prints the path. A venv counts as complete only once its
# .complete stamp is written (last), so an interrupted install is redone; a lock serialises concurrent callers.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv-lib.sh
REQ=${1:-requirements/kserve-storage.txt}
PY=${PYTHON:-python3}
[ -f "$REQ" ] || { echo "kserve-storage-venv: $REQ: no such requirements file" >&2; exit 1; }
hash=$(sha256sum "$REQ" | cut -c1-16)
name=$(basename "$REQ" .txt)
mkdir -p build/venvs
VENV=build/venvs/$name-$hash
exec 9>"build/venvs/.$name.lock"
flock 9
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  for old in build/venvs/"$name"-????????????????; do  # earlier pins of the same file
    [ -d "$old" ] && rm -rf "$old"
  done
  make_venv "$PY" "$VENV" --no-deps -r "$REQ" \
    || { echo "kserve-storage-venv: installing $REQ into $VENV failed (see above)" >&2; exit 1; }
  touch "$VENV/.complete"
fi
echo "$PWD/$VENV/bin/python"
