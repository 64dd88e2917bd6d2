#!/usr/bin/env bash
# Create .venv and install the pinned dependencies. Idempotent: reinstalls only when a lock file changed.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "bootstrap: $*" >&2; exit 1; }

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
[ -n "$PY" ] || die "Python 3.11 not found (install python3.11 and python3.11-venv)."
"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else 1)' \
  || die "Python >= 3.11 required, found $("$PY" --version 2>&1)."

if ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: warning: java not found; TorchServe needs Java 17 (apt-get install openjdk-17-jre-headless)." >&2
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv || die "could not create .venv (on Debian/Ubuntu: apt-get install python3.11-venv)."
fi

stamp=.venv/.deps-stamp
want=$(cat requirements.lock requirements-test.txt requirements-bench.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing pinned dependencies into .venv (first run takes about a minute)"
  # torch is pinned in the same command as everything that depends on it, so pip never pulls another build.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check \
    -r requirements.lock -r requirements-test.txt -r requirements-bench.txt || die "pip install failed (see above)."
  echo "$want" > "$stamp"
fi

# TorchServe's gRPC stubs: generated from the installed TorchServe's protos into client/_grpc/ (never committed);
# a no-op while they match the installed versions.
.venv/bin/python -m client.protos >/dev/null || die "generating the gRPC stubs failed (see above)."

# Open Inference gRPC stubs for the gateway (serving/proto/grpc_predict_v2.proto), generated into .venv's
# site-packages (never committed); a no-op while they match the proto.
.venv/bin/python -m serving.grpc_stubs >/dev/null || die "generating the Open Inference gRPC stubs failed (see above)."
