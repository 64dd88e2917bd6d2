"""`python -m bench --quick` end to end: the outputs are well-formed (no timing assertions)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from bench.output import raw_path
from settings import REPO

pytestmark = pytest.mark.serving

TOP_KEYS = {"schema_version", "mode", "started", "finished", "duration_s", "machine", "versions", "settings",
            "load_average", "data", "ceiling", "torchserve", "grpc", "peers", "cold_start", "gallery", "targets"}
SUMMARY_KEYS = {"median", "min", "max", "n", "values"}
RUN_KEYS = {"concurrency", "throughput", "p50_ms", "p90_ms", "p99_ms", "errors", "loadgen_cpu_pct", "server_cpu_pct",
            "trials"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, tiny_artifacts) -> Path:
    assert shutil.which("wrk"), "wrk is not installed: ./scripts/system-deps.sh installs it"
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(out), "--artifacts",
                           str(tiny_artifacts)], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def _is_summary(value: dict) -> bool:
    return SUMMARY_KEYS <= set(value)


def test_json_schema(quick_run, written):
    results = written(quick_run, "results", report.markdown)
    assert TOP_KEYS <= set(results), TOP_KEYS - set(results)
    assert results["mode"] == "quick"
    assert results["machine"]["cpu_model"] and results["machine"]["logical_cores"] >= 1
    for name in ("torch", "faiss-cpu", "torchserve", "java"):
        assert results["versions"][name], name
    rows = results["ceiling"]["rows"]
    assert rows and all(_is_summary(r["images_per_s"]) and r["images_per_s"]["median"] > 0 for r in rows)
    shipped = [c for c in results["torchserve"] if c["shipped"]]
    assert len(shipped) == 1 and shipped[0]["start_to_ready_s"] > 0
    for run in shipped[0]["runs"]:
        assert RUN_KEYS <= set(run) and _is_summary(run["throughput"]) and run["requests"] > 0
        assert {"queue", "preprocess", "embed", "search", "frontend"} <= set(run["split_ms"])
    assert shipped[0]["memory_idle"] and shipped[0]["memory_loaded"]
    grpc = results["grpc"]  # grpcio-tools is pinned in requirements.lock: gRPC is always measured here
    assert grpc["available"] is True and grpc["runs"], grpc.get("reason")
    assert all(RUN_KEYS <= set(r) and r["requests"] > 0 and r["errors"] == 0 for r in grpc["runs"])
    assert {peer["name"] for peer in results["peers"]} >= {"fastapi", "litserve"}
    for peer in results["peers"]:
        assert "error" not in peer and peer["runs"], peer.get("error")
        assert all(RUN_KEYS <= set(r) and r["requests"] > 0 and r["errors"] == 0 for r in peer["runs"]), peer["name"]
    assert _is_summary(results["cold_start"]["archive_s"]) and results["cold_start"]["mar_mb"] > 0
    kinds = {(r["gallery"], r["index"]) for r in results["gallery"]["rows"]}
    assert {index for _, index in kinds} == {"flat", "hnsw", "ivf"}
    assert all(0.0 <= r["recall_at_1"] <= 1.0 for r in results["gallery"]["rows"])
    assert results["gallery"]["sweeps"] and results["gallery"]["recommendation"]["per_gallery"]
    assert all({"target", "goal", "measured", "met", "margin", "why"} <= set(t) for t in results["targets"])


def test_markdown_has_tables(quick_run):
    text = (quick_run / "results.md").read_text()
    for heading in ("## Targets", "## 1. In-process ceiling", "## 2. TorchServe REST", "## 5. Gallery scaling",
                    "## 6. Cold start", "## 7. Memory"):
        assert heading in text, heading
    assert len(re.findall(r"^\|---(\|---)+\|$", text, flags=re.MULTILINE)) >= 6
    machine = json.loads(raw_path(quick_run, "results").read_text())["machine"]
    assert f"- Machine: {machine['cpu_model']}, {machine['logical_cores']} logical" in text
