"""serving.kserve_runtime outside a container: refusals on one line, and the gateway with a real TorchServe
(probes without a key, everything else with it, metadata, SIGTERM; bodies as KServe's and Triton's clients
send them: JSON without a Content-Type, the binary tensor extension, compressed bodies)."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
from serving.samples import user_digit_png
from support.containers import http_get

from pipeline.kserve_deploy import stage_layout
from settings import REPO, read_properties, with_ports, write_properties
from serving.gateway.app import API_KEY_ENV
from serving.kserve_runtime.cli import FRONTS
from serving.kserve_runtime.torchserve import RuntimeConfigError, Upstream
from serving.server import free_ports


@pytest.fixture(scope="module")
def layout(model_store, tmp_path_factory) -> Path:
    """The storage initializer's /mnt/models, with TorchServe's ports moved to free ones on loopback."""
    out = tmp_path_factory.mktemp("mnt-models")
    stage_layout(model_store / "embedding.mar", "embedding", "1.0", out)
    config = out / "config" / "config.properties"
    props = with_ports(read_properties(config), *free_ports(5))  # gRPC too: another TorchServe may hold 7070
    props["model_store"] = str(out / "model-store")
    write_properties(props, config)
    return out


def runtime(layout: Path, workdir: Path, port: int, key: str | None, *extra: str, log: Path | None = None
            ) -> subprocess.Popen:
    """The gateway as the image runs it. Its output (TorchServe's whole log included) goes to a pipe, or to
    `log`: a long-lived gateway must write to a file, or TorchServe blocks once nobody drains the pipe."""
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(workdir)})
    if key:
        env[API_KEY_ENV] = key
    return subprocess.Popen([sys.executable, "-m", "serving.kserve_runtime", f"--model-store={layout}/model-store",
                             f"--ts-config={layout}/config/config.properties", f"--http-port={port}", *extra],
                            cwd=workdir, env=env, stdout=log.open("w") if log else subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_refuses_to_start_without_a_key(layout, tmp_path):
    (port,) = free_ports(1)
    proc = runtime(layout, tmp_path, port, None)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out.strip().splitlines() == [f"kserve_runtime: {API_KEY_ENV} is not set: set it from a Secret, or pass "
                                        "--allow-unauthenticated when a mesh policy authenticates callers"]


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
@pytest.mark.parametrize("front", FRONTS)
def test_gateway_in_front_of_a_real_torchserve(layout, tmp_path, front):
    (port,) = free_ports(1)
    url, key = f"http://127.0.0.1:{port}", "k" * 32
    proc = runtime(layout, tmp_path, port, key, f"--front={front}")
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
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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


@pytest.fixture(scope="module")
def gateway(layout, tmp_path_factory):
    """One gateway with its TorchServe for the protocol tests below: (url, key)."""
    (port,) = free_ports(1)
    url, key = f"http://127.0.0.1:{port}", "g" * 32
    workdir = tmp_path_factory.mktemp("gateway")
    proc = runtime(layout, workdir, port, key, log=workdir / "gateway.log")
    try:
        wait_ready(url, proc, 120, workdir / "gateway.log")
        yield url, key
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
    assert "not valid JSON" in json.loads(answer)["error"]  # the handler's word: nginx sends v1 straight on


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
            assert "bearer key" in json.loads(body)["error"]
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
        assert counts[("1.0", "200")] >= 5 and counts[("1.0", "401")] == 4, counts
        assert all(version == "1.0" for version, _ in counts), counts  # nothing for made-up names

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
