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
from serving.kserve_runtime import API_KEY_ENV, RuntimeConfigError, Upstream
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
def test_gateway_in_front_of_a_real_torchserve(layout, tmp_path):
    (port,) = free_ports(1)
    url, key = f"http://127.0.0.1:{port}", "k" * 32
    proc = runtime(layout, tmp_path, port, key)
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
    assert "KServe v1 body is not JSON" in json.loads(answer)["error"]


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
        "unknown": ("BOOL", [-1]), "neighbour_labels": ("BYTES", [-1, -1]),
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
