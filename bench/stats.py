"""Summaries of repeated trials: every figure in the report is a median with its min-max."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

Summary = dict[str, Any]


def summarize(values: Iterable[float | None]) -> Summary:
    """Median, min and max over trials (None and NaN trials are dropped and counted as missing)."""
    raw = list(values)
    kept = [float(v) for v in raw if v is not None and not math.isnan(float(v))]
    if not kept:
        return {"median": None, "min": None, "max": None, "n": 0, "missing": len(raw), "values": []}
    return {"median": float(np.median(kept)), "min": min(kept), "max": max(kept), "n": len(kept),
            "missing": len(raw) - len(kept), "values": kept}


def median(summary: Summary | None) -> float | None:
    return None if summary is None else summary.get("median")


def mid(summary: Summary | None) -> float:
    """The median for arithmetic and comparisons: NaN (never met, never ranked first) when not measured."""
    value = median(summary)
    return float("nan") if value is None else value


def fmt(summary: Summary | None, digits: int = 1, unit: str = "") -> str:
    """'123.4 (120.1-130.2)' for a summary, with the range left out when there is a single trial."""
    if not summary or summary.get("median") is None:
        return "n/a"
    mid = f"{summary['median']:.{digits}f}{unit}"
    if summary["n"] < 2:
        return mid
    return f"{mid} ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"


def percentiles_ms(latencies_s: Sequence[float], points: Sequence[float] = (50, 90, 99)) -> dict[str, float | None]:
    """Latency percentiles in milliseconds from per-request seconds (gRPC generator, ceiling batches)."""
    if len(latencies_s) == 0:
        return {f"p{int(p)}": None for p in points}
    arr = np.asarray(latencies_s, dtype=np.float64) * 1e3
    return {f"p{int(p)}": float(np.percentile(arr, p)) for p in points}
