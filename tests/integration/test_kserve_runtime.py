"""serving.kserve_runtime outside a container: refusals on one line, and the gateway with a real TorchServe
(probes without a key, everything else with it, metadata, SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.containers import http_get

from pipeline.kserve import stage_layout
from settings import REPO, read_properties, write_properties
from serving.kserve_runtime import API_KEY_ENV, RuntimeConfigError, Upstream
from serving.server import free_ports


@pytest.fixture(scope="module")
def layout(model_store, tmp_path_factory) -> Path:
    """The storage initializer's /mnt/models, with TorchServe's ports moved to free ones on loopback."""
    out = tmp_path_factory.mktemp("mnt-models")
    stage_layout(model_store / "embedding.mar", "embedding", "1.0", out)
    config = out / "config" / "config.properties"
    props = read_properties(config)
    inference, management, metrics = free_ports(3)
    props.update({"inference_address": f"http://127.0.0.1:{inference}",
                  "management_address": f"http://127.0.0.1:{management}",
                  "metrics_address": f"http://127.0.0.1:{metrics}",
                  "model_store": str(out / "model-store")})
    write_properties(props, config)
    return out


def runtime(layout: Path, workdir: Path, port: int, key: str | None, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TMPDIR": str(workdir)})
    if key:
        env[API_KEY_ENV] = key
    return subprocess.Popen([sys.executable, "-m", "serving.kserve_runtime", f"--model-store={layout}/model-store",
                             f"--ts-config={layout}/config/config.properties", f"--http-port={port}", *extra],
                            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


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
            answer = json.loads(json.loads(response.read())["outputs"][0]["data"][0])
        assert answer["unknown"] is True  # a blank image is never a confident digit
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if http_get(url + "/v2/health/ready", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"not ready after {timeout_s} s"
        time.sleep(0.5)
