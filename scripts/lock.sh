#!/usr/bin/env bash
# Usage: scripts/lock.sh [--upgrade]
# Regenerate every lock of the project from the one declaration of its dependencies (pyproject.toml, and
# bench/pyproject.toml for the benchmarks) with uv pip compile, for CPython 3.11 on x86_64 Linux. Each lock's
# header holds the exact command that wrote it. Without --upgrade the versions already pinned are kept
# (requirements.lock is the constraint of the others, its own pins the preference of its resolution): only a
# dependency added to or changed in a pyproject moves a pin. Locks the side environments of the compatibility
# tests (requirements-kfp-oldest.txt, requirements-kserve-storage*.txt, requirements-gcs-emulator.txt,
# requirements-clients/) are hand-pinned fixtures and are not touched.
#
# torch: PyPI's torch==X metadata names CUDA runtime wheels; scripts/lock-excludes.txt leaves them out, so the
# locks say torch==X and pip or uv installs X+cpu from the PyPI CPU index or a local wheel directory.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "lock: $*" >&2; exit 1; }

upgrade=()
case "${1:-}" in
  "") ;;
  --upgrade) upgrade=(--upgrade) ;;
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument: $1 (usage: scripts/lock.sh [--upgrade])" ;;
esac

UV=${UV:-}
if [ -z "$UV" ]; then
  if [ -x .venv/bin/uv ]; then UV=.venv/bin/uv; elif command -v uv >/dev/null 2>&1; then UV=uv; fi
fi
[ -n "$UV" ] || die "uv not found: run ./scripts/bootstrap.sh (it installs the uv pinned in requirements-test.txt)"
# A TLS-intercepting proxy's CA is in the system bundle; uv reads it from there when told to.
[ -z "${SSL_CERT_FILE:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ] && export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

compile() {  # compile OUTPUT ARGS...: one lock
  local out=$1; shift
  "$UV" pip compile --quiet --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
    --excludes scripts/lock-excludes.txt "${upgrade[@]}" "$@" -o "$out" || die "uv pip compile for $out failed"
}

PRODUCT=(--extra serving --extra training --extra client --extra pipeline)
compile requirements.lock pyproject.toml "${PRODUCT[@]}"
compile requirements-serving.lock pyproject.toml --extra serving -c requirements.lock
compile requirements-test.txt pyproject.toml "${PRODUCT[@]}" --extra test -c requirements.lock
compile requirements-bench.txt bench/pyproject.toml -c requirements.lock
echo "lock: wrote requirements.lock requirements-serving.lock requirements-test.txt requirements-bench.txt"
