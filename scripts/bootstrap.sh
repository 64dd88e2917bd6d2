#!/usr/bin/env bash
# Create .venv and install the pinned dependencies (the locks scripts/lock.sh generates) with uv, and the project
# itself, editable, for its console scripts. Idempotent: reinstalls only when a lock file or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv-lib.sh

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

# requirements/test.lock is the product lock (requirements/product.lock) plus the test tools, uv among them;
# pyproject.toml is in the stamp for the editable install of the project itself (its console scripts).
stamp=.venv/.deps-stamp
want=$(cat requirements/product.lock requirements/test.lock requirements/bench.lock pyproject.toml | sha256sum \
  | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing pinned dependencies into .venv (first run takes about a minute)"
  uv_pin=$(grep -m1 -E '^uv==' requirements/test.lock) || die "requirements/test.lock pins no uv."
  if [ "$(.venv/bin/uv --version 2>/dev/null | cut -d' ' -f2)" != "${uv_pin#uv==}" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "$uv_pin" \
      2> >(grep -v '^WARNING: Location' >&2) || die "pip install $uv_pin failed (see above)."
  fi
  # torch is pinned in the same command as everything that depends on it, so the CUDA build is never pulled.
  # shellcheck disable=SC2046  # torch_source prints options to split
  .venv/bin/uv pip install --quiet --python .venv/bin/python $(torch_source) \
    -r requirements/product.lock -r requirements/test.lock -r requirements/bench.lock \
    || die "uv pip install failed (see above)."
  .venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps --no-build-isolation -e . \
    || die "installing the project (console scripts embedding-*) failed (see above)."
  echo "$want" > "$stamp"
fi

# TorchServe's gRPC stubs: generated from the installed TorchServe's protos into client/_grpc/ (never committed);
# a no-op while they match the installed versions.
.venv/bin/python -m client.protos >/dev/null || die "generating the gRPC stubs failed (see above)."

# Open Inference gRPC stubs for the gateway (serving/proto/grpc_predict_v2.proto), generated into .venv's
# site-packages (never committed); a no-op while they match the proto.
.venv/bin/python -m serving.grpc_stubs >/dev/null || die "generating the Open Inference gRPC stubs failed (see above)."
