"""`python -m bench soak` against a real TorchServe: a short run writes well-formed results without errors."""

from __future__ import annotations

import os
import subprocess
import sys

from support.hostile import wait_for_workers

from bench import soak
from settings import REPO

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def test_short_soak_writes_well_formed_results_without_errors(torchserve, tmp_path, written):
    wait_for_workers(torchserve, 2)
    out = tmp_path / "soak"
    result = subprocess.run(
        [sys.executable, "-m", "bench", "soak", "--duration-s", "8", "--rate", "10", "--window-s", "2",
         "--url", torchserve.endpoints.inference, "--key-file", str(torchserve.key_file), "--out", str(out)],
        capture_output=True, text=True, env=ENV, cwd=REPO, timeout=120)
    assert result.returncode in (0, 1), result.stderr  # 1 = a target missed; the figures are checked below
    report = written(out, "soak", soak.markdown)
    assert report["totals"]["requests"] == 80 and report["totals"]["errors"] == 0
    windows = report["windows"]
    assert [w["index"] for w in windows] == [0, 1, 2, 3]
    assert sum(w["requests"] for w in windows) == 80
    assert all(0 < w["p50_ms"] <= w["p99_ms"] for w in windows)
    samples = report["rss"]["samples"]
    assert len(samples) >= 4
    assert all(s["frontend_mb"] > 0 and len(s["workers_mb"]) == 2 for s in samples)
    growth = report["rss"]["growth_pct"]
    assert set(growth) == {"frontend", "workers", "total"} and all(isinstance(v, float) for v in growth.values())
    summary = (out / "soak.md").read_text()
    assert "| window |" in summary and f"{report['totals']['requests']}" in summary
