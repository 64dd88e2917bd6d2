"""``client drift`` with two versions loaded in one real TorchServe: each version's traffic is judged against that
version's own metadata.json baseline, and the metrics endpoint and a real Prometheus scraping it agree.

Version 2.0 is the same model with its drift baseline's distances halved in metadata.json, so held-out digits,
ordinary for 1.0, drift on 2.0. Adding the two versions' gauges together (as the client once did on /metrics) or
taking their maximum (as it did on Prometheus) judged both against one baseline and said ok.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from serving.samples import user_digit_png

from client import EmbeddingClient
from client.__main__ import main as client_main
from serving import prometheus as prom
from serving.archive import build_mar
from serving.server import free_ports, private_instance, start, stop
from settings import MODEL_CONFIG_FILE, REPO

SENT = {"1.0": 60, "2.0": 90}  # a different count per version, so a mix-up shows
ONE_WORKER = MODEL_CONFIG_FILE.read_text().replace("minWorkers: 2", "minWorkers: 1").replace("maxWorkers: 2",
                                                                                             "maxWorkers: 1")


@pytest.fixture(scope="module")
def baselines(tmp_path_factory, tiny_artifacts) -> tuple[Path, dict[str, dict]]:
    """A store with embedding.mar (1.0) and embedding-2.0.mar (its baseline distances halved), one worker each,
    and each version's metadata.json drift_baseline."""
    root = tmp_path_factory.mktemp("drift-versions")
    config = root / "model-config.yaml"
    config.write_text(ONE_WORKER)
    v2 = shutil.copytree(tiny_artifacts, root / "artifacts-2.0")
    meta = json.loads((v2 / "metadata.json").read_text())
    halved = {k: v / 2 for k, v in meta["drift_baseline"]["top1_distance"].items()}
    meta["drift_baseline"] = {**meta["drift_baseline"], "top1_distance": halved}
    (v2 / "metadata.json").write_text(json.dumps(meta))
    store = root / "store"
    build_mar(tiny_artifacts, store, model_config=config)
    build_mar(v2, root / "build", version="2.0", model_config=config).replace(store / "embedding-2.0.mar")
    read = {"1.0": tiny_artifacts, "2.0": v2}
    return store, {v: json.loads((a / "metadata.json").read_text())["drift_baseline"] for v, a in read.items()}


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory, baselines):
    store, _ = baselines
    instance = private_instance(tmp_path_factory.mktemp("ts-drift-versions"))
    try:
        start(instance, store, models="embedding.mar,embedding-2.0.mar", timeout=240)
        yield instance
    finally:
        stop(instance)


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory, two_versions):
    """scripts/prometheus.sh scraping the server every second (the fast variant of the shipped config)."""
    if shutil.which("promtool") is None:
        pytest.skip("prometheus missing: scripts/system-deps.sh installs it")
    work = tmp_path_factory.mktemp("prometheus-drift")
    config = prom.render_variant(work / "config", [two_versions.endpoints.metrics.split("//", 1)[1]])
    script = ["bash", str(REPO / "scripts" / "prometheus.sh")]
    started = subprocess.run([*script, "start", "--dir", str(work / "run"), "--port", str(free_ports(1)[0]),
                              "--config", str(config)], capture_output=True, text=True, timeout=90)
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([*script, "stop", "--dir", str(work / "run")], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def traffic(two_versions, prometheus_url, prepared_sample) -> dict[str, int]:
    """SENT[v] held-out digits to each version, after one image per version has created its counters and
    Prometheus has scraped them (an increase() counts only what a counter gains after its first sample)."""
    picks = np.linspace(0, len(prepared_sample.test_images) - 1, max(SENT.values())).astype(int)
    digits = [user_digit_png(prepared_sample.test_images[i]) for i in picks]
    token = two_versions.keys()["inference"]
    clients = {v: EmbeddingClient(two_versions.endpoints.inference, version=v, token=token) for v in SENT}
    for client in clients.values():
        client.predict(digits[0])
    query = 'count by (ModelVersion) (EmbeddingAnsweredImages{ModelName="embedding"})'
    assert _wait(lambda: len(prom.api(prometheus_url, "query", query=query)["result"]) == len(SENT), 60)
    time.sleep(2)
    for version, client in clients.items():
        for image in digits[:SENT[version]]:
            client.predict(image)
        client.close()
    return {v: n + 1 for v, n in SENT.items()}


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def drift_json(capsys, *args: str) -> tuple[int, dict[str, dict]]:
    code = client_main(["drift", *args, "--format", "json"])
    out = capsys.readouterr().out
    return code, {report.get("model_version"): report for report in map(json.loads, out.splitlines())}


def assert_own_baselines(reports: dict[str, dict], baselines: dict[str, dict]) -> None:
    assert set(reports) == set(baselines)
    for version, report in reports.items():
        expected = {**baselines[version]["top1_distance"], "unknown_rate": baselines[version]["unknown_rate"]}
        wanted = {key: expected[key] for key in ("mean", "p50", "p90", "p99", "unknown_rate")}
        assert report["baseline"] == pytest.approx(wanted, rel=1e-6), version
    assert not reports["1.0"]["drifted"] and reports["2.0"]["distance_drift"]


@pytest.mark.serving
@pytest.mark.prometheus
def test_metrics_endpoint_judges_each_version_against_its_own_baseline(two_versions, traffic, baselines, capsys):
    time.sleep(1)  # the last batch's metrics reach the frontend through the worker's log
    code, reports = drift_json(capsys, "--url", two_versions.endpoints.metrics)
    assert code == 10
    assert_own_baselines(reports, baselines[1])
    assert {v: r["answered"] for v, r in reports.items()} == traffic
    code, only = drift_json(capsys, "--url", two_versions.endpoints.metrics, "--model-version", "1.0")
    assert code == 0 and only == {"1.0": reports["1.0"]}


@pytest.mark.serving
@pytest.mark.prometheus
def test_prometheus_agrees_with_the_metrics_endpoint(two_versions, prometheus_url, traffic, baselines, capsys):
    direct = drift_json(capsys, "--url", two_versions.endpoints.metrics)[1]

    def scraped() -> bool:  # every counted image has been scraped
        reports = drift_json(capsys, "--prometheus", prometheus_url, "--window", "5m")[1]
        return set(reports) == set(SENT) and all(r.get("answered", 0) >= SENT[v] for v, r in reports.items())

    assert _wait(scraped, 60)
    code, reports = drift_json(capsys, "--prometheus", prometheus_url, "--window", "5m")
    assert code == 10
    assert_own_baselines(reports, baselines[1])
    for version, report in reports.items():
        assert report["baseline"] == direct[version]["baseline"]
        assert report["drifted"] == direct[version]["drifted"]
        assert report["top1_mean"] == pytest.approx(direct[version]["top1_mean"], rel=0.05)
        assert SENT[version] <= report["answered"] <= 1.5 * SENT[version]
    # increase() extrapolates to the window's edges, by up to a scrape interval over a series a few seconds old: the
    # counts come out a little high, both by the same factor (the same target, scraped at the same instants)
    ratio = reports["2.0"]["answered"] / reports["1.0"]["answered"]
    assert ratio == pytest.approx(SENT["2.0"] / SENT["1.0"], rel=0.05)
    code = client_main(["drift", "--prometheus", prometheus_url, "--window", "5m", "--model-version", "2.0"])
    out = capsys.readouterr().out
    assert code == 10 and out.startswith(f"model embedding version 2.0 via {prometheus_url}")
    assert "DRIFT (> baseline p90" in out and "version 1.0" not in out
