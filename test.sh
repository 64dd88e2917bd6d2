#!/usr/bin/env bash
# Run the whole test suite (what CI runs): sets up .venv if needed, then pytest. Arguments go to one pytest as
# they are; without any, the suite runs as two pytest processes side by side (see below).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
cd "$ROOT"
./scripts/bootstrap.sh
./scripts/system-deps.sh
# Two cores are shared by pytest, TorchServe's frontend and its workers: keep torch single-threaded.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi

# The whole suite. One pytest leaves a core idle for half the run (its integration tests mostly wait on servers
# they start), so the e2e and unit tests run in a second pytest beside the integration tests: no test is in both
# or in neither (each test carries exactly one of the three kind markers, conftest.py). The second one keeps its
# server registry apart ($XDG_STATE_HOME) and its output in a file, printed when both are done.
side_log="$(mktemp -t test-side.XXXXXX.log)"
side_state="$(mktemp -d -t test-side-state.XXXXXX)"
XDG_STATE_HOME="$side_state" .venv/bin/python -m pytest -m "e2e or unit" -p no:cacheprovider >"$side_log" 2>&1 &
side=$!
trap 'kill -INT "$side" 2>/dev/null || true; wait "$side" 2>/dev/null || true' INT TERM
echo "test.sh: tests/e2e, tests/unit and bench/tests/unit run beside this one (pid $side, output in $side_log)"
main_status=0
.venv/bin/python -m pytest -m "not (e2e or unit)" || main_status=$?
side_status=0
wait "$side" || side_status=$?
trap - INT TERM
echo
echo "=================== tests/e2e, tests/unit, bench/tests/unit (run beside the above) ==================="
cat "$side_log"
rm -rf "$side_state" "$side_log"
echo "test.sh: integration tests exit $main_status, e2e and unit tests exit $side_status"
[ "$main_status" -eq 0 ] && [ "$side_status" -eq 0 ]
