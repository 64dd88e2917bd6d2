"""The cluster's metrics without a container: every series the shipped rules use is one that the KServe pod's
config.properties (pipeline.kserve_deploy.runtime_properties) makes TorchServe, the handler or the gateway produce,
as their code declares them; the gateway's latency histogram; the handler's version label; the environment
TorchServe's workers get in the serving image."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiohttp import web

from pipeline.kserve_deploy import KServeError, runtime_properties
from serving import prometheus as prom
from serving.gateway_metrics import BUCKETS, REQUEST_SECONDS, GatewayMetrics, histogram_series, inference_target
from serving.torchserve_env import torchserve_environment
from settings import GATEWAY_METRICS_KEY, REPO, SERVER_PROPERTIES, properties, read_properties, write_properties

HISTOGRAM = set(histogram_series())


@pytest.fixture(scope="module")
def cluster() -> dict[str, str]:
    return runtime_properties("embedding", "1.0")


# ------------------------------------------------------------------- rules against what the config produces
def test_cluster_config_produces_every_series_and_label_the_rules_use(cluster):
    assert prom.unproduced_selectors(cluster) == []


def test_without_auto_detect_the_handler_series_are_missing(cluster):
    """TorchServe's default (model_metrics_auto_detect=false) drops every Embedding* metric: the check sees it."""
    props = {k: v for k, v in cluster.items() if k != "model_metrics_auto_detect"}
    problems = prom.unproduced_selectors(props)
    assert any("no series EmbeddingAnsweredImages" in p for p in problems), problems
    assert any("EmbeddingNoSuccessfulAnswers" in p for p in problems)
    assert all("Embedding" in p.split("no series ")[-1] for p in problems), problems
    silent = prom.unproduced_selectors({**cluster, "metrics_mode": "log"})
    assert any("no series ts_inference_requests_total" in p for p in silent)


def test_local_config_lacks_only_the_gateways_histogram():
    """A local TorchServe has no gateway: the histogram is the one thing missing, and the latency alert falls
    back to TorchServe's mean there (checked by the promtool tests)."""
    problems = prom.unproduced_selectors(properties())
    assert problems and all(f"no series {REQUEST_SECONDS}_bucket" in p for p in problems), problems


def test_a_label_the_series_does_not_carry_is_reported(cluster, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.yml").write_text("groups:\n- name: g\n  rules:\n"
                                 "  - record: a\n    expr: sum(EmbeddingAnsweredImages{model_name=\"embedding\"})\n"
                                 "  - record: b\n    expr: sum(ts_inference_requests_total{ModelName=\"embedding\"})\n"
                                 "  - record: c\n"
                                 "    expr: sum(EmbeddingAnsweredImages{ModelVersion=\"1.0\", job=\"x\"})\n")
    assert prom.unproduced_selectors(cluster, rules) == [
        "r.yml a: EmbeddingAnsweredImages has no label model_name",
        "r.yml b: ts_inference_requests_total has no label ModelName"]


def test_produced_series_come_from_torchserves_metrics_config(cluster, tmp_path):
    series = prom.produced_series(cluster)
    assert series["ts_inference_requests_total"] == {"model_name", "model_version", "hostname"}
    assert series["PredictionTime"] == {"ModelName", "Level", "Hostname"}  # model metric: + Hostname
    assert series["EmbeddingAnsweredImages"] == {"ModelName", "Level", "ModelVersion", "Hostname"}
    assert series[f"{REQUEST_SECONDS}_bucket"] == {"model_name", "model_version", "code", "le"}
    config = tmp_path / "metrics.yaml"
    config.write_text("ts_metrics:\n  histogram:\n    - name: Lat\n      unit: ms\n      dimensions: [a]\n"
                      "model_metrics:\n  counter:\n    - name: Mine\n      unit: count\n      dimensions: [b]\n")
    custom = prom.produced_series({**cluster, "metrics_config": str(config), "model_metrics_auto_detect": "false"})
    assert custom["Lat_bucket"] == {"a", "le"} and custom["Lat_count"] == {"a"} and custom["Mine"] == {"b", "Hostname"}
    assert "ts_inference_requests_total" not in custom and "EmbeddingAnsweredImages" not in custom
    assert REQUEST_SECONDS + "_bucket" not in prom.produced_series({k: v for k, v in cluster.items()
                                                                    if k != GATEWAY_METRICS_KEY})


@pytest.mark.parametrize("expr, expected", [
    ('sum by (job, instance) (rate(a_total{model_name="m", code=~"2.."}[5m])) / b:rec:rate5m / 1e6',
     [("a_total", {"model_name", "code"}), ("b:rec:rate5m", set())]),
    ('histogram_quantile(0.99, sum by (le, job) (rate(h_bucket{x!="on(y)"}[5m])))', [("h_bucket", {"x"})]),
    ("x > on (job, instance) group_left (model) clamp_min(10 * y, 0.05) and z offset 5m unless w",
     [("x", set()), ("y", set()), ("z", set()), ("w", set())]),
    ("max without (Level) (g) or sum(h) by (job) or vector(1) > bool 0.5 and Inf",
     [("g", set()), ("h", set())]),
    ("changes(WorkerLoadTime{job=~\"embedding.*\"}[15m]) > 0", [("WorkerLoadTime", {"job"})]),
])
def test_rule_selectors_reads_promql(expr, expected):
    assert [(name, set(labels)) for name, labels in prom.rule_selectors(expr)] == expected


def test_rule_selectors_refuses_a_selector_without_a_name():
    with pytest.raises(ValueError, match="without a metric name"):
        prom.rule_selectors('rate({__name__="x"}[5m])')


# ------------------------------------------------------------------------- the cluster's config.properties
def test_cluster_config_carries_the_server_properties_and_keeps_torchserve_on_loopback(cluster):
    local = properties()
    assert {key: cluster[key] for key in SERVER_PROPERTIES} == {key: local[key] for key in SERVER_PROPERTIES}
    assert cluster["model_metrics_auto_detect"] == "true" and cluster["metrics_mode"] == "prometheus"
    assert cluster["metrics_address"].startswith("http://127.0.0.1:")
    assert cluster[GATEWAY_METRICS_KEY] == "http://0.0.0.0:8082"


def test_cluster_config_refuses_a_base_config_without_a_server_property(tmp_path):
    props = read_properties(REPO / "config.properties")
    del props["model_metrics_auto_detect"]
    write_properties(props, tmp_path / "config.properties")
    with pytest.raises(KServeError, match="missing model_metrics_auto_detect"):
        runtime_properties("embedding", "1.0", base_config=tmp_path / "config.properties")


# -------------------------------------------------------------------------------- handler: version label
def test_batch_metrics_carry_the_model_version(caplog):
    import ts
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    from handler.service import BatchTimings
    from handler.ts_metrics import DIMENSIONS, METRIC_NAMES, record_metrics

    cache = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    cache.initialize_cache()
    cache.set_request_ids({0: "r0"})
    cache.model_name = "embedding"
    timings = BatchTimings(preprocess=0.001, embed=0.002, search=0.0005, top1=[0.3, 0.5], unknown=1, rejected=1)
    with caplog.at_level(logging.INFO):
        record_metrics(cache, 2, timings, "embedding", "2.5")
    # one record per batch, one metric per line (the frontend reads the worker's stdout line by line)
    lines = [line for r in caplog.records for line in r.getMessage().split("\n")
             if line.startswith("[METRICS]Embedding")]
    assert {line.split("[METRICS]")[1].split(".")[0] for line in lines} == set(METRIC_NAMES)
    assert DIMENSIONS == ("ModelName", "Level", "ModelVersion")
    for line in lines:
        assert "|#ModelName:embedding,Level:Model,ModelVersion:2.5|" in line, line


# --------------------------------------------------------------------------- TorchServe's environment
def test_torchserve_starts_without_the_images_code_on_pythonpath(tmp_path):
    app = tmp_path / "opt" / "app"
    app.mkdir(parents=True)
    other = tmp_path / "libs"
    env = {"PYTHONPATH": f"{app}:{other}::{tmp_path / 'opt' / '.' / 'app'}", "OMP_NUM_THREADS": "1"}
    info = {"TS_FRONTEND_CONSOLE_LEVEL": "info"}  # the pod's log carries the frontend's lifecycle lines
    assert torchserve_environment(env, app) == {"PYTHONPATH": str(other), "OMP_NUM_THREADS": "1", **info}
    assert torchserve_environment({"PYTHONPATH": str(app), "HOME": "/h"}, app) == {"HOME": "/h", **info}
    assert torchserve_environment({"HOME": "/h", "TS_FRONTEND_CONSOLE_LEVEL": "warn"}, app) == \
        {"HOME": "/h", "TS_FRONTEND_CONSOLE_LEVEL": "warn"}
    assert env["PYTHONPATH"].startswith(str(app))  # the gateway's own environment is left alone


# ------------------------------------------------------------------------------ the gateway's histogram
@pytest.mark.parametrize("path, target", [
    ("/v1/models/embedding:predict", ("embedding", None)),
    ("/v2/models/embedding/infer", ("embedding", None)),
    ("/v2/models/embedding/versions/2.0/infer", ("embedding", "2.0")),
    ("/predictions/embedding", ("embedding", None)),
    ("/predictions/embedding/2.0", ("embedding", "2.0")),
    ("/v2/health/ready", None), ("/v1/models/embedding", None), ("/metrics", None),
])
def test_inference_paths(path, target):
    assert inference_target(path) == target


def _config(tmp_path: Path, cluster: dict[str, str], metrics_port: int, upstream_port: int) -> Path:
    props = {**cluster, GATEWAY_METRICS_KEY: f"http://127.0.0.1:{metrics_port}",
             "metrics_address": f"http://127.0.0.1:{upstream_port}"}
    write_properties(props, tmp_path / "config.properties")
    return tmp_path / "config.properties"


def test_gateway_metrics_from_config(tmp_path, cluster):
    metrics = GatewayMetrics.from_config(_config(tmp_path, cluster, 9999, 9998), "embedding")
    assert (metrics.host, metrics.port, metrics.versions, metrics.default_version) == (
        "127.0.0.1", 9999, ("1.0",), "1.0")
    assert metrics.torchserve_metrics == "http://127.0.0.1:9998/metrics"
    assert metrics.labels_for("/predictions/embedding") == ("embedding", "1.0")
    assert metrics.labels_for("/predictions/embedding/9.9") is None  # unknown versions add no series
    assert metrics.labels_for("/predictions/other") is None
    write_properties({k: v for k, v in cluster.items() if k != GATEWAY_METRICS_KEY}, tmp_path / "old.properties")
    assert GatewayMetrics.from_config(tmp_path / "old.properties", "embedding") is None
    with pytest.raises(ValueError, match="needs a port other than"):
        GatewayMetrics.from_config(_config(tmp_path, cluster, 9999, 9999), "embedding")


def test_gateway_serves_its_histogram_with_torchserves_page(tmp_path, cluster):
    """A real aiohttp app with the metrics installed, a stand-in for TorchServe's metrics page on loopback."""
    from serving.server import free_ports

    metrics_port, upstream_port, app_port = free_ports(3)
    metrics = GatewayMetrics.from_config(_config(tmp_path, cluster, metrics_port, upstream_port), "embedding")
    upstream_text = "# TYPE ts_inference_requests_total counter\nts_inference_requests_total{model_name=\"e\"} 3.0\n"

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.03)
        return web.json_response({}, status=200 if request.match_info["model"] == "embedding" else 404)

    async def serve_page(_: web.Request) -> web.Response:
        return web.Response(text=upstream_text)

    async def run() -> tuple[int, str, int]:
        from aiohttp import ClientSession

        upstream = web.Application()
        upstream.add_routes([web.get("/metrics", serve_page)])
        upstream_runner = web.AppRunner(upstream)
        await upstream_runner.setup()
        app = web.Application()
        app.add_routes([web.post("/predictions/{model}", slow), web.post("/predictions/{model}/{version}", slow)])
        metrics.install(app)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", app_port).start()
        try:
            async with ClientSession() as session:
                for path in ("/predictions/embedding", "/predictions/embedding", "/predictions/embedding/1.0",
                             "/predictions/other", "/predictions/embedding/7.7"):
                    async with session.post(f"http://127.0.0.1:{app_port}{path}") as response:
                        await response.read()
                async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                    down = response.status  # TorchServe's metrics not up yet
                await web.TCPSite(upstream_runner, "127.0.0.1", upstream_port).start()
                async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                    return down, await response.text(), response.status
        finally:
            await runner.cleanup()
            await upstream_runner.cleanup()

    down, page, status = asyncio.run(run())
    assert down == 503 and status == 200
    assert page.endswith(upstream_text)
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(page) if family.name == REQUEST_SECONDS
               for sample in family.samples}
    labels = (("code", "200"), ("model_name", "embedding"), ("model_version", "1.0"))
    assert {(name, dict(key).get("model_version"), dict(key).get("code")) for name, key in samples} == {
        (f"{REQUEST_SECONDS}_{part}", "1.0", "200") for part in ("bucket", "count", "sum")}
    assert samples[(f"{REQUEST_SECONDS}_count", labels)] == 3
    assert 0.09 <= samples[(f"{REQUEST_SECONDS}_sum", labels)] < 3
    buckets = {dict(key)["le"]: value for (name, key), value in samples.items() if name.endswith("_bucket")}
    assert len(buckets) == len(BUCKETS) + 1 and buckets["0.025"] == 0 and buckets["+Inf"] == 3


@pytest.mark.parametrize("expr", ['count(x) without (a', 'x{a="b"'])
def test_rule_selectors_refuses_unbalanced_expressions(expr):
    with pytest.raises(ValueError, match="unbalanced"):
        prom.rule_selectors(expr)
