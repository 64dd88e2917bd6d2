"""The cluster's serving path, on this machine: the model store published to S3 (moto's S3 server on loopback),
downloaded by KServe's own storage code as the storage initializer does, then served by each serving image
built by scripts/build-images.sh (TorchServe's, and the python runtime's without Java) with the command,
arguments, environment, port and probes read from its shipped ServingRuntime (deploy/kserve/servingruntime.yaml,
servingruntime-python.yaml) and the storage mounted read-only at /mnt/models.

The same tests run against both images. Every answer is checked against the offline answer of the same
artifacts; then TorchServe's Java process is killed inside its container, which must exit non-zero (so
Kubernetes restarts it), the python runtime's image must hold no Java at all, and a second container of each
must stop cleanly and quickly on SIGTERM. The container runs under the CPU and memory limits KServe
would give it (support.containers.predictor_limits) and the runtime's user id; the securityContext's
capability drop is not applied here.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import yaml
from support.containers import (build_images, engine_or_reason, for_runtime, http_get, post, predictor_limits,
                                start_predictor, wait_for_probe)
from support.imagegen import png_bytes
from support.k8s_standin import KubernetesStandin, write_kubeconfig
from support.kube_operator import OperatorAPI
from serving.gateway.drain import SHUTDOWN_DELAY_S
from serving.samples import user_digit_png
from support.s3server import client_env, files, kserve_download, s3_server

from client import BadImageError, EmbeddingClient
from handler.service import EmbeddingService
from pipeline.kserve_deploy import KServeTarget, deploy
from pipeline.kserve_deploy.candidate import answered_digest, archive_digest
from pipeline.manifests import quantity
from pipeline.networkpolicy import network_policy
from serving.runtimes import SERVING_RUNTIMES
from settings import REPO

ENGINE, WHY_NOT = engine_or_reason()
pytestmark = [pytest.mark.containers, pytest.mark.skipif(ENGINE is None, reason=WHY_NOT)]

KILL_JAVA = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv0 = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")[0]
    except OSError:
        continue
    if argv0.endswith(b"java"):
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
"""


RUNTIMES = tuple(SERVING_RUNTIMES)


@pytest.fixture(scope="module")
def images() -> dict:
    build_images(ENGINE, only="serving")
    return build_images(ENGINE, only="serving-python")


@pytest.fixture(scope="module")
def mnt_models(model_store, tmp_path_factory):
    """/mnt/models as the storage initializer leaves it: published to S3 by the deploy code, read back by
    kserve-storage with the environment KServe derives from the example S3 Secret."""
    out = tmp_path_factory.mktemp("mnt-models")
    with s3_server() as endpoint, pytest.MonkeyPatch.context() as patch:
        for key, value in client_env(endpoint).items():
            patch.setenv(key, value)
        import boto3

        boto3.session.Session().client("s3").create_bucket(Bucket="models")
        deployed = deploy(model_store / "embedding.mar", "embedding", "1.0",
                          KServeTarget(namespace="models", storage_uri="s3://models/embedding"), dry_run=True)
        uri = deployed.manifest["spec"]["predictor"]["model"]["storageUri"]
        download = kserve_download(uri, out, endpoint)
    assert download.returncode == 0, download.stderr[-2000:]
    assert files(out) == ["config/config.properties", "model-store/embedding.mar"]
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)  # the image runs as uid 10001
    return out, deployed.manifest


@pytest.fixture(scope="module", params=RUNTIMES)
def predictor(request, images, mnt_models):
    """The predictor container of one serving runtime (each test runs against both)."""
    container, url, key, spec = start_predictor(images, mnt_models, f"embedding-predictor-{uuid.uuid4().hex[:6]}",
                                                request.param)
    try:
        ready_s = wait_for_probe(url, spec["readinessProbe"], 180, container)
        print(f"{request.param} container start to ready: {ready_s:.1f} s")
        yield container, url, key, spec
    finally:
        container.remove()


@pytest.fixture(scope="module")
def offline(tiny_artifacts) -> EmbeddingService:
    return EmbeddingService.from_dir(tiny_artifacts)


@pytest.fixture(scope="module")
def canvases(prepared_sample) -> list[np.ndarray]:
    return [prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == d)[0])] for d in range(10)]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def expected(offline: EmbeddingService, images: list[bytes]) -> list[dict]:
    answers, _ = offline.answer(images)
    return [a if "error" in a else {**a, "model_version": "1.0"} for a in answers]


def close(got: list[dict], want: list[dict]) -> None:
    """Same labels, verdicts and neighbours; distances within 1e-4 (batch composition moves the last digits)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if "error" in w:
            assert g == w
            continue
        assert (g["pred"], g["unknown"], g["model_version"]) == (w["pred"], w["unknown"], w["model_version"])
        assert [n["label"] for n in g["neighbours"]] == [n["label"] for n in w["neighbours"]]
        assert abs(g["dist"] - w["dist"]) < 1e-4 and abs(g["confidence"] - w["confidence"]) < 1e-4


def typed(body: dict) -> list[dict]:
    """The typed v2 outputs (one row per image) as answers `close` compares."""
    out = {o["name"]: o["data"] for o in body["outputs"]}
    k = len(out["neighbour_labels"]) // len(out["label"])
    return [{"pred": p, "dist": d, "confidence": c, "unknown": u, "model_version": body["model_version"],
             "neighbours": [{"label": lab} for lab in out["neighbour_labels"][i * k:(i + 1) * k]]}
            for i, (p, d, c, u) in enumerate(zip(out["label"], out["distance"], out["confidence"], out["unknown"]))]


def test_probes_need_no_key_and_everything_else_does(predictor):
    container, url, key, spec = predictor
    for probe in ("readinessProbe", "livenessProbe"):
        status, body = http_get(url + spec[probe]["httpGet"]["path"])
        assert status == 200 and json.loads(body) in ({"ready": True}, {"live": True})
    for path in ("/v1/models/embedding", "/v2/models/embedding", "/v2", "/ping"):
        assert http_get(url + path)[0] == 401
        assert http_get(url + path, {"Authorization": "Bearer wrong"})[0] == 401
    assert post(f"{url}/v1/models/embedding:predict", {"instances": []}, None)[0] == 401
    status, body = http_get(url + "/v1/models/embedding", {"Authorization": f"Bearer {key}"})
    assert status == 200 and json.loads(body) == {"name": "embedding", "ready": True}
    status, body = http_get(url + "/v2/models/embedding", {"Authorization": f"Bearer {key}"})
    meta = json.loads(body)
    assert status == 200 and meta["name"] == "embedding" and meta["versions"] == ["1.0"]
    assert {i["datatype"] for i in meta["inputs"]} == {"BYTES", "FP32", "UINT8"}
    assert {"label", "distance", "unknown", "neighbour_labels"} <= {o["name"] for o in meta["outputs"]}
    assert http_get(url + "/v2/models/embedding/ready", {"Authorization": f"Bearer {key}"})[0] == 200
    assert http_get(url + "/v2/models/other/ready", {"Authorization": f"Bearer {key}"})[0] == 404


def test_v1_like_pytorch_serve_mnist_json(predictor, offline, canvases):
    """pytorch/serve's v1 mnist.json layout: instances with base64 "data" (and a "target" it ignores)."""
    _, url, key, _ = predictor
    pngs = [user_digit_png(c) for c in canvases]
    status, body = post(f"{url}/v1/models/embedding:predict",
                        {"instances": [{"data": b64(p), "target": d} for d, p in enumerate(pngs)]}, key)
    assert status == 200
    close(body["predictions"], expected(offline, pngs))


def test_v2_bytes_like_pytorch_serve_mnist_v2_bytes_json(predictor, offline, canvases):
    _, url, key, _ = predictor
    png = user_digit_png(canvases[0])
    request_id = str(uuid.uuid4())
    status, body = post(f"{url}/v2/models/embedding/infer", {"id": request_id, "inputs": [
        {"data": [b64(png)], "datatype": "BYTES", "name": str(uuid.uuid4()), "shape": [-1]}]}, key)
    assert status == 200 and body["id"] == request_id and body["model_name"] == "embedding"
    close(typed(body), expected(offline, [png]))


def test_v2_tensor_like_pytorch_serve_mnist_v2_tensor_json(predictor, offline, canvases):
    """A [1, 28, 28] FP32 tensor as ToTensor gives it answers as the PNG of the same image does."""
    _, url, key, _ = predictor
    for digit in (0, 7):
        tensor = (canvases[digit].astype(np.float32) / 255.0)[None].tolist()
        status, body = post(f"{url}/v2/models/embedding/infer", {"id": "t", "inputs": [
            {"name": "input-0", "shape": [1, 28, 28], "datatype": "FP32", "data": tensor}]}, key)
        assert status == 200
        close(typed(body), expected(offline, [png_bytes(canvases[digit])]))


def test_torchserve_route_and_the_client_protocols(predictor, offline, canvases):
    _, url, key, _ = predictor
    png = user_digit_png(canvases[4])
    # No Content-Type: urllib, like `curl --data-binary`, labels the bytes a urlencoded form.
    request = urllib.request.Request(f"{url}/predictions/embedding", data=png,
                                     headers={"Authorization": f"Bearer {key}"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        close([json.loads(response.read())], expected(offline, [png]))
    pngs = [user_digit_png(c) for c in canvases[:3]] + [b"not an image"]
    for protocol in ("v1", "v2"):
        with EmbeddingClient(url, protocol=protocol, token=key) as client:
            answers = client.predict_batch(pngs)
            assert isinstance(answers[3], BadImageError) and answers[3].status == 400
            close(answers[:3], expected(offline, pngs[:3]))


def test_hostile_requests_get_4xx_and_the_server_keeps_answering(predictor, offline, canvases):
    _, url, key, _ = predictor
    infer, predict = f"{url}/v2/models/embedding/infer", f"{url}/v1/models/embedding:predict"
    nan_image = [[float("nan")] * 28] * 28
    cases = [
        (predict, b"{not json", 400),
        (predict, {"instances": "x"}, 400),
        (predict, {"instances": [{"data": b64(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)}]}, 400),
        (infer, {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 28, 28], "data": [nan_image]}]}, 400),
        (infer, {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 28, 28], "data": [[[2.0] * 28] * 28]}]},
         400),
        (infer, {"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 9], "data": [0.0] * 81}]}, 400),
        (infer, {"inputs": [{"name": "x", "datatype": "INT8", "shape": [1, 784], "data": [0] * 784}]}, 400),
        (infer, {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, 784], "data": [256] * 784}]}, 400),
        (f"{url}/v2/models/nope/infer", {"inputs": []}, 404),
        (predict, b"x" * (9 * 1024 * 1024), 413),
    ]
    for target, body, want in cases:
        data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
        status, answer = post(target, data, key)
        assert status == want, (target, str(body)[:80], status, answer)
        assert isinstance(answer, dict) and ("error" in answer or "message" in answer)
    png = user_digit_png(canvases[9])
    status, body = post(predict, {"instances": [{"data": b64(png)}]}, key)
    assert status == 200
    close(body["predictions"], expected(offline, [png]))


#: The lines the runbooks grep for in `kubectl logs`, for each runtime: ready, the model loaded, its worker up.
STARTED_LINES = {"torchserve": ("READY: model embedding answers", "Model embedding loaded",
                                "MODEL_LOG - loaded embedding on cpu"),
                 "python": ("python runtime on 0.0.0.0:8080: 2 workers serving embedding", "listening on")}


def test_kubectl_logs_shows_readiness_model_loads_and_every_refusal(request, predictor, canvases):
    """The container's log (what `kubectl logs` shows) after a refused and a good request: the runbooks' lines."""
    container, url, key, _ = predictor
    predict = f"{url}/v1/models/embedding:predict"
    status, _ = post(predict, {"instances": [{"data": b64(b"\x89PNG\r\n\x1a\n" + b"do-not-log-me" * 8)}]}, key)
    assert status == 400
    assert post(predict, {"instances": [{"data": b64(user_digit_png(canvases[3]))}]}, key)[0] == 200
    started = STARTED_LINES[request.node.callspec.params["predictor"]]
    deadline = time.monotonic() + 20  # the READY line follows the readiness poll's next turn
    while not all(w in (log := container.logs()) for w in ("refused request ", *started)) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    lines = log.splitlines()
    for wanted in started:
        assert any(wanted in line for line in lines), (wanted, log[-3000:])
    assert any("refused request " in line and ": 400 " in line for line in lines), log[-3000:]
    assert "do-not-log-me" not in log and "batch=" not in log
    assert "can access any URL to load models" not in log  # allowed_urls: the model store only


def test_the_predictor_answers_a_burst_under_the_inference_services_limits(predictor, mnt_models, canvases):
    """The container runs with the CPU quota and memory limit KServe would give it (the InferenceService's over
    the runtime's), and 16 concurrent callers are all answered without an OOM kill."""
    container, url, key, spec = predictor
    _, manifest = mnt_models
    limits = predictor_limits(manifest, spec)
    assert container.limits() == {"cpus": quantity(limits["cpu"]), "memory": quantity(limits["memory"])}
    bodies = [{"instances": [{"data": b64(png_bytes(canvas))}]} for canvas in canvases]

    def call(i: int) -> int:
        return post(f"{url}/v1/models/embedding:predict", bodies[i % len(bodies)], key)[0]

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(call, range(320)))
    assert statuses == [200] * 320
    assert container.state()[0] == "running" and not container.oom_killed()
    answered, published = replica_digest(url, key, mnt_models[0])
    assert answered == published


def replica_digest(url: str, key: str, models_dir) -> tuple[str, str]:
    """(the model digest a replica answers with, the published archive's), as deploy's canary check reads both."""
    return (answered_digest(url, "embedding", key),
            archive_digest(models_dir / "model-store" / "embedding.mar") or "no metadata.json in the archive")


#: Alerts whose kserve runbook greps the pod's log, and whether the situation below (a refused request, a model that
#: came to answer, a model worker killed) produces what the grep looks for. The drift-baseline one needs artifacts
#: trained before the baseline existed, which this container does not serve.
RUNBOOK_GREPS = {"EmbeddingRejectedInputsHigh": True, "EmbeddingNoSuccessfulAnswers": True,
                 "EmbeddingWorkerRestarted": True, "EmbeddingHighErrorRatio": True,
                 "EmbeddingDriftBaselineMissing": False}
KILL_WORKER = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if any(a.endswith(b"model_service_worker.py") or a == b"serving.python_runtime.worker" for a in argv):
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
        break
"""


def runbook_greps() -> dict[str, list[str]]:
    """{alert: the patterns its kserve runbook pipes `kubectl logs` through grep with}."""
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "rules" / "alerts.yml").read_text())
    out: dict[str, list[str]] = {}
    for rule in (r for group in rules["groups"] for r in group["rules"] if "alert" in r):
        for step in rule["annotations"]["runbook_kserve"].split("; "):
            if " logs " in step and "| grep " in step:
                words = shlex.split(step.split("| grep ", 1)[1])
                out.setdefault(rule["alert"], []).append(next(w for w in words if not w.startswith("-")))
    return out


def test_each_runbook_grep_finds_its_line_in_the_pods_log(predictor, canvases):
    """What the alerts' runbooks tell an operator to grep for in `kubectl logs` is there, in the real container's
    log, after what the alert is about happened: a refused request, the model answering, a worker killed."""
    container, url, key, spec = predictor
    predict = f"{url}/v1/models/embedding:predict"
    assert post(predict, {"instances": [{"data": b64(b"not an image")}]}, key)[0] == 400
    assert container.exec_python(KILL_WORKER).strip(), "no model worker found"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the worker comes back (TorchServe's recovery, the python supervisor)
        time.sleep(1)
        if post(predict, {"instances": [{"data": b64(png_bytes(canvases[1]))}]}, key)[0] == 200:
            break
    wait_for_probe(url, spec["readinessProbe"], 120, container)
    log = container.logs()
    greps = runbook_greps()
    assert set(greps) == set(RUNBOOK_GREPS), "classify each runbook grep in RUNBOOK_GREPS"
    for alert, patterns in greps.items():
        for pattern in patterns:
            found = subprocess.run(["grep", "-E", pattern], input=log, capture_output=True, text=True).stdout
            assert bool(found) == RUNBOOK_GREPS[alert], (alert, pattern, log[-3000:])


def runbook_kubectl_steps() -> list[tuple[str, str]]:
    """[(alert, step)] for every step of a kserve runbook that starts with kubectl, its trailing (note) cut off."""
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "rules" / "alerts.yml").read_text())
    return [(rule["alert"], re.sub(r"\s+\([^()]*\)$", "", step))
            for rule in (r for group in rules["groups"] for r in group["rules"] if "alert" in r)
            for step in rule["annotations"]["runbook_kserve"].split("; ") if step.startswith("kubectl ")]


@pytest.fixture
def cluster(request, predictor, mnt_models, tmp_path):
    """The operator's view of this predictor (support.kube_operator): the InferenceService the pipeline writes for
    its runtime, made by KubernetesStandin's KServe, this container as its pod, the project's NetworkPolicy, metrics
    Service and ServiceMonitor; yields (api, pod, environment for kubectl, the manifest, the runtime)."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed (scripts/system-deps.sh installs Debian's kubernetes-client)"
    container, url, _, spec = predictor
    runtime = request.node.callspec.params["predictor"]
    manifest = for_runtime(mnt_models[1], runtime)
    standin = KubernetesStandin()
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    status, answer = standin.handle("POST", f"/apis/serving.kserve.io/v1beta1/namespaces/{namespace}/inferenceservices",
                                    {"authorization": f"Bearer {standin.token}"}, json.dumps(manifest).encode())
    assert status == 201, answer
    api = OperatorAPI(standin, namespace)
    api.apply(network_policy(inference_service=name))
    for doc in yaml.safe_load_all((REPO / "deploy" / "prometheus" / "kubernetes" / "servicemonitor.yaml").read_text()):
        api.apply(doc)
    with api as server:
        pod = api.add_pod(name, container, spec, url)
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "NS": namespace,
               "KUBECONFIG": str(write_kubeconfig(tmp_path / "kubeconfig", server, standin.token, namespace))}
        yield api, pod, env, manifest, runtime


def run_step(step: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", step], env=env, capture_output=True, text=True, timeout=60)


def test_every_runbook_kubectl_step_runs_and_shows_the_pod(cluster, predictor, mnt_models):
    """Each kubectl step of the alerts' kserve runbooks, as written, by the real kubectl against the operator's view
    of the cluster, after the pod's container was killed and restarted by the kubelet and a request was refused:
    what each step shows is checked against the pod (its name, readiness, restart and exit code, its limits, its
    log), the InferenceService the pipeline wrote, and the NetworkPolicy and ServiceMonitor the manifests make."""
    api, pod, env, manifest, runtime = cluster
    container, url, key, spec = predictor
    before = {line for line in container.logs().splitlines() if re.match(r"^\d{4}[-/]\d\d[-/]\d\d", line)}
    container.kill()
    deadline = time.monotonic() + 180
    while not (pod.restarts == 1 and pod.ready) and time.monotonic() < deadline and api.error is None:
        time.sleep(0.5)
    assert pod.restarts == 1 and pod.ready, (api.error, container.logs()[-3000:])
    assert post(f"{url}/v1/models/embedding:predict", {"instances": [{"data": b64(b"not an image")}]}, key)[0] == 400
    started = STARTED_LINES[runtime]
    deadline = time.monotonic() + 30  # the READY line follows the readiness poll's next turn
    while not all(w in container.logs(since=pod.started_at) for w in ("refused request ", *started)):
        assert time.monotonic() < deadline, container.logs()[-3000:]
        time.sleep(0.5)
    limits = predictor_limits(manifest, spec)
    whole_log = container.logs().splitlines()
    policy = network_policy(inference_service="embedding")
    monitoring = [{p["port"] for p in rule["ports"]} for rule in policy["spec"]["ingress"]
                  if {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
                  in rule.get("from", [])]
    ip = r"\d+\.\d+\.\d+\.\d+"
    checks = [
        (r"get inferenceservice \S+$", lambda out, step: re.search(
            rf"^embedding\s+{re.escape(api.standin.isvc('models', 'embedding')['status']['url'])}\s+True\s", out, re.M)),
        (r"get pods .* -o wide$", lambda out, step: re.search(
            rf"^{pod.name}\s+1/1\s+Running\s+1 \(\S+ ago\)\s+\S+\s+{ip}\s+{re.escape(socket.gethostname())}\s",
            out, re.M)),
        # The current container's log: its start-up lines, none of the killed one's (each line has its own time).
        (r"logs .* --tail=500$", lambda out, step: all(w in out for w in started)
         and not before & set(out.splitlines())),
        # All that happened is a restart and a refused request: a grep finds those, and every failure grep nothing.
        (r"logs .*\| grep ", lambda out, step: set(out.splitlines()) <= set(whole_log)
         and all("READY" in line or "refused request" in line for line in out.splitlines())
         and ("refused request" not in step or "refused request" in out)
         and ("READY" not in step or "READY" in out)),
        # The runbook's note: the monitoring namespace may reach the metrics port.
        (r"get networkpolicy \S+ -o yaml$", lambda out, step: any(
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in rule["from"]
            and {p["port"] for p in rule["ports"]} == monitoring[0] and 8082 in monitoring[0]
            for rule in yaml.safe_load(out)["spec"]["ingress"] if "from" in rule)),
        (r"get servicemonitors -A \| grep embedding$", lambda out, step: re.search(r"^models\s+embedding-metrics\s", out)),
        (r"top pods .* --containers$", lambda out, step: re.search(
            rf"^{pod.name}\s+kserve-container\s+\d+m\s+\d+Mi\s*$", out, re.M)),
        (r"describe pods .* grep -A4 Limits$", lambda out, step: re.search(
            rf"Limits:\n\s+cpu:\s+{limits['cpu']}\n\s+memory:\s+{limits['memory']}\n", out)),
        # The killed container's state, though Knative's FallbackToLogsOnError puts its log's tail in a Message.
        (r"describe pods .* grep -E 'Last State\|.*'$", lambda out, step: re.search(
            r"Last State:\s+Terminated\n\s+Reason:\s+Error\n\s+Exit Code:\s+137\n\s+Restart Count:\s+1\n", out)),
        (r"get events --sort-by=\.lastTimestamp \| tail -20$", lambda out, step: re.search(
            r"InferenceServiceReady\s+inferenceservice/embedding\s+InferenceService \[embedding\] is Ready", out)
         and re.search(rf"Normal\s+Started\s+pod/{pod.name}\s+Started container", out)),
        (r"-o jsonpath='\{\.spec\.predictor\.model\.storageUri\}'$",
         lambda out, step: out == manifest["spec"]["predictor"]["model"]["storageUri"]),
    ]
    ran = set()
    for alert, step in runbook_kubectl_steps():
        if "port-forward" in step:  # its stream protocol (SPDY or WebSocket) is not emulated: the pod lookup in it
            lookup = run_step(re.search(r"\$\((.*?)\)", step)[1], env)
            assert (lookup.stdout, lookup.stderr) == (f"pod/{pod.name}\n", ""), (alert, step, lookup)
            continue
        result = run_step(step, env)
        print(f"$ {step}\n{result.stdout}")
        assert result.stderr == "", (alert, step, result.stderr)
        check = [(pattern, test) for pattern, test in checks if re.search(pattern, step)]
        assert len(check) == 1, f"{alert}: say what this step must show: {step}"
        assert check[0][1](result.stdout, step), (alert, step, result.stdout[-3000:])
        ran.add(check[0][0])
    assert ran == {pattern for pattern, _ in checks}, "a check no runbook step uses"


@pytest.mark.parametrize("predictor", ["torchserve"], indirect=True)
def test_killing_torchserve_java_makes_the_container_exit_non_zero(predictor):
    container, url, _, spec = predictor
    assert container.exec_python(KILL_JAVA).strip(), "no java process found in the container"
    status, code, elapsed = container.wait_exit(30)
    assert status == "exited" and code != 0, f"still {status} after {elapsed:.1f} s:\n{container.logs()[-2000:]}"
    assert "exiting so the pod is restarted" in container.logs()
    print(f"container exited with {code} {elapsed:.1f} s after Java was killed")


@pytest.mark.parametrize("predictor", ["python"], indirect=True)
def test_the_python_runtime_image_has_no_java_and_is_smaller(predictor, images):
    """The python target of serving/Dockerfile: no JRE (nor nginx) in the image, fewer bytes than TorchServe's."""
    container, _, _, _ = predictor
    found = container.exec_python("import glob, shutil; print(shutil.which('java'), shutil.which('nginx'), "
                                  "glob.glob('/usr/lib/jvm/*'))").strip()
    assert found == "None None []", found
    sizes = {name: images[SERVING_RUNTIMES[name].image]["size_bytes"] for name in RUNTIMES}
    print("image sizes (MB): " + ", ".join(f"{name} {size / 1e6:.0f}" for name, size in sizes.items()))
    assert sizes["python"] < sizes["torchserve"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sigterm_stops_the_container_cleanly(images, mnt_models, runtime):
    container, url, key, spec = start_predictor(images, mnt_models, f"embedding-stop-{uuid.uuid4().hex[:6]}", runtime)
    try:
        wait_for_probe(url, spec["readinessProbe"], 180, container)
        # Another replica of the same storage (the module's predictor is one): the same model, by its digest.
        answered, published = replica_digest(url, key, mnt_models[0])
        assert answered == published
        seconds = container.stop(timeout_s=30)
        status, code = container.state()
        assert (status, code) == ("exited", 0), container.logs()[-2000:]
        # Well inside the pod's 30 s grace: the drain's delay, then TorchServe stopped, nothing lingered.
        assert seconds < 10 + SHUTDOWN_DELAY_S, f"took {seconds:.1f} s to stop"
    finally:
        container.remove()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_each_image_serves_the_int8_package_without_a_compiler(images, mnt_models, runtime, tiny_int8_artifacts,
                                                               canvases, tmp_path):
    """The default digit model is model.pt2, compiled code: each serving image, which has no C++ compiler and no
    torchao, loads it from the storage layout and answers what the int8 service answers in-process."""
    from pipeline.kserve_deploy import stage_layout
    from serving.archive import build_mar

    store = tmp_path / "store"
    store.mkdir()
    layout = tmp_path / "mnt-models"
    stage_layout(build_mar(tiny_int8_artifacts, store), "embedding", "1.0", layout)
    subprocess.run(["chmod", "-R", "a+rX", str(tmp_path)], check=True)  # the image runs as uid 10001
    container, url, key, spec = start_predictor(images, (layout, mnt_models[1]),
                                                f"embedding-int8-{uuid.uuid4().hex[:6]}", runtime)
    try:
        wait_for_probe(url, spec["readinessProbe"], 180, container)
        found = container.exec_python("import importlib.util, shutil; print([c for c in ('g++', 'gcc', 'cc', 'c++') "
                                      "if shutil.which(c)], importlib.util.find_spec('torchao'))").strip()
        assert found == "[] None", found
        pngs = [user_digit_png(c) for c in canvases]
        status, body = post(f"{url}/v1/models/embedding:predict", {"instances": [{"data": b64(p)} for p in pngs]}, key)
        assert status == 200, body
        close(body["predictions"], expected(EmbeddingService.from_dir(tiny_int8_artifacts), pngs))
    finally:
        container.remove()
