#!/usr/bin/env bash
# Usage: scripts/lock.sh [--upgrade | --check]
# Regenerate every lock of the project from the one declaration of its dependencies (pyproject.toml, and
# bench/pyproject.toml for the benchmarks) with uv pip compile, for CPython 3.11 on x86_64 Linux. Each lock's
# header holds the exact command that wrote it. Without --upgrade the versions already pinned are kept
# (requirements/product.lock is the constraint of the others, its own pins the preference of its resolution): only
# a dependency added to or changed in a pyproject moves a pin. --check regenerates them in a scratch folder and
# fails, naming them, when a committed lock differs (needs the package index, like a regeneration).
# Generated locks end in .lock (requirements/*.lock); the hand-pinned fixtures of the compatibility tests end in
# .txt (requirements/*.txt, requirements/clients/*.txt) and are not touched.
#
# torch: PyPI's torch==X metadata names CUDA runtime wheels; scripts/lock-excludes.txt leaves them out, so the
# locks say torch==X and pip or uv installs X+cpu from the PyPI CPU index or a local wheel directory.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "lock: $*" >&2; exit 1; }

upgrade=()
check=0
case "${1:-}" in
  "") ;;
  --upgrade) upgrade=(--upgrade) ;;
  --check) check=1 ;;
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument: $1 (usage: scripts/lock.sh [--upgrade | --check])" ;;
esac

UV=${UV:-}
if [ -z "$UV" ]; then
  if [ -x .venv/bin/uv ]; then UV=$PWD/.venv/bin/uv; elif command -v uv >/dev/null 2>&1; then UV=$(command -v uv); fi
fi
[ -n "$UV" ] || die "uv not found: run ./scripts/bootstrap.sh (it installs the uv requirements/test.lock pins)"
# A TLS-intercepting proxy's CA is in the system bundle; uv reads it from there when told to.
[ -z "${SSL_CERT_FILE:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ] && export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

LOCKS=(requirements/product.lock requirements/serving.lock requirements/test.lock requirements/bench.lock)

compile() {  # compile OUTPUT ARGS...: one lock
  local out=$1; shift
  "$UV" pip compile --quiet --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
    --excludes scripts/lock-excludes.txt "${upgrade[@]}" "$@" -o "$out" || die "uv pip compile for $out failed"
}

write_locks() {  # every lock, in the current folder
  local product=(--extra serving --extra training --extra client --extra pipeline)
  compile requirements/product.lock pyproject.toml "${product[@]}"
  compile requirements/serving.lock pyproject.toml --extra serving -c requirements/product.lock
  compile requirements/test.lock pyproject.toml "${product[@]}" --extra test -c requirements/product.lock
  compile requirements/bench.lock bench/pyproject.toml -c requirements/product.lock
}

if [ "$check" = 0 ]; then
  write_locks
  echo "lock: wrote ${LOCKS[*]}"
  exit 0
fi
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/requirements" "$scratch/bench" "$scratch/scripts"
cp pyproject.toml "$scratch/"
cp bench/pyproject.toml "$scratch/bench/"
cp scripts/lock-excludes.txt "$scratch/scripts/"
cp "${LOCKS[@]}" "$scratch/requirements/"
(cd "$scratch" && write_locks)
stale=()
for lock in "${LOCKS[@]}"; do cmp -s "$lock" "$scratch/$lock" || stale+=("$lock"); done
[ ${#stale[@]} -eq 0 ] || die "${stale[*]} differ from what scripts/lock.sh writes: run it and commit the result"
echo "lock: ${LOCKS[*]} agree with the pyprojects"
