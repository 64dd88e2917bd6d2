"""Operations: the shipped Prometheus config and rules (promtool), the drift baseline from training to
/metrics, ``python -m client drift``, and an end-to-end run: real TorchServe, real Prometheus, real alerts.

Set EMBEDDING_PROMETHEUS_PLOT=docs/prometheus-e2e.png to have the end-to-end test draw its run (README).
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml
from support.imagegen import png_bytes
from support.kserve_compose import KSERVE_CONTAINER
from serving.samples import user_digit_png
from PIL import Image, ImageDraw

from client import EmbeddingClient
from client.__main__ import main as client_main
from serving import prometheus as prom
from serving import prometheus_rules
from settings import REPO
from serving.server import free_ports

PROMTOOL = shutil.which("promtool")
SCRIPT = REPO / "scripts" / "prometheus.sh"
RULES = prom.PROMETHEUS_DIR / "rules"
UNIT_TESTS = prom.PROMETHEUS_DIR / "tests" / "alerts_test.yml"
ALERTS = {rule["alert"] for group in yaml.safe_load((RULES / "alerts.yml").read_text())["groups"]
          for rule in group["rules"] if "alert" in rule}

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: scripts/system-deps.sh installs it")


def promtool(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------------------------------- static checks
@pytest.mark.prometheus
@needs_promtool
def test_shipped_config_and_rules_pass_promtool():
    checked = promtool("check", "config", prom.CONFIG)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 rule files found" in checked.stdout
    rules = promtool("check", "rules", RULES / "recording.yml", RULES / "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr


@pytest.mark.prometheus
@needs_promtool
def test_alert_unit_tests_pass_and_cover_every_alert():
    result = promtool("test", "rules", UNIT_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {case["alertname"] for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    assert tested == ALERTS
    # every alert has a case where it fires and one where it stays quiet (an empty list or other instances)
    for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        cases = test["alert_rule_test"]
        fired = {c["alertname"] for c in cases if c["exp_alerts"]}
        assert fired, cases
        instances = {s["series"].split('instance="')[1].split('"')[0] for s in test["input_series"]}
        expected = {a["exp_labels"].get("instance") for c in cases for a in c["exp_alerts"]}  # absent(): none
        assert instances - expected, f"no quiet instance in the test of {fired}"


@pytest.mark.prometheus
@needs_promtool
@pytest.mark.parametrize("rules, mutation", [
    ("alerts.yml", ("embedding:error_ratio:rate5m > 0.05", "embedding:error_ratio:rate5m > 0.5")),
    # a target that is down counted as missing (or the other way round)
    ("alerts.yml", ('absent(up{job=~"embedding.*"})', 'up{job=~"embedding.*"} == 0')),
    ("alerts.yml", ("clamp_min(10 * embedding:baseline_unknown_rate, 0.05)", "0.05")),
    ("alerts.yml", ("> on (job, instance) embedding:baseline_top1_distance:p90", "> 0.3")),
    ("recording.yml", ("changes(WorkerLoadTime", "resets(WorkerLoadTime")),
    # a deliberate server restart counted as a worker restart
    ("recording.yml", ("- on (job, instance) group_left embedding:server_restarts:15m", "")),
    ("recording.yml", ("resets(Requests2XX", "changes(Requests2XX")),
    ("alerts.yml", ("and on (job, instance) embedding:requests:rate5m > 0", "and on (job, instance) embedding:requests:rate5m >= 0")),
    ("alerts.yml", ("embedding:answered:increase5m >= 50", "embedding:answered:increase5m >= 0")),
    ("alerts.yml", ("unless on (job, instance)\n", "or on (job, instance)\n")),
    ("alerts.yml", ("embedding:request_seconds:p99_5m > 0.025", "embedding:request_seconds:p99_5m > 0.25")),
    # the batch client's 64-image requests judged as if each were one image
    ("alerts.yml", (" and on (job, instance) embedding:images_per_request:rate5m < 1.5", "")),
    ("recording.yml", ("/ embedding:images:rate5m / 1e6", "/ embedding:requests:rate5m / 1e6")),
    ("recording.yml", ('/ clamp_min(max by (job, instance) (EmbeddingBatchSize{ModelName="embedding"}) / 8, 1)', "")),
])
def test_alert_unit_tests_catch_a_broken_rule(tmp_path, rules, mutation):
    """The promtool tests are not vacuous: each of these rule changes makes them fail."""
    copy = tmp_path / "prometheus"
    shutil.copytree(prom.PROMETHEUS_DIR, copy)
    text = (copy / "rules" / rules).read_text()
    assert mutation[0] in text
    (copy / "rules" / rules).write_text(text.replace(mutation[0], mutation[1]))
    assert promtool("test", "rules", copy / "tests" / "alerts_test.yml").returncode != 0


@pytest.mark.prometheus
@needs_promtool
def test_the_rules_rendered_for_another_model_fire_on_its_series_and_not_on_embeddings(tmp_path):
    """python -m serving.prometheus_rules: the rules for model digits_v2 pass the promtool unit tests rendered for
    that model (every alert fires on its series and stays quiet on the neighbours), and the shipped rules do not."""
    copy = tmp_path / "prometheus"
    (copy / "tests").mkdir(parents=True)
    assert prometheus_rules.main(["--model-name", "digits_v2", "--out", str(copy / "rules")]) == 0
    tests = prometheus_rules.for_model(UNIT_TESTS.read_text(), "digits_v2")
    assert 'model_name="digits_v2"' in tests and "inferenceservice digits-v2;" in tests
    (copy / "tests" / "alerts_test.yml").write_text(tests)
    checked = promtool("check", "rules", copy / "rules" / "recording.yml", copy / "rules" / "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = promtool("test", "rules", copy / "tests" / "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    shutil.rmtree(copy / "rules")
    shutil.copytree(RULES, copy / "rules")
    assert promtool("test", "rules", copy / "tests" / "alerts_test.yml").returncode != 0


def test_the_batch_rule_judges_per_batch_of_the_served_batch_size():
    """The latency rule's "per 8 images" is model-config.yaml's batchSize: single images batched up to it are
    judged by the batch's time, as before."""
    from settings import MODEL_CONFIG_FILE

    batch = yaml.safe_load(MODEL_CONFIG_FILE.read_text())["batchSize"]
    text = (RULES / "recording.yml").read_text()
    assert f'(EmbeddingBatchSize{{ModelName="embedding"}}) / {batch}, 1)' in text
    assert f"embedding:batch_seconds_per_{batch}_images:p99_5m" in (RULES / "alerts.yml").read_text()


@pytest.mark.prometheus
@needs_promtool
def test_alert_unit_tests_catch_a_latency_record_that_counts_refusals(tmp_path):
    """The request p99 is of successful answers: counting slow 4xx refusals makes the promtool tests fail."""
    copy = tmp_path / "prometheus"
    shutil.copytree(prom.PROMETHEUS_DIR, copy)
    text = (copy / "rules" / "recording.yml").read_text()
    assert text.count('code=~"2.."') == 2
    (copy / "rules" / "recording.yml").write_text(text.replace('code=~"2.."', 'code=~".*"'))
    assert promtool("test", "rules", copy / "tests" / "alerts_test.yml").returncode != 0


ISVC_PODS = "-l serving.kserve.io/inferenceservice=embedding"


def test_every_alert_says_what_to_do_locally_and_on_kserve():
    """runbook_local: the local server's commands and logs; runbook_kserve: kubectl against the predictor."""
    rules = [rule for group in yaml.safe_load((RULES / "alerts.yml").read_text())["groups"]
             for rule in group["rules"] if "alert" in rule]
    assert {rule["alert"] for rule in rules} == ALERTS
    policy_name = yaml.safe_load((REPO / "deploy" / "kserve" / "networkpolicy.yaml").read_text())["metadata"]["name"]
    for rule in rules:
        local, kserve = rule["annotations"].get("runbook_local", ""), rule["annotations"].get("runbook_kserve", "")
        assert local and kserve, rule["alert"]
        assert "kubectl" not in local and ("python -m" in local or "logs/" in local), (rule["alert"], local)
        assert kserve.startswith("kubectl -n $NS "), (rule["alert"], kserve)
        assert ISVC_PODS in kserve or "inferenceservice embedding" in kserve, (rule["alert"], kserve)
        assert "{{" not in local + kserve  # static text: nothing for the template engine to get wrong
        # The objects it names are the ones the manifests and KServe make.
        for name in re.findall(r"get networkpolicy (\S+)", kserve):
            assert name == policy_name, (rule["alert"], name)
        assert set(re.findall(r" -c (\S+)", kserve)) <= {KSERVE_CONTAINER}, (rule["alert"], kserve)


@pytest.mark.prometheus
@needs_promtool
def test_fast_variant_is_derived_from_the_shipped_files(tmp_path):
    config = prom.render_variant(tmp_path, ["127.0.0.1:1234"], window_factor=0.05, for_duration="2s")
    result = promtool("check", "config", config)
    assert result.returncode == 0, result.stdout + result.stderr
    shipped = yaml.safe_load(prom.CONFIG.read_text())
    variant = yaml.safe_load(config.read_text())
    assert variant["global"]["scrape_interval"] == "1s" and shipped["global"]["scrape_interval"] == "15s"
    assert variant["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:1234"]
    alerts = yaml.safe_load((tmp_path / "rules" / "alerts.yml").read_text())["groups"][0]["rules"]
    assert {rule["alert"] for rule in alerts} == ALERTS
    assert all(rule.get("for", "2s") == "2s" for rule in alerts)
    recording = (tmp_path / "rules" / "recording.yml").read_text()
    assert "[15s]" in recording and "[5m]" not in recording
    assert prom.scale_ranges("rate(x[10m]) + changes(y[15m])", 0.05) == "rate(x[30s]) + changes(y[45s])"


def test_kubernetes_scraping_targets_the_predictor_metrics_port():
    """No schema is stored for Service/ServiceMonitor: check what ties them to the deployment instead."""
    from pipeline.kserve_deploy import METRICS_PORT

    kube = prom.PROMETHEUS_DIR / "kubernetes"
    service, monitor = yaml.safe_load_all((kube / "servicemonitor.yaml").read_text())
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    policy = yaml.safe_load((REPO / "deploy" / "kserve" / "networkpolicy.yaml").read_text())
    assert service["spec"]["selector"] == policy["spec"]["podSelector"]["matchLabels"]
    port = service["spec"]["ports"][0]
    assert port["port"] == port["targetPort"] == METRICS_PORT
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == port["name"]
    assert re.fullmatch(r"embedding.*", service["metadata"]["name"])  # the job label the alerts match
    annotations = yaml.safe_load((kube / "pod-annotations.patch.yaml").read_text())["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                           "prometheus.io/path": "/metrics"}
    assert 'job=~"embedding.*"' in (RULES / "alerts.yml").read_text()


def test_drift_thresholds_of_the_client_match_the_alerts():
    from client import drift

    text = (RULES / "alerts.yml").read_text()
    assert f"clamp_min({drift.UNKNOWN_FACTOR} * embedding:baseline_unknown_rate, {drift.UNKNOWN_FLOOR})" in text
    assert f"embedding:answered:increase5m >= {drift.MIN_IMAGES}" in text
    assert "> on (job, instance) embedding:baseline_top1_distance:p90" in text


# ------------------------------------------------------------------------------------ baseline, unit level
def test_training_records_the_drift_baseline(tiny_artifacts):
    from training.evaluate import drift_baseline

    meta = json.loads((tiny_artifacts / "metadata.json").read_text())
    base = meta["drift_baseline"]
    dist = base["top1_distance"]
    assert base["n"] == meta["dataset"]["test"] and base["split"] == "test"
    assert 0 < dist["p50"] <= dist["p90"] <= dist["p99"]
    assert dist["p99"] <= meta["open_set"]["threshold"] < dist["p99"] * 10
    # the threshold accepts 99.5% of the same held-out distances: about 0.5% unknown
    assert 0 < base["unknown_rate"] <= 0.01
    synthetic = drift_baseline(np.arange(1, 101) / 100, threshold=0.9)
    assert synthetic["unknown_rate"] == pytest.approx(0.10)
    assert synthetic["top1_distance"]["p50"] == pytest.approx(0.505)
    assert synthetic["top1_distance"]["mean"] == pytest.approx(0.505)


def test_baseline_metrics_are_gauges_labelled_like_batch_metrics_even_outside_a_batch(tiny_artifacts, caplog):
    """At initialize TorchServe's cache has no request ids; the gauges must still carry ModelName/Level=Model
    and the model's version."""
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    import ts
    from handler.ts_metrics import BASELINE_METRICS, baseline_values, record_baseline

    meta = json.loads((tiny_artifacts / "metadata.json").read_text())
    values = baseline_values(meta["drift_baseline"])
    assert set(values) == set(BASELINE_METRICS)
    assert baseline_values(None) == {}
    broken = {**meta["drift_baseline"], "top1_distance": "broken"}
    assert baseline_values(broken) == {}
    cache = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    cache.initialize_cache()
    cache.set_request_ids(None)
    with caplog.at_level(logging.INFO):
        record_baseline(cache, "embedding", "1.0", values)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[METRICS]EmbeddingBaseline")]
    assert len(lines) == len(values)
    for line in lines:
        assert "ModelName:embedding,Level:Model,ModelVersion:1.0" in line and "#type:GAUGE" in line


# ----------------------------------------------------------------------------- client drift, unit level
class _Page(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_page():
    """A local HTTP server answering /metrics with whatever text the test sets."""
    handler = type("Page", (_Page,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def serve(text: str) -> str:
        handler.body = text.encode()
        return f"http://127.0.0.1:{server.server_port}"

    yield serve
    server.shutdown()
    server.server_close()


def page(answered: float, unknown: float, dist_sum: float, baseline: bool = True, model: str = "embedding") -> str:
    labels = f'{{ModelName="{model}",Level="Model",Hostname="h",}}'
    lines = ["# TYPE ts_inference_requests_total counter",
             'ts_inference_requests_total{model_name="embedding",model_version="default",hostname="h",} 5.0',
             f"EmbeddingAnsweredImages{labels} {answered}", f"EmbeddingUnknownAnswers{labels} {unknown}",
             f"EmbeddingTop1DistanceSum{labels} {dist_sum}", f"EmbeddingTop1Distance{labels} 0.9"]
    if baseline:
        lines += [f"EmbeddingBaselineTop1DistanceMean{labels} 0.2", f"EmbeddingBaselineTop1DistanceP50{labels} 0.18",
                  f"EmbeddingBaselineTop1DistanceP90{labels} 0.3", f"EmbeddingBaselineTop1DistanceP99{labels} 0.45",
                  f"EmbeddingBaselineUnknownRate{labels} 0.005"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("body, code, needle", [
    (page(1000, 5, 210), 0, "verdict: ok"),
    (page(1000, 120, 210), 10, "unknown ratio             0.120      0.005  DRIFT (> 0.050)"),
    (page(1000, 5, 350), 10, "DRIFT (> baseline p90 0.300)"),
    (page(1000, 5, 210, model="other"), 11, None),
    (page(1000, 5, 210, baseline=False), 11, None),
    (page(49, 0, 10), 12, None),
])
def test_client_drift_verdicts_and_exit_codes(metrics_page, capsys, body, code, needle):
    url = metrics_page(body)
    assert client_main(["drift", "--url", url]) == code
    out, err = capsys.readouterr()
    if needle:
        assert needle in out, out
    if code in (11, 12):
        assert out == "" and len(err.strip().splitlines()) == 1, err
        assert ("drift-baseline" if code == 11 else "fewer than the 50") in err


def test_client_drift_unreachable_and_wrong_endpoint(metrics_page, capsys):
    port = free_ports(1)[0]
    assert client_main(["drift", "--url", f"http://127.0.0.1:{port}"]) == 7
    assert client_main(["drift", "--prometheus", f"http://127.0.0.1:{port}"]) == 7
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("cannot reach" in line for line in err)
    url = metrics_page("<html>not prometheus</html>")
    assert client_main(["drift", "--prometheus", url]) == 1


def test_client_drift_interval_judges_only_new_traffic(monkeypatch):
    from client import drift

    pages = iter([page(10000, 9000, 5000), page(10100, 9000, 5020)])
    monkeypatch.setattr(drift, "_open", lambda url, timeout, shown=None: next(pages).encode())
    live, baseline, span = drift.from_metrics("http://127.0.0.1:1", "embedding", 1.0, interval=5, sleep=lambda s: None)
    report = drift.judge(live, baseline, "x", span)
    assert report.answered == 100 and report.unknown_ratio == 0 and report.top1_mean == pytest.approx(0.2)
    assert not report.drifted and span == "last 5 s"


# --------------------------------------------------------------------------------------------- end to end
def non_digits(n: int, seed: int = 0) -> list[bytes]:
    """Images that are not digits: noise, checkerboards, filled shapes, rings, words in Pillow's default font."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:64, :64]
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            img = (rng.random((64, 64)) * 255).astype(np.uint8)
        elif kind == 1:
            step = int(rng.integers(4, 12))
            img = ((np.indices((64, 64)).sum(0) // step) % 2 * 255).astype(np.uint8)
        elif kind == 2:
            a, b = sorted(rng.integers(8, 56, 2))
            img = np.zeros((64, 64), np.uint8)
            img[a:b + 4, int(rng.integers(4, 20)):int(rng.integers(44, 60))] = 255
        elif kind == 3:
            r = np.hypot(yy - rng.uniform(24, 40), xx - rng.uniform(24, 40))
            img = (((r < rng.uniform(20, 28)) & (r > rng.uniform(8, 16))) * 255).astype(np.uint8)
        else:
            canvas = Image.new("L", (96, 32), 255)
            word = "".join(chr(int(c)) for c in rng.integers(65, 91, 4))
            ImageDraw.Draw(canvas).text((6, 10), word, fill=0)
            img = np.asarray(canvas)
        out.append(png_bytes(img))
    return out


def _send(instance, images: list[bytes], seconds: float, stop: threading.Event | None = None) -> int:
    """Send the images round-robin with 4 threads for `seconds` (or until `stop`); returns how many were sent."""
    token = instance.keys()["inference"]
    deadline = time.monotonic() + seconds
    stop = stop or threading.Event()
    counter = iter(range(10 ** 9))
    lock = threading.Lock()

    def worker() -> int:
        done = 0
        with EmbeddingClient(instance.endpoints.inference, token=token) as client:
            while time.monotonic() < deadline and not stop.is_set():
                with lock:
                    i = next(counter)
                client.predict(images[i % len(images)])
                done += 1
        return done

    with ThreadPoolExecutor(4) as pool:
        return sum(pool.map(lambda _: worker(), range(4)))


def _wait(predicate, timeout: float, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


@pytest.fixture(scope="module")
def e2e_instance(tmp_path_factory, model_store):
    """A private TorchServe for this module alone: no traffic from other tests in its counters."""
    from support.torchserve import running_instance

    with running_instance(tmp_path_factory.mktemp("ts-prometheus"), model_store) as instance:
        yield instance


@pytest.fixture(scope="module")
def prometheus_server(tmp_path_factory, e2e_instance):
    """The shipped config's fast variant (1 s scrapes and evaluations, 15 s windows, for: 2 s) started by
    scripts/prometheus.sh on a free loopback port, scraping the private TorchServe."""
    if PROMTOOL is None:
        pytest.skip("prometheus missing: scripts/system-deps.sh installs it")
    work = tmp_path_factory.mktemp("prometheus")
    metrics = e2e_instance.endpoints.metrics.split("//", 1)[1]
    config = prom.render_variant(work / "config", [metrics])
    port = free_ports(1)[0]
    run = ["bash", str(SCRIPT)]
    started = subprocess.run([*run, "start", "--dir", str(work / "run"), "--port", str(port), "--config", str(config)],
                             capture_output=True, text=True, timeout=90)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip().splitlines()[-1]
    assert url == f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        stopped = subprocess.run([*run, "stop", "--dir", str(work / "run")], capture_output=True, text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr


@pytest.mark.serving
@pytest.mark.prometheus
def test_drift_alerts_fire_on_non_digits_and_stay_quiet_on_digits(e2e_instance, prometheus_server, prepared_sample,
                                                                  capsys):
    url = prometheus_server
    t0 = time.time()
    up = _wait(lambda: prom.api(url, "query", query='up{job="embedding-torchserve"} == 1')["result"], 30)
    assert up, prom.api(url, "targets")
    # the served model's baseline reaches Prometheus before any traffic (emitted at load)
    baseline = _wait(lambda: prom.api(url, "query", query="embedding:baseline_top1_distance:p90")["result"], 30)
    assert baseline, "no baseline record"

    digits = [user_digit_png(x) for x in prepared_sample.test_images[:300]]
    sent = _send(e2e_instance, digits, seconds=10)
    assert sent >= 100
    time.sleep(3)  # scrape + rule evaluation + for: 2s
    after_digits = prom.alerts(url)
    t_digits = time.time()
    for name in ("EmbeddingUnknownRatioDrift", "EmbeddingTop1DistanceDrift", "EmbeddingHighErrorRatio"):
        assert name not in after_digits, after_digits
    assert client_main(["drift", "--prometheus", url, "--window", "15s"]) == 0
    assert "verdict: ok" in capsys.readouterr().out

    shapes = non_digits(200)
    firing: dict[str, float] = {}
    wanted = {"EmbeddingUnknownRatioDrift", "EmbeddingTop1DistanceDrift"}
    stop = threading.Event()
    burst_started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(_send, e2e_instance, shapes, 90, stop)
        while time.monotonic() - burst_started < 60 and not wanted <= set(firing):
            for name, state in prom.alerts(url).items():
                if state == "firing" and name not in firing:
                    firing[name] = time.monotonic() - burst_started
            time.sleep(0.5)
        states = prom.alerts(url)
        drift_code = client_main(["drift", "--prometheus", url, "--window", "15s"])
        drift_out = capsys.readouterr().out
        time.sleep(3)  # a little more of the firing state for the plot
        stop.set()
        assert load.result() > 0
    t_end = time.time()
    print(f"time to firing after the non-digit burst began: {firing}", file=sys.stderr)
    assert wanted <= set(firing), (firing, states)
    assert max(firing[name] for name in wanted) < 45
    assert "EmbeddingHighErrorRatio" not in states and "EmbeddingNoSuccessfulAnswers" not in states, states
    assert drift_code == 10 and "verdict: DRIFT" in drift_out, drift_out
    # /metrics directly: since start, digits and non-digits mixed, the verdict is drift too
    assert client_main(["drift", "--url", e2e_instance.endpoints.metrics]) == 10

    plot = os.environ.get("EMBEDDING_PROMETHEUS_PLOT")
    if plot:
        prom.plot_run(url, t0, t_end, Path(plot), phases=[(t0, t_digits, "digits"), (t_digits, t_end, "non-digits")],
                      firing={name: t_digits + secs for name, secs in firing.items()})


@pytest.mark.serving
@pytest.mark.prometheus
def test_old_artifacts_without_baseline_still_serve_and_drift_says_so(tmp_path, tiny_artifacts, capsys):
    from serving.server import private_instance

    from serving.archive import build_mar
    from serving.server import start, stop

    old = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, old)
    meta = json.loads((old / "metadata.json").read_text())
    del meta["drift_baseline"]
    (old / "metadata.json").write_text(json.dumps(meta))
    store = tmp_path / "store"
    store.mkdir()
    build_mar(old, store)
    instance = private_instance(tmp_path / "ts")
    try:
        start(instance, store, timeout=120)
        with EmbeddingClient(instance.endpoints.inference, token=instance.keys()["inference"]) as client:
            answer = client.predict(non_digits(1)[0])
        assert "pred" in answer
        time.sleep(1)  # the batch's metrics reach the frontend through the worker's log
        assert client_main(["drift", "--url", instance.endpoints.metrics]) == 11
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and "no drift-baseline metrics" in err
        assert "EmbeddingAnsweredImages" in _scrape(instance) and "EmbeddingBaseline" not in _scrape(instance)
    finally:
        stop(instance)


def _scrape(instance) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{instance.endpoints.metrics}/metrics", timeout=10) as response:
        return response.read().decode()
