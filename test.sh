#!/usr/bin/env bash
# Run the whole test suite (what CI runs): sets up .venv if needed, then pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
cd "$ROOT"
./scripts/bootstrap.sh
./scripts/system-deps.sh
# Two cores are shared by pytest, TorchServe's frontend and its workers: keep torch single-threaded.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest "$@"
