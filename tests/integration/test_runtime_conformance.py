"""The two serving runtimes held to one contract, as processes started from the KServe storage layout:
``python -m serving.kserve_runtime`` (TorchServe behind the KServe gateway) and ``python -m serving.python_runtime``
(the same .mar's handler core in the gateway's own worker processes).

- one contract, parametrised over the runtimes: refusals on one line, the probes open and everything else behind
  the key, metadata, bodies as KServe's and Triton's clients send them (JSON without a Content-Type, the binary
  tensor extension, compressed bodies), 4xx JSON refusals, the drain on SIGTERM;
- the same answers: the hostile corpus, KServe v1 / Open Inference v2 bodies and gRPC calls sent to both runtimes
  are answered byte for byte alike, KServe's and Triton's own clients read the same from both, and the series the
  alert rules read carry the same names and labels on both metrics ports;
- what one runtime has alone: TorchServe's configuration refused, the nginx front's contract; the python
  runtime's archives, versions and worker restarts.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import psutil
import pytest
from serving.samples import user_digit_png
from support.containers import http_get
from support.hostile import CASES, Assets, HostileRequest, build_corpus

from pipeline.kserve_deploy import stage_layout
from settings import GATEWAY_METRICS_KEY, REPO, read_properties, with_ports, write_properties
from serving.gateway.app import API_KEY_ENV
from serving.gateway.auth import REST_REFUSAL
from serving.kserve_runtime.cli import FRONTS
from serving.kserve_runtime.torchserve import Upstream
from serving.server import free_ports
from serving.ts_config import RuntimeConfigError

#: The runtimes, and the module each is started with.
MODULES = {"torchserve": "serving.kserve_runtime", "python": "serving.python_runtime"}
RUNTIMES = tuple(MODULES)


@pytest.fixture(scope="module")
def layout(model_store, tmp_path_factory) -> Path:
    """The storage initializer's /mnt/models, with TorchServe's ports moved to free ones on loopback."""
    out = tmp_path_factory.mktemp("mnt-models")
    stage_layout(model_store / "embedding.mar", "embedding", "1.0", out)
    config = out / "config" / "config.properties"
    props = with_ports(read_properties(config), *free_ports(5))  # gRPC too: another TorchServe may hold 7070
    props["model_store"] = str(out / "model-store")
    props[GATEWAY_METRICS_KEY] = f"http://127.0.0.1:{free_ports(1)[0]}"  # not the pod's fixed 8082
    write_properties(props, config)
    return out


def config_with(layout: Path, directory: Path, **changes: str) -> Path:
    """A copy of the layout's config.properties with `changes`, in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    write_properties({**read_properties(layout / "config" / "config.properties"), **changes},
                     directory / "config.properties")
    return directory / "config.properties"


def runtime(layout: Path, workdir: Path, port: int, key: str | None, *extra: str, log: Path | None = None,
            kind: str = "torchserve", config: Path | None = None) -> subprocess.Popen:
    """A runtime as the image runs it, on the layout (`config`: another config.properties). Its output (TorchServe's
    whole log included) goes to a pipe, or to `log`: a long-lived runtime must write to a file, or TorchServe blocks
    once nobody drains the pipe."""
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(workdir)})
    if key:
        env[API_KEY_ENV] = key
    config = config or layout / "config" / "config.properties"
    return subprocess.Popen([sys.executable, "-m", MODULES[kind], f"--model-store={layout}/model-store",
                             f"--ts-config={config}", f"--http-port={port}", *extra],
                            cwd=workdir, env=env, stdout=log.open("w") if log else subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if http_get(url + "/v2/health/ready", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        assert proc.poll() is None, log.read_text()[-3000:] if log else proc.stdout.read()
        assert time.monotonic() < deadline, f"not ready after {timeout_s} s"
        time.sleep(0.5)


def stop(proc: subprocess.Popen, timeout_s: float = 30) -> int | None:
    """SIGTERM, and the exit code; killed (None) when it does not exit within `timeout_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


@dataclass(frozen=True)
class Served:
    """A running runtime: its REST base URL, key, gRPC address and metrics page."""

    url: str
    key: str
    grpc: str
    metrics: str
    log: Path


@pytest.fixture(scope="module")
def runtimes(layout, tmp_path_factory) -> Iterator[dict[str, Served]]:
    """Both runtimes on the same layout at once (each its own ports and metrics port), for the tests below.

    One after the other: a runtime picks free ports of its own while it starts (the TorchServe runtime's gateway
    behind nginx), so the next one's ports are drawn only once the first holds all of its own (a CI run drew the
    same port for the python runtime's gRPC and the other's gateway)."""
    started: dict[str, tuple[Served, subprocess.Popen]] = {}
    try:
        for kind in RUNTIMES:
            workdir = tmp_path_factory.mktemp(f"runtime-{kind}")
            port, grpc, metrics = free_ports(3)
            config = config_with(layout, workdir / "config", **{GATEWAY_METRICS_KEY: f"http://127.0.0.1:{metrics}"})
            served = Served(f"http://127.0.0.1:{port}", f"{kind[0]}" * 32, f"127.0.0.1:{grpc}",
                            f"http://127.0.0.1:{metrics}/metrics", workdir / "runtime.log")
            started[kind] = served, runtime(layout, workdir, port, served.key, "--http-host=127.0.0.1",
                                            f"--grpc-port={grpc}", log=served.log, kind=kind, config=config)
            wait_ready(served.url, started[kind][1], 180, served.log)
        yield {kind: served for kind, (served, _) in started.items()}
    finally:
        for _, proc in started.values():
            stop(proc)


@pytest.fixture(params=RUNTIMES)
def gateway(request, runtimes) -> tuple[str, str]:
    """(url, key) of each runtime in turn: the tests using it run against both."""
    served = runtimes[request.param]
    return served.url, served.key


@pytest.mark.parametrize("kind", RUNTIMES)
def test_refuses_to_start_without_a_key(layout, tmp_path, kind):
    (port,) = free_ports(1)
    proc = runtime(layout, tmp_path, port, None, kind=kind)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out.strip().splitlines() == [f"{kind.replace('torchserve', 'kserve')}_runtime: {API_KEY_ENV} is not set: "
                                        "set it from a Secret, or pass --allow-unauthenticated when a mesh policy "
                                        "authenticates callers"]


@pytest.mark.parametrize("change, message", [
    ({"inference_address": "http://0.0.0.0:8085"}, "inference_address=http://0.0.0.0:8085 must be a loopback"),
    ({"model_snapshot": "{}"}, "model_snapshot must list the model"),
])
def test_config_the_gateway_cannot_front_is_refused(layout, tmp_path, change, message):
    props = {**read_properties(layout / "config" / "config.properties"), **change}
    write_properties(props, tmp_path / "config.properties")
    with pytest.raises(RuntimeConfigError, match=message):
        Upstream.from_config(tmp_path / "config.properties")
    with pytest.raises(RuntimeConfigError, match="is not in model_snapshot"):
        Upstream.from_config(layout / "config" / "config.properties", "other")


@pytest.mark.serving
@pytest.mark.parametrize("kind, extra", [*(("torchserve", (f"--front={front}",)) for front in FRONTS), ("python", ())])
def test_probes_are_open_and_the_rest_needs_the_key(layout, tmp_path, kind, extra):
    (port,) = free_ports(1)
    url, key = f"http://127.0.0.1:{port}", "k" * 32
    proc = runtime(layout, tmp_path, port, key, "--grpc-port=0", *extra, kind=kind)
    try:
        wait_ready(url, proc, 120)
        assert json.loads(http_get(url + "/v2/health/live")[1]) == {"live": True}
        assert http_get(url + "/")[0] == 401
        assert json.loads(http_get(url + "/", {"Authorization": f"Bearer {key}"})[1]) == {"status": "alive"}
        assert http_get(url + "/v2/models/embedding")[0] == 401
        status, body = http_get(url + "/v2/models/embedding/versions/1.0", {"Authorization": f"Bearer {key}"})
        assert status == 200 and json.loads(body)["versions"] == ["1.0"]
        assert http_get(url + "/v2/models/embedding/versions/9.9", {"Authorization": f"Bearer {key}"})[0] == 404
        assert http_get(url + "/nowhere", {"Authorization": f"Bearer {key}"})[0] == 404
        request = urllib.request.Request(f"{url}/v2/models/embedding/versions/1.0/infer", method="POST",
                                         data=json.dumps({"inputs": [{"name": "x", "datatype": "FP32",
                                                                      "shape": [784], "data": [0.0] * 784}]}).encode(),
                                         headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            outputs = {o["name"]: o["data"] for o in json.loads(response.read())["outputs"]}
        assert outputs["unknown"] == [True]  # a blank image is never a confident digit
        assert stop(proc) == 0
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def digits(prepared_sample) -> list[np.ndarray]:
    return [prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == d)[0])] for d in (2, 7)]


def send(url: str, path: str, key: str, data: bytes, headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    """POST exactly these bytes and headers (urllib adds no Content-Type when the caller gives one)."""
    request = urllib.request.Request(url + path, data=data, method="POST",
                                     headers={"Authorization": f"Bearer {key}", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def read_outputs(headers: dict[str, str], body: bytes) -> dict[str, np.ndarray]:
    """A v2 answer's outputs as numpy arrays, raw tensors after the JSON included (as the clients read them)."""
    length = int(headers.get("Inference-Header-Content-Length", len(body)))
    head, raw, offset = json.loads(body[:length]), body[length:], 0
    types = {"FP32": "<f4", "BOOL": "?", "INT64": "<i8"}
    out = {}
    for o in head["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:
            values = np.array(o["data"], dtype=object if o["datatype"] == "BYTES" else types[o["datatype"]])
        elif o["datatype"] == "BYTES":
            chunk, values, at = raw[offset:offset + size], [], 0
            while at < len(chunk):
                (n,) = struct.unpack_from("<I", chunk, at)
                values.append(chunk[at + 4:at + 4 + n].decode())
                at += 4 + n
            values = np.array(values, dtype=object)
        else:
            values = np.frombuffer(raw[offset:offset + size], dtype=types[o["datatype"]])
        offset += size or 0
        out[o["name"]] = values.reshape(o["shape"])
    assert offset == len(raw)
    return out


def test_v1_json_without_a_content_type_is_read_as_json(gateway, digits):
    """kserve's InferenceRESTClient posts its JSON with no Content-Type at all."""
    url, key = gateway
    png = user_digit_png(digits[1])
    body = json.dumps({"instances": [{"data": base64.b64encode(png).decode()}]}).encode()
    for headers in ({}, {"Content-Type": "application/octet-stream"}):
        connection = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)  # urllib would add a type
        connection.request("POST", "/v1/models/embedding:predict", body=body,
                           headers={"Authorization": f"Bearer {key}", **headers})
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["predictions"][0]["pred"] == "7"
        connection.close()
    status, headers, answer = send(url, "/v1/models/embedding:predict", key, png, {"Content-Type": "image/png"})
    assert status == 400 and headers["Content-Type"] == "application/json"
    # The handler's word where nginx sends v1 straight to TorchServe, else the gateway's
    assert any(text in json.loads(answer)["error"] for text in ("not valid JSON", "KServe v1 body is not JSON"))


def test_v2_binary_tensors_in_and_out_equal_the_json_answer(gateway, digits):
    url, key = gateway
    pixels = np.stack(digits).astype(np.float32) / 255.0
    infer = "/v2/models/embedding/infer"
    status, _, answer = send(url, infer, key, json.dumps({"inputs": [
        {"name": "p", "datatype": "FP32", "shape": [2, 1, 28, 28], "data": pixels.ravel().tolist()}]}).encode())
    assert status == 200
    want = read_outputs({}, answer)
    head = json.dumps({"inputs": [{"name": "p", "datatype": "FP32", "shape": [2, 784],
                                   "parameters": {"binary_data_size": pixels.nbytes}}],
                       "parameters": {"binary_data_output": True},
                       "outputs": [{"name": n} for n in want] + [{"name": "unknown",
                                                                  "parameters": {"binary_data": False}}]}).encode()
    status, headers, body = send(url, infer, key, head + pixels.tobytes(),
                                 {"Inference-Header-Content-Length": str(len(head)),
                                  "Content-Type": "application/octet-stream"})
    assert status == 200 and headers["Content-Type"] == "application/octet-stream"
    assert int(headers["Inference-Header-Content-Length"]) < len(body)
    got = read_outputs(headers, body)
    assert list(got["label"]) == list(want["label"]) == ["2", "7"]
    assert got["unknown"].tolist() == want["unknown"].tolist()
    np.testing.assert_allclose(got["neighbour_distances"], want["neighbour_distances"], atol=1e-6)
    np.testing.assert_allclose(got["distance"], want["distance"], atol=1e-6)
    unknown = next(o for o in json.loads(body[:int(headers["Inference-Header-Content-Length"])])["outputs"]
                   if o["name"] == "unknown")
    assert "data" in unknown  # asked for as JSON, the others raw

    images = [user_digit_png(d) for d in digits]
    raw = b"".join(struct.pack("<I", len(p)) + p for p in images)
    head = json.dumps({"inputs": [{"name": "i", "datatype": "BYTES", "shape": [2],
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    status, headers, body = send(url, infer, key, gzip.compress(head + raw),
                                 {"Inference-Header-Content-Length": str(len(head)), "Content-Encoding": "gzip"})
    assert status == 200 and list(read_outputs(headers, body)["label"]) == ["2", "7"]


def test_v2_metadata_declares_the_typed_outputs(gateway):
    url, key = gateway
    status, body = http_get(url + "/v2/models/embedding", {"Authorization": f"Bearer {key}"})
    meta = json.loads(body)
    assert status == 200
    assert {o["name"]: (o["datatype"], o["shape"]) for o in meta["outputs"]} == {
        "label": ("BYTES", [-1]), "distance": ("FP32", [-1]), "confidence": ("FP32", [-1]),
        "unknown": ("BOOL", [-1]), "reason": ("BYTES", [-1]), "nearest_label": ("BYTES", [-1]),
        "neighbour_labels": ("BYTES", [-1, -1]),
        "neighbour_distances": ("FP32", [-1, -1]), "embedding": ("FP32", [-1, -1]),
        "neighbour_ids": ("INT64", [-1, -1]), "error": ("BYTES", [-1])}
    assert {i["datatype"] for i in meta["inputs"]} == {"BYTES", "FP32", "UINT8"}


@pytest.mark.parametrize("data, headers, status, message", [
    (b'{"inputs": []}garbage', {"Inference-Header-Content-Length": "14"}, 400, "7 bytes after the JSON"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]}', {},
     400, "no Inference-Header-Content-Length"),
    (b"\x89PNG", {"Content-Type": "image/png"}, 400, "v2 body is not JSON"),
    (b"not gzip", {"Content-Encoding": "gzip"}, 400, "could not be read: Can not decode content-encoding: gzip"),
    (gzip.compress(b" " * (9 * 1024 * 1024)), {"Content-Encoding": "gzip"}, 413, "larger than 8388608 bytes"),
])
def test_bad_v2_bodies_are_a_4xx_with_a_json_message(gateway, digits, data, headers, status, message):
    url, key = gateway
    got, answer_headers, body = send(url, "/v2/models/embedding/infer", key, data, headers)
    assert got == status and answer_headers["Content-Type"] == "application/json"
    assert message in json.loads(body)["error"]
    good = json.dumps({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, 28, 28],
                                   "data": digits[0].ravel().tolist()}]}).encode()
    got, _, body = send(url, "/v2/models/embedding/infer", key, good)
    assert got == 200, body[:300]
    assert read_outputs({}, body)["label"].tolist() == ["2"]


def metric_counts(metrics_url: str) -> dict[tuple[str, str], float]:
    """(model_version, code) -> embedding_request_duration_seconds_count on the gateway's metrics port."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = http_get(metrics_url)
    assert status == 200, body[:300]
    counts = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "embedding_request_duration_seconds_count":
                assert sample.labels["model_name"] == "embedding"
                counts[(sample.labels["model_version"], sample.labels["code"])] = sample.value
    return counts


def live_group_members(group: int) -> list[int]:
    """Pids of the processes of process group `group` that are not zombies."""
    found = subprocess.run(["ps", "-e", "-o", "pid=,pgid=,stat="], capture_output=True, text=True, check=True)
    rows = (line.split() for line in found.stdout.splitlines())
    return [int(pid) for pid, pgid, stat in rows if int(pgid) == group and not stat.startswith("Z")]


def nginx_master(proc: subprocess.Popen) -> int:
    """The pid of the nginx master the runtime started."""
    children = subprocess.run(["pgrep", "-P", str(proc.pid), "-x", "nginx"], capture_output=True, text=True)
    pids = [int(p) for p in children.stdout.split()]
    assert len(pids) == 1, f"nginx masters under {proc.pid}: {pids}"
    return pids[0]


def check_drain(proc: subprocess.Popen, url: str, key: str, png: bytes, log: Path) -> None:
    """SIGTERM `proc` while a keep-alive connection is open: readiness turns 503, an answer during the delay closes
    its connection, then new requests get 503 (or find the listener closed), and the runtime exits 0."""
    port = urlsplit(url).port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "image/png"}
    connection.request("POST", "/predictions/embedding", png, headers)
    first = connection.getresponse()
    first.read()
    assert first.status == 200 and not first.will_close
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while http_get(url + "/v2/health/ready")[0] != 503:
        assert time.monotonic() < deadline, "readiness did not turn 503 after SIGTERM"
        time.sleep(0.05)
    connection.request("POST", "/predictions/embedding", png, headers)
    last = connection.getresponse()
    assert last.status == 200 and json.loads(last.read())["pred"] == "7"
    assert last.will_close, "an answer during the drain kept its connection open"
    connection.close()
    refused = None
    while refused is None and time.monotonic() < deadline:
        try:
            refused = send(url, "/predictions/embedding", key, png, {"Content-Type": "image/png"})[0]
            refused = refused if refused == 503 else None
        except urllib.error.URLError:  # the listener closed once nothing was in flight
            refused = "refused"
        time.sleep(0.1)
    assert refused in (503, "refused")
    assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]


@pytest.mark.serving
def test_nginx_front_keeps_the_gateways_contract(layout, tmp_path, digits):
    """Inference straight to TorchServe behind nginx keeps what the gateway gave: the key (same parsing), the
    request histogram the alerts read (no series for made-up models), JSON errors, and the drain: answers close
    their keep-alive connection from SIGTERM on, then new requests get 503, and the runtime exits 0."""
    port, metrics_port = free_ports(2)
    props = read_properties(layout / "config" / "config.properties")
    props["gateway_metrics_address"] = f"http://127.0.0.1:{metrics_port}"
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    write_properties(props, config_dir / "config.properties")
    url, key = f"http://127.0.0.1:{port}", "n" * 32
    log = tmp_path / "runtime.log"
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), API_KEY_ENV: key})
    proc = subprocess.Popen([sys.executable, "-m", "serving.kserve_runtime", f"--model-store={layout}/model-store",
                             f"--ts-config={config_dir}/config.properties", f"--http-port={port}",
                             "--http-host=127.0.0.1", "--grpc-port=0", "--front=nginx", "--shutdown-delay=2"],
                            cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    png = user_digit_png(digits[1])
    try:
        wait_ready(url, proc, 120, log)
        assert send(url, "/predictions/embedding", key, png, {"Content-Type": "image/png"})[0] == 200
        for scheme in ("bearer", "BEARER  "):  # the gateway's parsing: scheme case-insensitive, key stripped
            request = urllib.request.Request(url + "/predictions/embedding", data=png, method="POST",
                                             headers={"Authorization": f"{scheme} {key} ", "Content-Type": "image/png"})
            with urllib.request.urlopen(request, timeout=60) as response:
                assert json.loads(response.read())["pred"] == "7"
        for wrong in (key[:-1], key + "x", "", f"Basic {key}"):
            status, headers, body = send(url, "/predictions/embedding", wrong, png, {"Content-Type": "image/png"})
            assert status == 401 and headers["Content-Type"] == "application/json", (wrong, status)
            assert json.loads(body)["error"] == REST_REFUSAL
        # Behind Kubeflow's ingress the key comes in X-API-Key beside the caller's JWT: nginx's route to TorchServe
        # and the gateway's (a form label) read it first (serving/gateway/auth.py), wrong or right.
        for content_type in ("image/png", "application/x-www-form-urlencoded"):
            kubeflow = {"Authorization": "Bearer eyJ.kubeflow.jwt", "X-API-Key": key, "Content-Type": content_type}
            assert json.loads(send(url, "/predictions/embedding", key, png, kubeflow)[2])["pred"] == "7"
            assert send(url, "/predictions/embedding", key, png, {**kubeflow, "X-API-Key": "wrong"})[0] == 401
        # A form-labelled image (curl --data-binary) and a gzip v1 body go through the gateway and still work.
        assert json.loads(send(url, "/predictions/embedding", key, png,
                               {"Content-Type": "application/x-www-form-urlencoded"})[2])["pred"] == "7"
        v1 = json.dumps({"instances": [{"data": base64.b64encode(png).decode()}]}).encode()
        status, _, body = send(url, "/v1/models/embedding:predict", key, gzip.compress(v1),
                               {"Content-Encoding": "gzip", "Content-Type": "application/json"})
        assert status == 200 and json.loads(body)["predictions"][0]["pred"] == "7"
        status, headers, body = send(url, "/predictions/embedding", key, b"\0" * (9 * 1024 * 1024))
        assert status == 413 and json.loads(body)["error"] == "request body larger than 8388608 bytes"
        assert send(url, "/predictions/nothere", key, png)[0] == 404

        counts = metric_counts(f"http://127.0.0.1:{metrics_port}/metrics")
        assert counts[("1.0", "200")] >= 5 and counts[("1.0", "401")] == 4 + 2, counts  # the wrong keys above
        assert all(version == "1.0" for version, _ in counts), counts  # nothing for made-up names

        check_drain(proc, url, key, png, log)
        assert "nginx front on 127.0.0.1" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.serving
def test_nginx_dying_makes_the_runtime_exit_non_zero(layout, tmp_path):
    (port,) = free_ports(1)
    log = tmp_path / "runtime.log"
    proc = runtime(layout, tmp_path, port, "d" * 32, "--front=nginx", "--grpc-port=0", log=log)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, 120, log)
        master = nginx_master(proc)
        os.kill(master, signal.SIGKILL)
        assert proc.wait(timeout=40) != 0
        assert "nginx exited (code -9) without being asked to" in log.read_text()
        # Its worker, orphaned by the kill, was stopped too: nothing keeps the port. The runtime SIGKILLs the
        # group; the worker then exits and is reaped by whoever adopted it (PID 1 here, the runtime in the image),
        # which takes a moment: a zombie holds no socket, a live worker would hold the port for good.
        deadline = time.monotonic() + 10
        while (left := live_group_members(master)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left == [], f"processes of nginx's group still running: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("kind, extra", [("torchserve", ("--front=aiohttp",)), ("python", ())])
def test_sigterm_drains_the_gateway(layout, tmp_path, digits, kind, extra):
    """The gateway's drain in both runtimes (the nginx front keeps it itself, above)."""
    (port,) = free_ports(1)
    url, log = f"http://127.0.0.1:{port}", tmp_path / "runtime.log"
    proc = runtime(layout, tmp_path, port, "d" * 32, "--http-host=127.0.0.1", "--grpc-port=0", "--shutdown-delay=2",
                   *extra, log=log, kind=kind)
    try:
        wait_ready(url, proc, 120, log)
        check_drain(proc, url, "d" * 32, user_digit_png(digits[1]), log)
        assert "refusing new requests" in log.read_text()
    finally:
        stop(proc)


# --- the same answers from both runtimes ------------------------------------------------------------------------


def both(runtimes: dict[str, Served], path: str, body: bytes, headers: dict[str, str], method: str = "POST"
         ) -> dict[str, tuple[int, str | None, str | None, bytes]]:
    """{runtime: (status, Content-Type, Inference-Header-Content-Length, body)} for the same request to each, sent
    with http.client (which adds no Content-Type of its own, unlike urllib)."""
    answers = {}
    for kind, served in runtimes.items():
        connection = http.client.HTTPConnection(urlsplit(served.url).netloc, timeout=120)
        try:
            connection.request(method, path, body=body, headers={"Authorization": f"Bearer {served.key}", **headers})
            response = connection.getresponse()
            answers[kind] = (response.status, response.getheader("Content-Type"),
                             response.getheader("Inference-Header-Content-Length"), response.read())
        finally:
            connection.close()
    return answers


@pytest.fixture(scope="module")
def corpus(prepared_sample) -> dict[str, HostileRequest]:
    """The hostile corpus (tests/support/hostile.py) built from two real held-out digits, as its own tests build it."""
    seven = prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == 7)[0])]
    one = prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == 1)[0])]
    return {item.id: item for item in build_corpus(Assets(seven, one))}


@pytest.mark.parametrize("case", [case.id for case in CASES if not case.raw_socket])
def test_hostile_requests_are_answered_byte_for_byte_alike(runtimes, corpus, case):
    """Every request of the corpus, must-reject and must-accept, gets the same status and the same bytes."""
    item = corpus[case]
    got = both(runtimes, "/predictions/embedding", item.body, item.headers)
    assert got["python"] == got["torchserve"]
    assert got["python"][0] == item.status


@pytest.mark.parametrize("path", ["/predictions/embedding", "/predictions/embedding/1.0"])
def test_an_image_put_as_curl_T_sends_it_is_answered_as_a_post(runtimes, digits, path):
    """TorchServe's own docs send images with `curl -T` (PUT): both runtimes answer it as they answer a POST."""
    png = user_digit_png(digits[1])
    put = both(runtimes, path, png, {"Content-Type": "application/octet-stream"}, method="PUT")
    assert put == both(runtimes, path, png, {"Content-Type": "application/octet-stream"})
    assert put["python"] == put["torchserve"] and put["python"][0] == 200, put


def refusal_lines(served: Served) -> list[str]:
    return [line for line in served.log.read_text(errors="replace").splitlines() if "refused request " in line]


def test_each_refused_request_leaves_one_line_in_the_log_and_its_body_none(runtimes, digits):
    """`kubectl logs` shows every refusal with its reason, whoever refused it (the front's key check, the gateway's
    v2 codec, the handler), and never the request's bytes."""
    secret = b"\x89PNG\r\n\x1a\n" + b"do-not-log-me" * 8
    before = {kind: len(refusal_lines(served)) for kind, served in runtimes.items()}
    refused = [
        both(runtimes, "/predictions/embedding", secret, {"Content-Type": "application/octet-stream"}),
        both(runtimes, "/predictions/embedding", secret, {"Content-Type": "application/octet-stream",
                                                           "Authorization": "Bearer wrong"}),
        both(runtimes, "/v2/models/embedding/infer", b'{"inputs": 7}', {"Content-Type": "application/json"}),
        both(runtimes, "/v1/models/embedding:predict", json.dumps({"instances": [{"data": "not base64!"}]}).encode(),
             {"Content-Type": "application/json"}),
    ]
    assert all(answer[kind][0] in (400, 401) for answer in refused for kind in runtimes), refused
    assert both(runtimes, "/predictions/embedding", user_digit_png(digits[0]),
                {"Content-Type": "application/octet-stream"})["python"][0] == 200
    for kind, served in runtimes.items():
        deadline = time.monotonic() + 20  # TorchServe writes its workers' output asynchronously
        while len(refusal_lines(served)) < before[kind] + len(refused) and time.monotonic() < deadline:
            time.sleep(0.2)
        lines = refusal_lines(served)[before[kind]:]
        assert len(lines) == len(refused), (kind, lines)
        assert any(": 401 missing or wrong API key" in line for line in lines), (kind, lines)
        assert any(": 400 not an image Pillow can read" in line for line in lines), (kind, lines)
        assert "do-not-log-me" not in served.log.read_text(errors="replace")


def kserve_requests(pngs: list[bytes]) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """(path, body, headers) of KServe v1 / Open Inference v2 requests, good and bad, as clients send them."""
    b64 = [base64.b64encode(p).decode() for p in pngs]
    pixels = [np.frombuffer(p, np.uint8) for p in pngs]  # a tensor of the right size only by accident: refused
    v2 = "/v2/models/embedding/infer"
    image = {"name": "image", "datatype": "BYTES", "shape": [len(b64)], "data": b64}
    raw = b"".join(struct.pack("<I", len(p)) + p for p in pngs)
    binary_head = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [len(pngs)],
                                          "parameters": {"binary_data_size": len(raw)}}],
                              "parameters": {"binary_data_output": True}}).encode()
    cases = {
        "v1": ("/v1/models/embedding:predict", {"instances": [{"data": b} for b in b64]}),
        "v1-b64-bare-and-bad": ("/v1/models/embedding:predict",
                                {"instances": [{"b64": b64[0]}, b64[1], {"data": "not base64!"}]}),
        "v1-embedding": ("/v1/models/embedding:predict",
                         {"instances": [{"data": b64[0]}], "parameters": {"embedding": True}}),
        "v1-empty": ("/v1/models/embedding:predict", {"instances": []}),
        "v1-unknown-model": ("/v1/models/nothere:predict", {"instances": [{"data": b64[0]}]}),
        "v2-bytes": (v2, {"id": "r1", "inputs": [image]}),
        "v2-versioned": ("/v2/models/embedding/versions/1.0/infer", {"inputs": [image]}),
        "v2-json-format": (v2, {"inputs": [image], "parameters": {"output_format": "json"}}),
        "v2-outputs-and-embedding": (v2, {"inputs": [image], "outputs": [{"name": "embedding"}, {"name": "label"}]}),
        "v2-uint8-wrong-size": (v2, {"inputs": [{"name": "p", "datatype": "UINT8", "shape": [1, len(pixels[0])],
                                                 "data": pixels[0].tolist()}]}),
        "v2-fp64": (v2, {"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [0.5]}]}),
        "v2-unknown-model": ("/v2/models/nothere/infer", {"inputs": [image]}),
        "predictions-json-embedding": ("/predictions/embedding", {"data": b64[0], "embedding": True}),
        "predictions-unknown-version": ("/predictions/embedding/9.9", {"data": b64[0]}),
    }
    out = {name: (path, json.dumps(body).encode(), {"Content-Type": "application/json"})
           for name, (path, body) in cases.items()}
    out["v2-binary-in-and-out"] = (v2, binary_head + raw, {"Inference-Header-Content-Length": str(len(binary_head))})
    return out


KSERVE_CASES = tuple(kserve_requests([b"x", b"y"]))


@pytest.mark.parametrize("case", KSERVE_CASES)
def test_kserve_bodies_are_answered_byte_for_byte_alike(runtimes, digits, case):
    path, body, headers = kserve_requests([user_digit_png(d) for d in digits])[case]
    got = both(runtimes, path, body, headers)
    assert got["python"] == got["torchserve"]
    assert got["python"][0] in (200, 400, 404), got["python"]


def test_grpc_answers_are_byte_for_byte_alike(runtimes, digits):
    import grpc

    from serving.grpc_v2 import pb, pb_grpc

    pngs = [user_digit_png(d) for d in digits]
    raw = pb.ModelInferRequest(model_name="embedding", id="g1")
    raw.inputs.add(name="image", datatype="BYTES", shape=[len(pngs)])
    raw.raw_input_contents.append(b"".join(struct.pack("<I", len(p)) + p for p in pngs))
    typed = pb.ModelInferRequest(model_name="embedding", model_version="1.0")
    typed.inputs.add(name="p", datatype="UINT8", shape=[1, 28, 28]).contents.uint_contents.extend(
        digits[0].ravel().tolist())
    fp16 = pb.ModelInferRequest(model_name="embedding")
    fp16.inputs.add(name="x", datatype="FP16", shape=[1])
    answers = {}
    for kind, served in runtimes.items():
        with grpc.insecure_channel(served.grpc) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            metadata = (("authorization", f"Bearer {served.key}"),)
            replies = []
            for request in (raw, typed, fp16):
                try:
                    replies.append(stub.ModelInfer(request, metadata=metadata, timeout=60)
                                   .SerializeToString(deterministic=True))
                except grpc.RpcError as exc:
                    replies.append((exc.code(), exc.details()))
            answers[kind] = replies
    assert answers["python"] == answers["torchserve"]
    assert isinstance(answers["python"][0], bytes) and answers["python"][2][0] == grpc.StatusCode.INVALID_ARGUMENT


PROBES = Path(__file__).resolve().parents[1] / "support"


@pytest.mark.parametrize("client, probe", [("kserve-0.21", "client_probe.py"), ("tritonclient-2.73", "client_probe.py"),
                                           ("kserve-0.21", "grpc_probe.py")])
def test_kserve_and_triton_clients_read_the_same_from_both(runtimes, digits, tmp_path, client, probe):
    """KServe's and Triton's own clients (their own virtual environments), every way they send the digits."""
    from support.containers import client_pythons

    python = client_pythons(client)[client]
    given = tmp_path / "digits.json"
    given.write_text(json.dumps({"pngs": [base64.b64encode(user_digit_png(d)).decode() for d in digits],
                                 "pixels": [d.tolist() for d in digits]}))
    reports = {}
    for kind, served in runtimes.items():
        target = [served.grpc] if probe == "grpc_probe.py" else [client.split("-")[0].replace("client", ""),
                                                                  served.url]
        result = subprocess.run([python, "-I", str(PROBES / probe), *target, "embedding", served.key, str(given)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        reports[kind] = json.loads(result.stdout)
    assert reports["python"] == reports["torchserve"]
    checks = reports["python"]["checks"]
    assert all(v is True for k, v in checks.items() if k != "metadata outputs"), checks
    assert len(reports["python"]["cases"]) >= 2


def rule_series() -> set[str]:
    """The series the shipped recording and alerting rules select (recorded ones and Prometheus' `up` aside)."""
    from serving.prometheus import rule_documents, rule_selectors

    documents = rule_documents()
    recorded = {rule["record"] for rules in documents.values() for rule in rules if "record" in rule}
    return {name for rules in documents.values() for rule in rules for name, _ in rule_selectors(rule["expr"])
            if name not in recorded and name != "up"}


def page_series(metrics_url: str) -> dict[str, frozenset[str]]:
    """{series name: its label names} on a metrics page, as Prometheus stores them (prometheus_client's parser
    would rename a counter's samples)."""
    status, body = http_get(metrics_url)
    assert status == 200, body[:300]
    series: dict[str, frozenset[str]] = {}
    for line in body.decode().splitlines():
        match = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s", line)
        if match:
            labels = frozenset(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', match.group(2) or ""))
            series[match.group(1)] = series.get(match.group(1), frozenset()) | labels
    return series


def test_the_series_the_rules_read_have_the_same_names_and_labels(runtimes, digits):
    png = user_digit_png(digits[1])
    for served in runtimes.values():
        for path, body, headers, key in (("/predictions/embedding", png, {"Content-Type": "image/png"}, served.key),
                                         ("/predictions/embedding", b"\x89", {}, served.key),
                                         ("/predictions/embedding/9.9", png, {}, served.key),
                                         ("/predictions/embedding", png, {}, "wrong")):
            send(served.url, path, key, body, headers)
    wanted = rule_series()
    pages = {kind: {name: labels for name, labels in page_series(served.metrics).items() if name in wanted}
             for kind, served in runtimes.items()}
    common = pages["python"].keys() & pages["torchserve"].keys()
    assert {name: pages["python"][name] for name in common} == {name: pages["torchserve"][name] for name in common}
    # TorchServe's form decoder answers some hostile bodies 500 where the python runtime answers 400 (see above)
    assert set(pages["torchserve"]) - set(pages["python"]) <= {"Requests5XX"}
    assert {"ts_inference_requests_total", "EmbeddingAnsweredImages", "embedding_request_duration_seconds_bucket",
            "Requests2XX", "PredictionTime", "WorkerLoadTime"} <= set(pages["python"])


# --- the python runtime's own: archives, versions, workers ------------------------------------------------------


def python_runtime(workdir: Path, port: int, *args: str, log: Path) -> subprocess.Popen:
    """python -m serving.python_runtime with `args` (its archives given with --mar), key "p" * 32."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(workdir),
           API_KEY_ENV: "p" * 32}
    return subprocess.Popen([sys.executable, "-m", MODULES["python"], "--http-host=127.0.0.1", f"--http-port={port}",
                             "--grpc-port=0", *args], cwd=workdir, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, text=True)


def test_python_runtime_serves_each_archive_as_a_version(tiny_artifacts, layout, tmp_path, digits):
    """Two archives of one model (built by the same handler code: versions with different code are refused)."""
    from serving.archive import build_mar

    first, second = (build_mar(tiny_artifacts, tmp_path / version, version=version) for version in ("1.0", "2.0"))
    (port,) = free_ports(1)
    url, log = f"http://127.0.0.1:{port}", tmp_path / "runtime.log"
    proc = python_runtime(tmp_path, port, f"--mar={first}", f"--mar={second}",
                          f"--ts-config={layout / 'config' / 'config.properties'}", log=log)
    png, key = user_digit_png(digits[1]), "p" * 32
    try:
        wait_ready(url, proc, 120, log)
        for path, version in (("/predictions/embedding", "1.0"), ("/predictions/embedding/2.0", "2.0"),
                              ("/predictions/embedding/1.0", "1.0")):
            status, _, body = send(url, path, key, png, {"Content-Type": "image/png"})
            assert status == 200 and json.loads(body)["model_version"] == version, body
        status, body = http_get(url + "/v2/models/embedding", {"Authorization": f"Bearer {key}"})
        assert json.loads(body)["versions"] == ["1.0", "2.0"]
        status, _, body = send(url, "/predictions/embedding/3.0", key, png)
        assert status == 404 and json.loads(body)["type"] == "ModelVersionNotFoundException"
        assert stop(proc) == 0
    finally:
        stop(proc)


def test_python_runtime_starts_a_killed_worker_again(model_store, layout, tmp_path, digits):
    (port,) = free_ports(1)
    url, log = f"http://127.0.0.1:{port}", tmp_path / "runtime.log"
    proc = python_runtime(tmp_path, port, f"--mar={model_store / 'embedding.mar'}", "--workers=2",
                          f"--ts-config={layout / 'config' / 'config.properties'}", log=log)
    png, key = user_digit_png(digits[1]), "p" * 32
    try:
        wait_ready(url, proc, 120, log)
        deadline = time.monotonic() + 120
        while "[worker 1] READY" not in log.read_text() or "[worker 0] READY" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        workers = {child.cmdline()[-1]: child.pid for child in psutil.Process(proc.pid).children()}  # --index N
        assert set(workers) == {"0", "1"}, workers
        os.kill(workers["0"], signal.SIGKILL)
        while "worker 0 exited (code -9) without being asked to: starting it again" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        for _ in range(10):  # the other worker answers meanwhile; the new one joins once loaded
            assert send(url, "/predictions/embedding", key, png, {"Content-Type": "image/png"})[0] == 200
        while log.read_text().count("[worker 0] READY") < 2:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        assert stop(proc) == 0
    finally:
        stop(proc)


def test_python_runtime_refuses_tampered_artifacts_on_one_line(model_store, layout, tmp_path):
    import zipfile

    tampered = tmp_path / "embedding.mar"
    with zipfile.ZipFile(model_store / "embedding.mar") as source, zipfile.ZipFile(tampered, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, data[:-1] + bytes([data[-1] ^ 1]) if info.filename == "labels.json" else data)
    (port,) = free_ports(1)
    log = tmp_path / "runtime.log"
    proc = python_runtime(tmp_path, port, f"--mar={tampered}", "--workers=1",
                          f"--ts-config={layout / 'config' / 'config.properties'}", log=log)
    assert proc.wait(timeout=120) == 2
    refusals = [line for line in log.read_text().splitlines() if line.startswith("python_runtime: refusing")]
    assert len(refusals) == 1 and "labels.json" in refusals[0] and "SHA-256" in refusals[0], log.read_text()[-2000:]
