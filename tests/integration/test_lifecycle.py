"""Model versions on a real TorchServe: two versions side by side, default switched and rolled back,
workers scaled, a version unregistered and registered again; and the model API kept off by default.

Version 2.0 is the same model with ``k = 3`` in its metadata.json (as training with ``-k 3`` writes it) and
one worker, so its answers carry 3 neighbours instead of 5: the answers themselves show which version
served them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from serving.server import Instance, private_instance, start, stop
from serving.samples import user_digit_png

from client import AuthError, EmbeddingClient, LifecycleError, ManagementClient, ModelNotFoundError, UsageError, protos
from client.lifecycle import lifecycle_properties, mar_manifest, write_lifecycle_config
from serving.archive import build_mar
from settings import MODEL_CONFIG_FILE, REPO, model_config, read_properties

pytestmark = pytest.mark.serving

V2_CONFIG = MODEL_CONFIG_FILE.read_text().replace("minWorkers: 2", "minWorkers: 1").replace("maxWorkers: 2",
                                                                                              "maxWorkers: 1")


@pytest.fixture(scope="module")
def digit(prepared_sample) -> bytes:
    return user_digit_png(prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == 4)[0])])


@pytest.fixture(scope="module")
def versions_store(tmp_path_factory, tiny_artifacts, model_store) -> Path:
    """embedding.mar (1.0, k=5, 2 workers) and embedding-2.0.mar (2.0, k=3, 1 worker) in one store."""
    root = tmp_path_factory.mktemp("versions")
    store = root / "store"
    store.mkdir()
    shutil.copy2(model_store / "embedding.mar", store / "embedding.mar")
    config = root / "model-config-2.0.yaml"
    config.write_text(V2_CONFIG)
    artifacts = shutil.copytree(tiny_artifacts, root / "artifacts-2.0")
    metadata = json.loads((artifacts / "metadata.json").read_text())
    (artifacts / "metadata.json").write_text(json.dumps({**metadata, "k": 3}))
    built = build_mar(artifacts, root / "build", version="2.0", model_config=config)
    built.replace(store / "embedding-2.0.mar")
    return store


@pytest.fixture(scope="module")
def served(tmp_path_factory, versions_store):
    """A TorchServe started with both versions (load_models) and a lifecycle config (model API on)."""
    base = private_instance(tmp_path_factory.mktemp("lifecycle"))
    config = write_lifecycle_config(base.workdir / "lifecycle.properties", base=base.config)
    instance = Instance(workdir=base.workdir, config=config)
    try:
        start(instance, versions_store, models="embedding.mar,embedding-2.0.mar", timeout=180)
        keys = instance.keys()
        with ManagementClient(instance.endpoints.management, token=keys["management"]) as mgmt:
            mgmt.wait_ready(timeout=120)  # start() returns once any worker is READY; wait for all of them
            yield instance, mgmt, keys["inference"]
    finally:
        stop(instance)


def neighbours(instance: Instance, token: str, image: bytes, version: str | None = None,
               protocol: str = "rest") -> int:
    url = f"127.0.0.1:{instance.endpoints.grpc_inference_port}" if protocol == "grpc" else instance.endpoints.inference
    with EmbeddingClient(url, protocol=protocol, version=version, token=token) as client:
        return len(client.predict(image)["neighbours"])


def test_lifecycle_config_changes_only_the_model_api(tmp_path):
    base = read_properties(REPO / "config.properties")
    assert base["enable_model_api"] == "false"
    out = read_properties(write_lifecycle_config(tmp_path / "run" / "lifecycle.properties"))
    assert out.pop("enable_model_api") == "true" and base.pop("enable_model_api") == "false"
    assert Path(out.pop("model_store")) == REPO / base.pop("model_store")
    assert out == base
    assert lifecycle_properties()["disable_token_authorization"] == "false"


def test_status_shows_both_versions_workers_and_batching(served):
    _, mgmt, _ = served
    status = mgmt.status()
    assert status.default == "1.0"
    by_version = {v.version: v for v in status.versions}
    assert set(by_version) == {"1.0", "2.0"} and by_version["1.0"].default and not by_version["2.0"].default
    shipped = model_config()
    assert (by_version["1.0"].batch_size, by_version["1.0"].max_batch_delay) == (shipped["batchSize"],
                                                                              shipped["maxBatchDelay"])
    assert [len(by_version[v].workers) for v in ("1.0", "2.0")] == [2, 1]
    for worker in by_version["1.0"].workers + by_version["2.0"].workers:
        assert worker.status == "READY" and isinstance(worker.pid, int) and worker.id
    assert {m["modelName"] for m in mgmt.list_models()} == {"embedding"}


def test_each_version_answers_default_switches_and_rolls_back(served, digit):
    instance, mgmt, token = served
    assert [neighbours(instance, token, digit, v) for v in (None, "1.0", "2.0")] == [5, 5, 3]
    assert neighbours(instance, token, digit, "2.0", protocol="grpc") == 3
    assert "to \"2.0\"" in mgmt.set_default("2.0")
    assert mgmt.status().default == "2.0"
    assert neighbours(instance, token, digit) == 3 and neighbours(instance, token, digit, protocol="grpc") == 3
    mgmt.set_default("1.0")  # rollback: the previous version is still loaded, so this is immediate
    assert mgmt.status().default == "1.0" and neighbours(instance, token, digit) == 5
    with pytest.raises(ModelNotFoundError, match="9.9"):
        mgmt.set_default("9.9")


def test_requests_during_default_swaps_all_succeed(served, digit):
    """No downtime: two clients keep sending while the default goes 2.0 -> 1.0 -> 2.0 -> 1.0; every request is
    answered, and by both versions (3 and 5 neighbours)."""
    instance, mgmt, token = served
    stop, answered, errors = threading.Event(), [], []

    def keep_sending() -> None:
        with EmbeddingClient(instance.endpoints.inference, token=token) as client:
            while not stop.is_set():
                try:
                    answered.append(len(client.predict(digit)["neighbours"]))
                except Exception as exc:  # any failure during a swap is the finding
                    errors.append(repr(exc))

    senders = [threading.Thread(target=keep_sending) for _ in range(2)]
    try:
        for sender in senders:
            sender.start()
        for version in ("2.0", "1.0", "2.0", "1.0"):
            time.sleep(0.5)
            mgmt.set_default(version)
        time.sleep(0.5)
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=30)
        mgmt.set_default("1.0")
    assert not errors, errors[:3]
    assert set(answered) == {3, 5} and len(answered) > 10


def test_cli_switches_and_shows_the_default(served, tmp_path):
    instance, mgmt, _ = served
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    common = ["--url", instance.endpoints.management, "--key-file", str(instance.key_file)]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "client", *args, *common], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=120)

    try:
        switched = cli("set-default", "2.0")
        assert switched.returncode == 0 and "2.0" in switched.stdout, switched.stderr
        status = cli("status", "--format", "json")
        assert status.returncode == 0 and json.loads(status.stdout)["default"] == "2.0"
        text = cli("status")
        assert "* 2.0" in text.stdout and "READY" in text.stdout and f"maxBatchDelay={model_config()['maxBatchDelay']}ms" in text.stdout
        refused = cli("unregister", "2.0")
        assert refused.returncode == 9 and "set another default version first" in refused.stderr
    finally:
        mgmt.set_default("1.0")


def test_scale_a_version(served):
    _, mgmt, _ = served
    mgmt.scale(1, 1, version="1.0")
    try:
        version = next(v for v in mgmt.status().versions if v.version == "1.0")
        assert (version.min_workers, version.max_workers, len(version.workers)) == (1, 1, 1)
    finally:
        mgmt.scale(2, 2, version="1.0")
        mgmt.wait_ready()
    with pytest.raises(UsageError):
        mgmt.scale(3, 1)


def test_unregister_and_register_a_version(served, versions_store, digit, tmp_path):
    instance, mgmt, token = served
    with pytest.raises(LifecycleError, match="Cannot remove default version") as caught:
        mgmt.unregister("1.0")
    assert caught.value.exit_code == 9
    mgmt.unregister("2.0")
    assert [v.version for v in mgmt.status().versions] == ["1.0"]
    with pytest.raises(ModelNotFoundError):
        neighbours(instance, token, digit, "2.0")
    archive = versions_store / "embedding-2.0.mar"
    assert mar_manifest(archive)["modelVersion"] == "2.0"
    with pytest.raises(UsageError, match="holds version '2.0', not '3.0'"):
        mgmt.register(archive, "3.0")
    with pytest.raises(LifecycleError, match="already holds a file named embedding-2.0.mar"):
        mgmt.register(archive, "2.0")  # sent as file://, which TorchServe would copy over its own file

    outside = tmp_path / "embedding-candidate.mar"  # an archive outside the store goes by file:// URL
    shutil.copy2(archive, outside)
    assert "registered" in mgmt.register(outside, "2.0", workers=1)
    assert neighbours(instance, token, digit, "2.0") == 3
    mgmt.unregister("2.0")

    assert "registered" in mgmt.register(archive, "2.0", workers=1, model_store=versions_store)
    assert neighbours(instance, token, digit, "2.0") == 3
    with pytest.raises(LifecycleError, match="already registered") as caught:
        mgmt.register(archive, "2.0", workers=1, model_store=versions_store)
    assert caught.value.status == 409


def test_model_api_is_off_on_the_default_config(torchserve, versions_store):
    with ManagementClient(torchserve.endpoints.management, token=torchserve.keys()["management"]) as mgmt:
        with pytest.raises(LifecycleError, match="enable_model_api=false") as caught:
            mgmt.register(versions_store / "embedding-2.0.mar", "2.0")
        assert caught.value.status == 405
        with pytest.raises(LifecycleError, match="enable_model_api=false"):
            mgmt.unregister("1.0")
        assert mgmt.status().default == "1.0"  # reads (and set-default, scale) need no model API


def test_management_needs_the_management_key(torchserve):
    with pytest.raises(AuthError, match="wrong or expired") as caught:
        ManagementClient(torchserve.endpoints.management, token=torchserve.keys()["inference"]).status()
    assert caught.value.reason == "refused"


def test_stream_predictions_answers_once_and_keeps_the_worker(served, digit):
    """gRPC StreamPredictions ends after the handler's single answer (ts_stream_next=false) instead of
    failing with "Worker died"; the worker that served it is still the same process."""
    instance, mgmt, token = served
    stubs = protos.load()
    worker_pids = {w.pid for v in mgmt.status().versions if v.version == "2.0" for w in v.workers}
    with grpc.insecure_channel(f"127.0.0.1:{instance.endpoints.grpc_inference_port}") as channel:
        stub = stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        request = stubs.inference_pb2.PredictionsRequest(model_name="embedding", model_version="2.0",
                                                         input={"data": digit})
        (message,) = list(stub.StreamPredictions(request, metadata=(("authorization", f"Bearer {token}"),),
                                                 timeout=30))
    answer = json.loads(message.prediction)
    assert len(answer["neighbours"]) == 3 and answer["model_version"] == "2.0"
    assert {w.pid for v in mgmt.status().versions if v.version == "2.0" for w in v.workers} == worker_pids
