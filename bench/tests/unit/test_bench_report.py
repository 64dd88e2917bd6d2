"""bench.report's targets: the fairness flag (a server under load that did not use both cores is marked in every
table and in the peer target, so a comparison with it is read as what it is), and the ceiling share, judged at
each target concurrency on its own."""

from __future__ import annotations

from bench.report import TARGET_RATIO, _load_rows, _peer_target, _warmup, targets, unsaturated


def run(c: int, cpu: float, rps: float = 1000.0, p99: float = 20.0) -> dict:
    s = lambda v: {"median": v, "min": v, "max": v, "n": 1, "missing": 0, "values": [v]}
    return {"concurrency": c, "throughput": s(rps), "p50_ms": s(5.0), "p90_ms": s(9.0), "p99_ms": s(p99),
            "errors": 0, "loadgen_cpu_pct": s(3.0), "server_cpu_pct": s(cpu)}


def test_only_loaded_runs_below_180_percent_are_flagged():
    assert unsaturated(run(16, 98.0)) and unsaturated(run(64, 179.0))
    assert not unsaturated(run(16, 179.6))  # shown as 180 in the table: not flagged
    assert not unsaturated(run(16, 190.0))
    assert not unsaturated(run(4, 98.0))  # at low concurrency one core may be all the work needs
    rows = _load_rows([run(4, 98.0), run(16, 98.0), run(16, 185.0)], "peer")
    assert ["below both cores" in row[-1] for row in rows] == [False, True, False]


def test_peer_target_names_the_unsaturated_peer():
    results = {"peers": [{"name": "fastapi", "runs": [run(16, 98.0, rps=900.0, p99=15.0)]},
                         {"name": "litserve", "runs": [run(16, 185.0, rps=800.0, p99=30.0)]}]}
    target = _peer_target(results, {"runs": [run(16, 181.0, rps=1200.0, p99=20.0)]})
    assert target["met"] is False  # fastapi's p99 is lower
    assert "fastapi 900 req/s p99 15.0 ms (server CPU 98%: below both cores) (not beaten)" in target["why"]
    assert "litserve 800 req/s p99 30.0 ms (beaten by REST)" in target["why"]


def test_the_ceiling_share_is_judged_at_c16_and_c64_separately():
    s = lambda v: {"median": v, "min": v, "max": v, "n": 1, "missing": 0, "values": [v]}
    ceiling = {"rows": [{"layout": "2x1", "processes": 2, "threads": 1, "batch": 8, "images_per_s": s(1000.0)},
                        {"layout": "1x2", "processes": 1, "threads": 2, "batch": 8, "images_per_s": s(800.0)}]}
    shipped = {"shipped": True, "workers": 2, "threads": 1, "batch_size": 8,
               "runs": [run(16, 185.0, rps=1000.0 * TARGET_RATIO + 1), run(64, 185.0, rps=1000.0 * TARGET_RATIO - 1)]}
    rows = {t["target"]: t for t in targets({"ceiling": ceiling, "torchserve": [shipped]})}
    at16, at64 = rows["REST throughput, shipped config, c=16"], rows["REST throughput, shipped config, c=64"]
    assert at16["met"] is True and at64["met"] is False
    assert "of 1000 images/s (2x1, batch 8)" in at64["measured"]
    only16 = dict(shipped, runs=shipped["runs"][:1])
    rows = {t["target"]: t for t in targets({"ceiling": ceiling, "torchserve": [only16]})}
    assert rows["REST throughput, shipped config, c=64"]["met"] is None  # not measured, not passed


def test_the_warm_up_is_shown_with_each_window_and_whether_it_settled():
    assert _warmup({}) == "-"
    assert _warmup({"warmup": {"rates": [1041.2, 1886.0, 1920.4], "seconds": 9.1, "steady": True}}) == (
        "9 (1041, 1886, 1920)")
    assert _warmup({"warmup": {"rates": [900.0, 1500.0], "seconds": 40.2, "steady": False}}).endswith(
        ", not settled")


def test_python_runtime_targets_compare_with_torchserve_the_ceiling_and_fastapi_in_the_same_run():
    """#39: >= 1.3x TorchServe shipped and >= 70% of the ceiling at c=16 and 64, at least FastAPI (with p99 no
    worse) at every c, and a c=1 p50 no worse than TorchServe without batching."""
    from bench.report import python_runtime_targets

    s = lambda v: {"median": v, "min": v, "max": v, "n": 1, "missing": 0, "values": [v]}
    ceiling = {"images_per_s": s(1000.0), "layout": "2x1", "batch": 32}
    shipped = {"runs": [run(16, 185.0, rps=500.0), run(64, 185.0, rps=600.0)]}
    no_batching = {"name": "no-batching", "runs": [run(1, 90.0, rps=300.0)]}
    python = {"name": "python", "runs": [run(1, 90.0, rps=400.0), run(16, 190.0, rps=700.0, p99=9.0),
                                         run(64, 190.0, rps=760.0, p99=30.0)]}
    fastapi = {"name": "fastapi", "runs": [run(1, 90.0, rps=350.0), run(16, 190.0, rps=650.0, p99=10.0),
                                           run(64, 190.0, rps=700.0, p99=25.0)]}
    results = {"torchserve": [no_batching], "peers": [python, fastapi]}
    rows = {t["target"]: t for t in python_runtime_targets(results, shipped, ceiling)}
    assert rows["python runtime vs TorchServe shipped, c=16"]["met"] is True  # 700 / 500 = 1.40x
    assert rows["python runtime vs TorchServe shipped, c=64"]["met"] is False  # 760 / 600 = 1.27x
    assert rows["python runtime share of the ceiling, c=16"]["met"] is True  # 70%
    assert rows["python runtime share of the ceiling, c=64"]["met"] is True
    fast = rows["python runtime vs the FastAPI peer"]
    assert fast["met"] is False and fast["measured"] == "2 of 3 concurrencies"  # c=64: p99 30 > 25
    assert "c=64: 760 vs 700 req/s, p99 30.0 vs 25.0 ms (not)" in fast["why"]
    assert rows["python runtime p50 at c=1"]["met"] is True  # the same 5.0 ms
    assert python_runtime_targets({"peers": [fastapi]}, shipped, ceiling)[0]["met"] is None
