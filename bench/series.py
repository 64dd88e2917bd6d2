"""Concurrency sweeps: repeated trials per load level, each trial one load-generator run.

Every server (TorchServe REST and gRPC, LitServe, FastAPI) goes through the same loop, so their
figures are computed the same way: the median over trials with its min-max, plus the load
generator's and the server's CPU use during the same window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .procs import ProcessTree
from .stats import summarize

RunFn = Callable[[int], dict[str, Any]]
Log = Callable[[str], None]

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
