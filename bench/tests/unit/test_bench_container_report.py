"""bench.container's verdicts: the image against TorchServe alone, and CPU time per request."""

from __future__ import annotations

from bench.container import LINEUPS, cpu_per_request, p99_ratio, ratio, target_status


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


def test_the_python_runtimes_target_is_throughput_against_itself_on_the_host():
    python = LINEUPS["python"]
    host = row(2000, 20)
    assert target_status(row(1900, 30), host, 16, python.rps_target, python.p99_target) == \
        "met (0.95x req/s, 1.50x p99)"
    assert target_status(row(1880, 20), host, 64, python.rps_target, python.p99_target) == \
        "**missed** (0.94x req/s, 1.00x p99)"


def test_each_lineup_starts_only_servers_it_reports_and_its_reference_is_one_of_them():
    for lineup in LINEUPS.values():
        assert lineup.servers[0] == "container" and lineup.reference in lineup.servers[1:]
        assert lineup.runtime.manifest.is_file()
