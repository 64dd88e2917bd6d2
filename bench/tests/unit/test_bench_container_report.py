"""bench.container's verdicts: the image against TorchServe alone, and CPU time per request."""

from __future__ import annotations

from bench.container import cpu_per_request, p99_ratio, ratio, target_status


def row(rps: float, p99: float, cpu: float = 180.0) -> dict:
    return {"throughput": {"median": rps}, "p99_ms": {"median": p99}, "server_cpu_pct": {"median": cpu}}


def test_target_needs_both_throughput_and_p99():
    alone = row(2000, 20)
    assert target_status(row(1850, 23), alone, 16) == "met (0.93x req/s, 1.15x p99)"
    assert target_status(row(1700, 20), alone, 64) == "**missed** (0.85x req/s, 1.00x p99)"
    assert target_status(row(1900, 25), alone, 16) == "**missed** (0.95x req/s, 1.25x p99)"
    assert target_status(row(1900, 20), alone, 1) == ""  # not a target concurrency
    assert target_status(None, alone, 16) == "n/a"


def test_ratios_and_cpu_per_request():
    assert ratio(row(1500, 10), row(2000, 20)) == "0.75"
    assert p99_ratio(row(1500, 30), row(2000, 20)) == "1.50"
    assert ratio(None, row(2000, 20)) == "n/a"
    assert cpu_per_request(row(2000, 10, cpu=180)) == "900"  # 1.8 cores / 2000 req/s = 900 µs each
