#!/usr/bin/env bash
# Usage: scripts/client-venvs.sh [NAME ...]   (default: every requirements/clients/*.txt)
# Create one virtual environment per inference client the serving image is tested with (KServe's and Triton's
# Python clients, oldest and newest supported), holding exactly the pins of requirements/clients/NAME.txt
# (installed with --no-deps, by uv: scripts/venv-lib.sh), under build/venvs/client-NAME-<sha256 of the file>. Their pins (protobuf, numpy,
# httpx) conflict with the project's .venv and with each other, hence one each. Prints "NAME PYTHON" per venv.
# Cached: while a file is unchanged a second call only prints the path. A venv counts as complete only once its
# .complete stamp is written (last), so an interrupted install is redone; a lock serialises concurrent callers.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv-lib.sh
PY=${PYTHON:-python3}
if [ $# -eq 0 ]; then
  set -- $(ls requirements/clients/*.txt | xargs -n1 basename | sed 's/\.txt$//')
fi
mkdir -p build/venvs
for name in "$@"; do
  REQ=requirements/clients/$name.txt
  [ -f "$REQ" ] || { echo "client-venvs: $REQ: no such requirements file" >&2; exit 1; }
  hash=$(sha256sum "$REQ" | cut -c1-16)
  VENV=build/venvs/client-$name-$hash
  exec 9>"build/venvs/.client-$name.lock"
  flock 9
  if [ ! -f "$VENV/.complete" ]; then
    rm -rf "$VENV"
    for old in build/venvs/client-"$name"-????????????????; do  # earlier pins of the same file
      [ -d "$old" ] && rm -rf "$old"
    done
    make_venv "$PY" "$VENV" --no-deps -r "$REQ" \
      || { echo "client-venvs: installing $REQ into $VENV failed (see above)" >&2; exit 1; }
    touch "$VENV/.complete"
  fi
  exec 9>&-
  echo "$name $PWD/$VENV/bin/python"
done
