"""Canary rollouts through the Kubernetes stand-in, whose serverless traffic follows KServe's and Knative's source
(support.kserve_traffic): a new version takes its share, is watched, then promoted or taken back; the stable revision
keeps the rest throughout, and a candidate that is taken back never gets more than its share, not even while KServe
makes the old spec's revision again. The signals' PromQL is evaluated by the real Prometheus engine (promtool)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from support import istio_authz
from support.http import send_json
from support.k8s_standin import KubernetesStandin
from support.rollout import archive, cluster, pvc, record  # noqa: F401 - fixtures
from support.rollout import deploy_version

from pipeline.kserve_deploy import Canary, KServeError, candidate, canary
from pipeline.kserve_deploy.canary import MIN_REQUESTS, Signals, judge, queries
from pipeline.networkpolicy import authorization_policy

NS, NAME = "models", "embedding"
#: The predictor's pods as KServe labels them, in a namespace with Istio sidecars.
PREDICTOR_POD = istio_authz.Workload(NS, {"serving.kserve.io/inferenceservice": NAME, "component": "predictor"})
GOOD = Signals(requests=400, errors=0, p99_s=0.030, answered=400, unknown=8)


class Sampler:
    """Reads the route's split every few milliseconds while a rollout runs."""

    def __init__(self, standin: KubernetesStandin) -> None:
        self.standin, self.seen, self._stop = standin, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen.append(self.standin.serving(NS, NAME))
            time.sleep(0.003)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def most(self, revision: str) -> int:
        return max(split.get(revision, 0) for split in self.seen)


def signals_by_version(monkeypatch, table: dict[str, Signals], seen: list | None = None, standin=None) -> None:
    def read(url, model, version, window_s):
        if seen is not None:
            seen.append((version, standin.serving(NS, NAME)))
        return table[version]
    monkeypatch.setattr(canary, "read_signals", read)


def with_canary(percent: int = 20, prometheus: str = "http://prometheus.monitoring:9090", window_s: float = 0.3):
    return {"canary": Canary(percent, window_s, prometheus)}


def test_a_good_canary_takes_its_share_for_the_window_then_all_traffic(cluster, archive, pvc, monkeypatch):
    deploy_version(archive, "1.0", 0.9)
    seen: list = []
    signals_by_version(monkeypatch, {"1.0": GOOD, "2.0": GOOD}, seen, cluster)
    result = deploy_version(archive, "2.0", 0.91, **with_canary(20))
    # the verdict came after the window, with the split KServe makes: 20% tag latest, 80% tag prev
    assert [version for version, _ in seen] == ["2.0", "1.0"]
    assert seen[0][1] == {f"{NAME}-predictor-00001": 80, f"{NAME}-predictor-00002": 20}
    assert cluster.serving(NS, NAME) == {f"{NAME}-predictor-00002": 100}
    assert cluster.served_storage_uri(NS, NAME) == "pvc://models/embedding/2.0"
    assert "20% for 0 s" in result.rollout and "400 requests, 0.0% 5xx, 2.0% unknown, p99 30 ms" in result.rollout
    assert record(cluster)["current"]["mnist-embedding/model-version"] == "2.0"
    status = cluster.isvc(NS, NAME)["status"]["components"]["predictor"]
    assert (status["latestRolledoutRevision"], status["previousRolledoutRevision"]) == (
        f"{NAME}-predictor-00002", f"{NAME}-predictor-00001")
    # one revision for the candidate: the promotion changed the traffic, not the template
    assert len(cluster.revisions[(NS, NAME)]) == 2


@pytest.mark.parametrize("bad, why", [
    (Signals(400, 12, 0.030, 388, 8), "3.0% of its answers were 5xx"),
    (Signals(400, 0, 0.030, 400, 60), "unknown for 15.0% of images"),
    (Signals(400, 0, 0.090, 400, 8), "its p99 was 90 ms"),
    (Signals(MIN_REQUESTS - 1, 0, 0.030, MIN_REQUESTS - 1, 0), "fewer than the 20 a verdict needs"),
])
def test_a_bad_canary_is_taken_back_and_never_gets_more_than_its_share(cluster, archive, pvc, monkeypatch, bad, why):
    cluster.ready_delay_s = 0.05  # so that the old spec's revision is made again while the sampler reads
    deploy_version(archive, "1.0", 0.9)
    time.sleep(0.06)
    signals_by_version(monkeypatch, {"1.0": GOOD, "2.0": bad})
    with Sampler(cluster) as sampler, pytest.raises(KServeError) as failed:
        deploy_version(archive, "2.0", 0.91, **with_canary(20))
    message = str(failed.value)
    assert "canary of version 2.0 not promoted" in message and why in message and "back on version 1.0" in message
    assert sampler.most(f"{NAME}-predictor-00002") == 20
    assert cluster.served_storage_uri(NS, NAME) == "pvc://models/embedding/1.0"
    served = cluster.serving(NS, NAME)
    assert list(served.values()) == [100]
    assert cluster.storage_of(NS, NAME, next(iter(served))) == "pvc://models/embedding/1.0"
    isvc = cluster.isvc(NS, NAME)
    assert "canaryTrafficPercent" not in isvc["spec"]["predictor"]
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "pvc://models/embedding/1.0"
    assert isvc["metadata"]["labels"]["app.kubernetes.io/version"] == "1.0"
    assert record(cluster)["current"]["mnist-embedding/model-version"] == "1.0"


def test_a_candidate_that_never_becomes_ready_gets_no_traffic(cluster, archive, pvc, monkeypatch):
    deploy_version(archive, "1.0", 0.9)
    signals_by_version(monkeypatch, {"1.0": GOOD, "2.0": GOOD})
    cluster.fail_revisions = "container exited: no such model"

    def only_the_candidate_fails() -> None:  # the old spec's revision, made again, starts
        while len(cluster.revisions[(NS, NAME)]) < 2:
            time.sleep(0.001)
        cluster.fail_revisions = ""

    threading.Thread(target=only_the_candidate_fails, daemon=True).start()
    with Sampler(cluster) as sampler, pytest.raises(KServeError) as failed:
        deploy_version(archive, "2.0", 0.91, **with_canary(20))
    assert "no such model" in str(failed.value) and "not promoted" in str(failed.value)
    assert sampler.most(f"{NAME}-predictor-00002") == 0
    assert cluster.storage_of(NS, NAME, next(iter(cluster.serving(NS, NAME)))) == "pvc://models/embedding/1.0"


def test_without_prometheus_it_is_judged_on_readiness_and_says_so(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    result = deploy_version(archive, "2.0", 0.91, **with_canary(10, prometheus=""))
    assert "on readiness alone" in result.rollout and "took 10%" in result.rollout
    assert cluster.serving(NS, NAME) == {f"{NAME}-predictor-00002": 100}


def test_a_prometheus_that_cannot_be_read_takes_the_canary_back(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    with pytest.raises(KServeError, match="cannot read the canary's signals from Prometheus at http://127.0.0.1:9"):
        deploy_version(archive, "2.0", 0.91, **with_canary(10, prometheus="http://127.0.0.1:9"))
    assert cluster.served_storage_uri(NS, NAME) == "pvc://models/embedding/1.0"


@pytest.mark.parametrize("mode", ["RawDeployment", "Standard"])
def test_raw_mode_and_a_first_deploy_roll_out_all_at_once(tmp_path, monkeypatch, archive, pvc, mode):
    from support.k8s_standin import write_kubeconfig

    from pipeline import kserve_deploy

    standin = KubernetesStandin(token="runner-token", mode=mode)
    standin.add_pvc("models", "models", ["ReadWriteMany"])
    with standin as url:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url, "runner-token")))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setattr(kserve_deploy.api, "NAMESPACE_FILE", tmp_path / "no-pod-namespace")
        first = deploy_version(archive, "1.0", 0.9, **with_canary(20))
        assert "no revision rolled out before" in first.rollout
        second = deploy_version(archive, "2.0", 0.9, **with_canary(20))
        assert "raw deployment mode" in second.rollout or "no revision rolled out before" in second.rollout
        assert standin.served_storage_uri(NS, NAME) == "pvc://models/embedding/2.0"


def test_the_same_model_again_is_not_a_canary(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    again = deploy_version(archive, "1.0", 0.9, **with_canary(20))
    assert "the same model" in again.rollout
    assert len(cluster.revisions[(NS, NAME)]) == 1


def test_judge_compares_the_candidate_with_the_stable_version():
    assert judge(GOOD, GOOD, 300) == []
    slow_stable = Signals(400, 0, 0.200, 400, 8)
    assert judge(Signals(400, 0, 0.250, 400, 8), slow_stable, 300) == []  # slower day, both slow: promote
    assert judge(Signals(400, 0, None, 400, 8), GOOD, 300) == ["it gave no successful answer in 300 s"]
    assert len(judge(Signals(400, 40, 0.3, 400, 200), GOOD, 300)) == 3


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: scripts/system-deps.sh installs it")
def test_the_signal_queries_read_what_the_gateway_and_handler_export(tmp_path):
    """Each PromQL of canary.queries, evaluated by promtool over series named and labelled as
    serving.gateway_metrics and the handler export them: candidate 2.0 answers 1 req/s, 5% of them 503, its
    2xx all in the (5 ms, 10 ms] bucket; 1.0's traffic beside it must not leak into 2.0's figures."""
    def series(version: str, per_min: int, errors_per_min: int, unknown_per_min: int) -> list[dict]:
        common = f'model_name="embedding",model_version="{version}"'
        ok = per_min - errors_per_min
        out = [{"series": f'embedding_request_duration_seconds_count{{{common},code="200"}}', "values": f"0+{ok}x20"},
               {"series": f'embedding_request_duration_seconds_count{{{common},code="503"}}',
                "values": f"0+{errors_per_min}x20"},
               {"series": f'EmbeddingAnsweredImages{{ModelName="embedding",Level="Model",ModelVersion="{version}",'
                          'Hostname="pod-a"}', "values": f"0+{ok}x20"},
               {"series": f'EmbeddingUnknownAnswers{{ModelName="embedding",Level="Model",ModelVersion="{version}",'
                          'Hostname="pod-a"}', "values": f"0+{unknown_per_min}x20"}]
        for le, share in (("0.005", 0), ("0.01", 1), ("0.025", 1), ("+Inf", 1)):
            out.append({"series": f'embedding_request_duration_seconds_bucket{{{common},code="200",le="{le}"}}',
                        "values": f"0+{ok * share}x20"})
        return out

    tests = []
    expected = {"requests": 300, "errors": 15, "p99_s": 0.00995, "answered": 285, "unknown": 30}
    for field, expr in queries("embedding", "2.0", 300).items():
        tests.append({"expr": expr, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": expected[field]}]})
    spec = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series("2.0", 60, 3, 6) + series("1.0", 600, 0, 0),
                       "promql_expr_test": tests}]}
    path = tmp_path / "canary_queries_test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


class CandidatePod:
    """The candidate's pods as its tag route reaches them: KServe v1 predict behind the key, answering with the model
    digest they loaded."""

    def __init__(self, digest: str, key: str, mesh: list[dict] | None = None) -> None:
        """`mesh`: the AuthorizationPolicies of a Kubeflow mesh whose sidecar in front of the pods decides first
        (support.istio_authz), for a call from a KFP pod through the cluster-local gateway."""
        self.digest, self.key, self.asked = digest, key, []
        pod = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                pod.asked.append((self.path, self.headers.get("X-API-Key")))
                if mesh is not None:
                    allowed, _ = istio_authz.decide(mesh, PREDICTOR_POD, istio_authz.Request(
                        self.path, "POST", 8012, istio_authz.LOCAL_GATEWAY, dict(self.headers)))
                    if not allowed:  # Envoy's answer: 403, text/plain
                        body = istio_authz.DENIED.encode()
                        self.send_response(403)
                        self.send_header("Content-Type", "text/plain")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                if self.headers.get("X-API-Key") != pod.key:
                    send_json(self, 401, {"error": "missing or wrong API key"})
                    return
                send_json(self, 200, {"predictions": [{"label": "7", "model_digest": pod.digest}]})

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def zip_archive(path: Path, metadata: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("metadata.json", metadata)
        mar.writestr("MAR-INF/MANIFEST.json", "{}")
    return path


@pytest.mark.parametrize("answers_with, key_stored, why, mesh", [
    ("the archive's", True, "", None),
    ("another", True, "it answered with model sha256:", None),
    ("the archive's", False, 'cannot read Secret models/mnist-embedding-api-key: 404', None),
    ("the archive's", True, "answered 403: RBAC: access denied (the pod's Istio sidecar refused it: apply "
     "deploy/kserve/authorizationpolicy.yaml", "kubeflow"),
    ("the archive's", True, "", "kubeflow + the shipped policy"),
])
def test_the_candidate_is_asked_through_its_own_route_for_the_model_it_loaded(cluster, pvc, tmp_path, monkeypatch,
                                                                              answers_with, key_stored, why, mesh):
    signals_by_version(monkeypatch, {"1.0": GOOD, "2.0": GOOD})
    old = zip_archive(tmp_path / "old.mar", b'{"model": "one"}')
    deploy_version(old, "1.0", 0.9)
    new = zip_archive(tmp_path / "embedding.mar", b'{"model": "two"}')
    digest = candidate.archive_digest(new)
    assert digest == "sha256:" + hashlib.sha256(b'{"model": "two"}').hexdigest()
    policies = None if mesh is None else istio_authz.kubeflow_mesh(NS, "user@example.com") + (
        [authorization_policy(NAME, NS)] if "shipped" in mesh else [])
    pod = CandidatePod(digest if answers_with == "the archive's" else candidate.archive_digest(old), "the-key",
                       policies)
    if key_stored:
        cluster.add_secret(NS, "mnist-embedding-api-key", {"api-key": "the-key"})
    routes = []
    monkeypatch.setattr(candidate, "in_cluster_url", lambda url, ns: routes.append((url, ns)) or pod.url)
    if not why:
        result = deploy_version(new, "2.0", 0.91, **with_canary(20))
        assert "its own route answered with the archive's model sha256:" in result.rollout
        assert routes == [(f"http://latest-{NAME}-predictor.{NS}.example.com", NS)]
        assert pod.asked == [(f"/v1/models/{NAME}:predict", "the-key")]
        assert cluster.serving(NS, NAME) == {f"{NAME}-predictor-00002": 100}
        return
    with pytest.raises(KServeError, match="not promoted") as failed:
        deploy_version(new, "2.0", 0.91, **with_canary(20))
    assert why in str(failed.value)
    assert cluster.served_storage_uri(NS, NAME) == "pvc://models/embedding/1.0"


def test_the_in_cluster_route_of_a_tag_is_its_knative_service():
    assert candidate.in_cluster_url("http://latest-embedding-predictor.models.example.com", "models") == (
        "http://latest-embedding-predictor.models.svc.cluster.local")
