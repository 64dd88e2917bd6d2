"""bench.gateway_ab: paired rounds alternate the side that goes first, and verdicts come from per-round ratios."""

from __future__ import annotations

import itertools
import json

import pytest

from bench import gateway_ab


def run(rps: float, p99: float, cpu: float = 180.0) -> dict:
    return {"throughput": rps, "p99_ms": p99, "server_cpu_pct": cpu, "errors": 0}


def cell(kind: str, c: int, image: dict, alone: dict) -> dict:
    return {"kind": kind, "concurrency": c, "image": image, "alone": alone}


def test_paired_ratios_are_taken_within_each_round():
    # The machine halves its speed in round 2: both sides drop, the paired ratio does not.
    rounds = [{"cells": [cell("png", 16, run(900, 22), run(1000, 20))]},
              {"cells": [cell("png", 16, run(460, 44), run(500, 40))]},
              {"cells": [cell("png", 16, run(950, 21), run(1000, 20))]}]
    (row,) = gateway_ab.summarize_cells(rounds)
    assert row["rps_ratio"]["values"] == pytest.approx([0.9, 0.92, 0.95])
    assert row["rps_ratio"]["median"] == pytest.approx(0.92)
    assert row["p99_ratio"]["median"] == pytest.approx(1.1)
    assert row["rounds_at_target"] == 3
    assert row["target_met"] is True


def test_target_needs_median_throughput_and_p99():
    slow = [{"cells": [cell("v1", 64, run(850, 20), run(1000, 20))]} for _ in range(3)]
    assert gateway_ab.summarize_cells(slow)[0]["target_met"] is False
    tail = [{"cells": [cell("v1", 64, run(1000, 30), run(1000, 20))]} for _ in range(3)]
    assert gateway_ab.summarize_cells(tail)[0]["target_met"] is False
    low_c = [{"cells": [cell("v1", 1, run(850, 20), run(1000, 20))]}]
    assert "target_met" not in gateway_ab.summarize_cells(low_c)[0]  # c=1 is not a target concurrency


def test_cpu_per_request_ratio():
    rounds = [{"cells": [cell("png", 16, run(1000, 20, cpu=198), run(1100, 20, cpu=180))]}]
    (row,) = gateway_ab.summarize_cells(rounds)
    # image 1.98 cores / 1000 req/s = 1,980 µs; alone 1.8 / 1100 = 1,636 µs
    assert row["cpu_ratio"]["median"] == pytest.approx(1980 / 1636.36, rel=1e-3)


def test_errors_fail_the_target():
    failing = run(1000, 20)
    failing["errors"] = 3
    rounds = [{"cells": [cell("png", 16, failing, run(1000, 20))]}]
    assert gateway_ab.summarize_cells(rounds)[0]["target_met"] is False


def test_percentile_interpolates():
    assert gateway_ab.percentile([1.0, 2.0, 3.0, 4.0], 25) == pytest.approx(1.75)
    assert gateway_ab.percentile([], 50) is None


def test_rounds_alternate_first_side_and_cover_every_cell(monkeypatch):
    calls = []

    def fake_trial(server, script, concurrency, duration_s):
        calls.append((server, script, concurrency))
        return run(1000 if server == "alone" else 950, 20)

    monkeypatch.setattr(gateway_ab, "trial", fake_trial)
    monkeypatch.setattr(gateway_ab, "load", lambda: [0.0, 0.0, 0.0])
    servers = {"image": "image", "alone": "alone"}
    scripts = {side: {kind: kind for kind in gateway_ab.BODIES} for side in servers}
    rounds = gateway_ab.paired_rounds(servers, scripts, [16, 64], rounds=4, duration_s=1)
    cells = [c for r in rounds for c in r["cells"]]
    assert len(cells) == 4 * len(gateway_ab.BODIES) * 2
    for key in {(c["kind"], c["concurrency"]) for c in cells}:  # per cell: each side first in half the rounds,
        firsts = [c["first"] for r in rounds for c in r["cells"] if (c["kind"], c["concurrency"]) == key]
        assert firsts.count("image") == firsts.count("alone") == 2, (key, firsts)
        assert all(a != b for a, b in zip(firsts, firsts[1:])), (key, firsts)  # and never twice in a row
    for r in rounds:  # every (body, c) once per round
        assert sorted((c["kind"], c["concurrency"]) for c in r["cells"]) == sorted(
            (k, c) for k in gateway_ab.BODIES for c in (16, 64))
    # each cell ran both sides back to back, the first side first
    for i, c in enumerate(cells):
        assert [calls[2 * i][0], calls[2 * i + 1][0]] == ([c["first"], "alone" if c["first"] == "image" else "image"])
    table = gateway_ab.markdown({
        "started": "t", "duration_s": 1.0, "command": "cmd", "load_start": [0], "load_end": [0],
        "machine": {"cpu_model": "cpu", "logical_cores": 2}, "image": {"ref": "img"},
        "settings": {"rounds": 4, "duration_s": 1},
        "galleries": {"5k": {"cells": gateway_ab.summarize_cells(rounds)}}})
    assert "| 5k | png | 16 | 950 / n/a / 1000 | 0.95 (0.95-0.95) | 4/4 | 1.00 |" in table


def test_three_sides_rotate_so_each_goes_first_equally(monkeypatch):
    calls = []

    def fake_trial(server, script, concurrency, duration_s):
        calls.append(server)
        return run({"image": 800, "in-image": 950, "alone": 1000}[server], 20)

    monkeypatch.setattr(gateway_ab, "trial", fake_trial)
    monkeypatch.setattr(gateway_ab, "load", lambda: [0.0, 0.0, 0.0])
    servers = {side: side for side in gateway_ab.SIDES}
    scripts = {side: {kind: kind for kind in gateway_ab.BODIES} for side in servers}
    rounds = gateway_ab.paired_rounds(servers, scripts, [16], rounds=6, duration_s=1)
    for kind in gateway_ab.BODIES:
        orders = [tuple(c["order"]) for r in rounds for c in r["cells"] if c["kind"] == kind]
        # every order of the three sides once: each side first twice, and each follows each other side equally
        assert sorted(orders) == sorted(itertools.permutations(gateway_ab.SIDES)), orders
    assert len(calls) == 6 * len(gateway_ab.BODIES) * 3
    assert calls[:3] == list(rounds[0]["cells"][0]["order"])  # the trials ran in the recorded order
    (row, _) = gateway_ab.summarize_cells(rounds)
    assert row["rps_ratio"]["median"] == pytest.approx(0.8)
    assert row["front_ratio"]["median"] == pytest.approx(800 / 950)
    assert row["container_ratio"]["median"] == pytest.approx(0.95)
    assert (row["image_rps"], row["in_image_rps"], row["alone_rps"]) == (800, 950, 1000)


def test_cpu_by_process_role_is_reported_per_side():
    def with_roles(rps, roles):
        r = run(rps, 20)
        r["cpu_us_by_role"] = roles
        return r

    rounds = [{"cells": [{"kind": "png", "concurrency": 16,
                          "image": with_roles(800, {"nginx": 150 + i, "frontend": 600, "workers": 2000,
                                                    "gateway": 1}),
                          "in-image": with_roles(950, {"frontend": 550, "workers": 2000, "other": 0}),
                          "alone": with_roles(1000, {"frontend": 450, "workers": 2100})}]} for i in range(3)]
    (row,) = gateway_ab.summarize_cells(rounds)
    assert row["cpu_us"]["image"] == {"nginx": 151, "frontend": 600, "workers": 2000, "gateway": 1}
    assert row["cpu_us"]["alone"] == {"frontend": 450, "workers": 2100}
    table = gateway_ab.markdown({
        "started": "t", "duration_s": 1.0, "command": "cmd", "load_start": [0], "load_end": [0],
        "machine": {"cpu_model": "cpu", "logical_cores": 2}, "image": {"ref": "img"},
        "settings": {"rounds": 3, "duration_s": 1}, "galleries": {"5k": {"cells": [row]}}})
    assert "| 5k | png | 16 | 151 / 600 / 2000 / 1 | 550 / 2000 | 450 / 2100 |" in table
    assert "| 0.84 (0.84-0.84) | 0.95 (0.95-0.95) |" in table  # the front's ratio, then the container's


def test_trial_splits_cpu_per_request_by_role(monkeypatch):
    class Tree:
        def cpu_snapshot(self):
            return {1: 0.0, 2: 0.0}

        def cpu_by_role_since(self, before, role):
            return {"nginx": 0.5, "frontend": 2.0}

    class Server:
        base, tree = "http://x", Tree()

    monkeypatch.setattr(gateway_ab, "run_wrk", lambda *a: {"throughput": 500.0, "seconds": 10.0, "errors": 0})
    out = gateway_ab.trial(Server(), None, 16, 10)
    assert out["server_cpu_pct"] == pytest.approx(25.0)  # 2.5 CPU-seconds over 10 s
    assert out["cpu_us_by_role"] == pytest.approx({"nginx": 100.0, "frontend": 400.0})  # over 5,000 requests


def test_batch_delay_is_set_for_every_model_version(tmp_path):
    (tmp_path / "config").mkdir()
    snapshot = {"name": "startup.cfg", "modelCount": 1,
                "models": {"embedding": {"1.0": {"batchSize": 8, "maxBatchDelay": 1}}}}
    config = tmp_path / "config" / "config.properties"
    config.write_text(f"inference_address=http://127.0.0.1:8085\nmodel_snapshot={json.dumps(snapshot)}\n")
    gateway_ab.set_batch_delay(tmp_path, 3)
    lines = config.read_text().splitlines()
    assert lines[0] == "inference_address=http://127.0.0.1:8085"
    assert json.loads(lines[1].removeprefix("model_snapshot="))["models"]["embedding"]["1.0"] == {
        "batchSize": 8, "maxBatchDelay": 3}
    config.write_text("inference_address=http://127.0.0.1:8085\n")
    with pytest.raises(RuntimeError, match="model_snapshot"):
        gateway_ab.set_batch_delay(tmp_path, 3)
    with pytest.raises(SystemExit):
        gateway_ab.parse_args(["--max-batch-delay", "0"])
