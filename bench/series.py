"""Concurrency sweeps: repeated trials per load level, each trial one load-generator run.

Every server (TorchServe REST and gRPC, LitServe, FastAPI) goes through the same loop, so their
figures are computed the same way: the median over trials with its min-max, plus the load
generator's and the server's CPU use during the same window.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .procs import ProcessTree
from .stats import summarize

RunFn = Callable[[int], dict[str, Any]]
Log = Callable[[str], None]

#: Warm-up before any figure is taken: c=16 windows until two in a row agree within WARMUP_STEADY, and at least
#: WARMUP_MIN_S. TorchServe's Java frontend needs 15-30 s of load before its throughput settles (it doubles on the
#: way, while the JIT compiles), far more than a Python server.
WARMUP_WINDOW_S = 3
WARMUP_MIN_S = 15.0
WARMUP_MAX_S = 40.0
WARMUP_STEADY = 0.05

METRICS = ("throughput", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "loadgen_cpu_pct", "server_cpu_pct")


class Probe(Protocol):
    """Server-side figures for one trial's window (TorchServe: Prometheus counters and handler log)."""

    def begin(self) -> Any: ...

    def end(self, state: Any, trial: dict[str, Any]) -> dict[str, float | None]: ...


def aggregate(concurrency: int, trials: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"concurrency": concurrency}
    for key in METRICS:
        out[key] = summarize(t.get(key) for t in trials)
    out["requests"] = int(sum(t["requests"] for t in trials))
    out["errors"] = int(sum(t["errors"] for t in trials))
    splits = [t["split"] for t in trials if t.get("split")]
    if splits:
        out["split_ms"] = {k: summarize(s.get(k) for s in splits) for k in dict.fromkeys(k for s in splits for k in s)}
    out["trials"] = list(trials)
    return out


def sweep(run: RunFn, concurrencies: Sequence[int], trials: int, tree: ProcessTree | None,
          probe: Probe | None = None, label: str = "", log: Log = print) -> list[dict[str, Any]]:
    """`trials` runs at each concurrency; server CPU and probe figures cover each run's window."""
    results = []
    for concurrency in concurrencies:
        done = []
        for _ in range(trials):
            cpu_before = tree.cpu_snapshot() if tree else {}
            state = probe.begin() if probe else None
            trial = run(concurrency)
            trial["server_cpu_pct"] = tree.cpu_pct_since(cpu_before, trial["seconds"]) if tree else None
            if probe:
                trial["split"] = probe.end(state, trial)
            done.append(trial)
        row = aggregate(concurrency, done)
        results.append(row)
        log(f"  {label} c={concurrency:<3d} {row['throughput']['median']:8.1f} req/s  "
            f"p50 {row['p50_ms']['median']:6.1f} ms  p99 {row['p99_ms']['median']:6.1f} ms  "
            f"errors {row['errors']}  loadgen CPU {row['loadgen_cpu_pct']['median']:.0f}%  "
            f"server CPU {row['server_cpu_pct']['median'] or 0:.0f}%")
    return results


def warm_until_steady(window: Callable[[int], float], window_s: int = WARMUP_WINDOW_S, min_s: float = WARMUP_MIN_S,
                      max_s: float = WARMUP_MAX_S, steady: float = WARMUP_STEADY) -> dict[str, Any]:
    """Call `window(window_s)` (one load window; it returns its req/s) until two windows in a row agree within
    `steady` (relative) and `min_s` has passed, or `max_s` has: the rates, the seconds and whether it settled.

    The clock is read after each window, so a warm-up can end up to one window past `max_s`; a ramp slower than
    `steady` per window counts as settled, which the minimum time is there to outlast."""
    rates: list[float] = []
    started = time.monotonic()
    while True:
        rates.append(window(window_s))
        elapsed = time.monotonic() - started
        settled = len(rates) > 1 and rates[-2] > 0 and abs(rates[-1] / rates[-2] - 1) <= steady
        if (settled and elapsed >= min_s) or elapsed >= max_s:
            return {"rates": [round(r, 1) for r in rates], "seconds": round(elapsed, 1), "steady": settled}
