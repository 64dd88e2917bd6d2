"""The compiled pipeline end to end in containers, as a cluster runs it.

kfp.local's DockerRunner runs every task in the pipeline component image built by scripts/build-images.sh,
through a Docker-compatible API (docker's own daemon, or `podman system service` here), on the bundled
sample with tiny settings. The KServe target publishes the model store to an S3 API server on loopback
(moto); KServe's own storage code downloads it as the storage initializer would, and the serving image,
started as the shipped ServingRuntime describes, answers a sample digit from it.

How the tasks are run, and why:
- The run happens in a subprocess of this Python with PIPELINE_IMAGE set before `pipeline.components` is
  imported (the image is read at import time, and other test modules import it earlier), which also keeps
  kfp.local's global configuration out of this process.
- Network: host networking (DockerRunner(network_mode="host")), so the tasks reach the S3 server on the
  host's loopback, like a pod reaches a cluster-internal endpoint.
- Environment: on a cluster the storage credentials come from a Kubernetes Secret (kfp-kubernetes), which
  kfp.local ignores; DockerRunner(environment=...) hands every task the AWS SDK variables instead.
- User: the image's own (uid 10001, as on a cluster). The pipeline root is bind-mounted at the same path
  and the tasks create every directory in it, so it is made world-writable (older KFP backends need the
  same for /gcs, /minio and /s3, which the image provides).
- Exit status: kfp 2.17.3's DockerRunner removes the container on exit and reads a vanished container as
  exit 0, so a failed task was reported SUCCESS here (kubeflow/pipelines#13332); RUN_SCRIPT replaces its
  run_docker_container with one that reads the status before removing the container, and a test checks
  that a failing task fails the run.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.containers import build_images, engine_or_reason, post, start_predictor, wait_for_probe
from support.s3server import client_env, files, kserve_download, s3_server

from settings import REPO

ENGINE, WHY_NOT = engine_or_reason()
pytestmark = [pytest.mark.containers, pytest.mark.skipif(ENGINE is None, reason=WHY_NOT)]

#: Tasks that must run (the gate in front of deploy-kserve, if any, runs too and is checked like them).
TASKS = {"load-data", "train", "build-index", "evaluate", "archive", "check-quality", "deploy-kserve"}
BUCKET, PREFIX = "models", "embedding"
IMAGE_UID = 10001  # USER of the root Dockerfile
RUN_TIMEOUT_S = 900

# Runs in a fresh interpreter whose environment already holds PIPELINE_IMAGE (and DOCKER_HOST).
RUN_SCRIPT = r"""
import json, os, sys, warnings
from pathlib import Path

spec = json.loads(sys.argv[1])
from kfp import local
from kfp.local import docker_task_handler


def run_docker_container(client, image, command, volumes, **run_args):
    # kfp 2.17.3 runs with auto_remove=True and reads a vanished container's status as 0, so a failed
    # task passes (kubeflow/pipelines#13332; fix PRs #13402, #13907): keep it until its status is read.
    image = docker_task_handler.add_latest_tag_if_not_present(image)
    found = any(image in i.tags + i.attrs.get("RepoDigests", []) for i in client.images.list())
    print(f"Found image {image!r}\n" if found else f"image {image!r} is not present (no pulls here)\n")
    container = client.containers.run(image=image, command=command, detach=True, stdout=True, stderr=True,
                                      volumes=volumes, **run_args)
    try:
        for line in container.logs(stream=True, follow=True):
            print(line.decode(), end="")
        code = container.wait()["StatusCode"]
        config = container.attrs["Config"]
        print(f"TASK_CONTAINER {json.dumps({'image': config['Image'], 'user': config.get('User'), 'exit': code})}")
        return code
    finally:
        container.remove(force=True)


docker_task_handler.run_docker_container = run_docker_container
from pipeline import components
from pipeline.pipeline import PIPELINE_NAME, mnist_embedding_pipeline

assert components.PIPELINE_IMAGE == os.environ["PIPELINE_IMAGE"], components.PIPELINE_IMAGE
local.init(runner=local.DockerRunner(**spec["run_args"]), pipeline_root=spec["pipeline_root"],
           workspace_root=spec["workspace_root"])
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    if spec.get("component"):  # one task on its own
        getattr(components, spec["component"])(**spec["params"])
    else:
        mnist_embedding_pipeline(**spec["params"])
print("RUN_DIRS=" + json.dumps(sorted(str(p) for p in Path(spec["pipeline_root"]).glob(PIPELINE_NAME + "-*"))))
"""


@dataclass
class Phases:
    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, started: float) -> None:
        self.seconds[name] = time.monotonic() - started
        print(f"[phase] {name}: {self.seconds[name]:.1f} s", flush=True)


PHASES = Phases()


@pytest.fixture(scope="module", autouse=True)
def phase_summary():
    yield
    print("\nphases: " + ", ".join(f"{name} {s:.1f} s" for name, s in PHASES.seconds.items()))


@dataclass(frozen=True)
class ContainerRun:
    run_dir: Path
    outputs: dict[str, dict[str, Any]]
    log: str
    params: dict[str, Any]
    image: str
    endpoint: str


@pytest.fixture(scope="module")
def images() -> dict:
    started = time.monotonic()
    built = build_images(ENGINE)
    PHASES.timed("build images (both)", started)
    return built


@pytest.fixture(scope="module")
def s3():
    with s3_server() as endpoint:
        import boto3

        s3_client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                 aws_access_key_id="x", aws_secret_access_key="y")
        s3_client.create_bucket(Bucket=BUCKET)
        yield endpoint, s3_client


@pytest.fixture(scope="module")
def docker_host(images):
    from support.podman_service import docker_api

    started = time.monotonic()
    with docker_api(images) as host:
        PHASES.timed(f"docker API ({images['engine']})", started)
        yield host


def run_params() -> dict[str, Any]:
    from pipeline.params import DEFAULTS

    params = {"data_source": "mnist-sample", "epochs": 1, "embedding_dim": 16, "width": 8, "min_accuracy": 0.3,
              "min_open_set_rejection": 0.0, "model_version": f"c{uuid.uuid4().hex[:8]}", "deploy_target": "kserve", "kserve_dry_run": True,
              "kserve_storage_uri": f"s3://{BUCKET}/{PREFIX}", "kserve_namespace": "models"}
    if "allow_unknown_current" in DEFAULTS:  # no cluster: the live InferenceService cannot be read
        params["allow_unknown_current"] = True
    assert set(params) <= set(DEFAULTS), sorted(set(params) - set(DEFAULTS))
    return params


def run_in_containers(images: dict, docker_host: str | None, root: Path, params: dict[str, Any],
                      environment: dict[str, str], component: str = "") -> subprocess.CompletedProcess:
    """kfp.local with DockerRunner in a fresh interpreter; the log is also written to root/run.log."""
    workspace = root / "kfp-workspace"
    workspace.mkdir(parents=True)
    for path in (root, workspace):
        path.chmod(0o777)  # the tasks run as the image's uid and create every directory under it
    spec = {"pipeline_root": str(root), "workspace_root": str(workspace), "params": params, "component": component,
            "run_args": {"network_mode": "host", "environment": environment}}
    env = {**os.environ, "PIPELINE_IMAGE": images["pipeline"]["ref"], "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    result = subprocess.run([sys.executable, "-c", RUN_SCRIPT, json.dumps(spec)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    (root / "run.log").write_text(result.stdout + result.stderr)
    print(f"kfp.local log: {root / 'run.log'}")
    return result


@pytest.fixture(scope="module")
def container_run(images, docker_host, s3, tmp_path_factory) -> ContainerRun:
    from pipeline.local_run import read_outputs

    endpoint, _ = s3
    root = tmp_path_factory.mktemp("pipeline-root")
    params = run_params()
    started = time.monotonic()
    result = run_in_containers(images, docker_host, root, params, client_env(endpoint))
    PHASES.timed("pipeline run in containers (kfp.local DockerRunner)", started)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RUN_DIRS=")]
    (run_dir,) = map(Path, json.loads(line.removeprefix("RUN_DIRS=")))
    return ContainerRun(run_dir, read_outputs(run_dir), log, params, images["pipeline"]["ref"], endpoint)


def test_every_task_ran_in_the_pipeline_image(container_run):
    run = container_run
    ran = set(run.outputs)
    assert ran >= TASKS, (sorted(ran), run.log[-3000:])
    plain = re.sub(r"\x1b\[[0-9;]*m", "", run.log)  # kfp.local colours task names and states
    for task in ran:
        assert f"Task '{task}' finished with status SUCCESS" in plain, task
    # One container per task, of the pipeline image, as its own user, exit 0 (printed by RUN_SCRIPT).
    containers = [json.loads(line.split(" ", 1)[1]) for line in map(str.strip, run.log.splitlines())
                  if line.startswith("TASK_CONTAINER ")]
    assert len(containers) == len(ran), (len(containers), sorted(ran))
    assert {(c["image"], c["user"], c["exit"]) for c in containers} == {(run.image, f"{IMAGE_UID}:0", 0)}
    if os.geteuid() == 0:
        # Written by the image's user, not by this (root) process: the executor ran inside the container.
        owners = {task: (run.run_dir / task / "executor_output.json").stat().st_uid for task in ran}
        assert set(owners.values()) == {IMAGE_UID}, owners
    for task in ran:
        for name, value in run.outputs[task].items():
            if hasattr(value, "uri"):
                assert value.path.is_relative_to(run.run_dir), (task, name, value.uri)


def test_the_train_task_compiled_the_int8_model_in_the_pipeline_image(container_run):
    """The digit profile's default is int8, compiled ahead of time by the image's g++: without a compiler the
    build would fall back to the float model and every serving check below would test that one instead."""
    model = container_run.outputs["train"]["model"]
    assert (model.metadata["quantize"], model.metadata["framework"]) == ("int8", "aotinductor"), model.metadata
    assert (model.path / "model.pt2").is_file() and not (model.path / "model.pt").exists()


def test_evaluate_wrote_metrics_confusion_matrix_and_report(container_run):
    evaluate = container_run.outputs["evaluate"]
    accuracy = float(evaluate["Output"])
    assert container_run.params["min_accuracy"] <= accuracy <= 1.0
    metrics = evaluate["metrics"].metadata
    assert set(metrics) >= {"accuracy", "threshold", "open_set_rejection"}
    assert metrics["accuracy"] == pytest.approx(accuracy)
    matrix = evaluate["confusion"].metadata["confusionMatrix"]
    labels = [spec["displayName"] for spec in matrix["annotationSpecs"]]
    assert labels == [str(d) for d in range(10)]
    rows = [row["row"] for row in matrix["rows"]]
    assert len(rows) == 10 and all(len(r) == 10 for r in rows)
    total = sum(map(sum, rows))
    assert total > 0 and sum(rows[i][i] for i in range(10)) / total == pytest.approx(accuracy, abs=1e-6)
    report = evaluate["report"].path.read_text()
    assert report.startswith("# Embedding model on ")
    assert f"| held-out k-NN accuracy | {accuracy:.4f} |" in report
    assert (evaluate["evaluated"].path / "metadata.json").is_file()


def test_archive_and_kserve_publish_to_s3(container_run, s3):
    _, s3_client = s3
    run = container_run
    version = run.params["model_version"]
    mar = run.outputs["archive"]["mar"]
    assert (mar.path / "embedding.mar").is_file()
    assert mar.metadata["version"] == version and mar.metadata["mar_name"] == "embedding.mar"
    listed = s3_client.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/{version}/")
    keys = sorted(item["Key"] for item in listed.get("Contents", []))
    assert keys == [f"{PREFIX}/{version}/config/config.properties", f"{PREFIX}/{version}/model-store/embedding.mar"]
    published = s3_client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{version}/model-store/embedding.mar")
    assert published["Body"].read() == (mar.path / "embedding.mar").read_bytes()
    deploy = run.outputs["deploy-kserve"]
    uri = f"s3://{BUCKET}/{PREFIX}/{version}"
    manifest = json.loads(deploy["manifest"].path.read_text())
    assert manifest["kind"] == "InferenceService" and manifest["metadata"]["namespace"] == "models"
    assert manifest["spec"]["predictor"]["model"]["storageUri"] == f"{uri}/"  # the folder, not every key it prefixes
    assert deploy["manifest"].metadata["storage"] == uri and deploy["manifest"].metadata["applied"] is False


def test_serving_container_answers_from_the_published_storage(container_run, images, tmp_path):
    from serving.samples import write_samples

    run = container_run
    manifest = json.loads(run.outputs["deploy-kserve"]["manifest"].path.read_text())
    uri = manifest["spec"]["predictor"]["model"]["storageUri"]
    models_dir = tmp_path / "mnt-models"
    models_dir.mkdir()
    started = time.monotonic()
    download = kserve_download(uri, models_dir, run.endpoint)
    assert download.returncode == 0, download.stderr[-2000:]
    assert files(models_dir) == ["config/config.properties", "model-store/embedding.mar"]
    with zipfile.ZipFile(models_dir / "model-store" / "embedding.mar") as mar:
        assert "model.pt2" in mar.namelist()  # the serving image, which has no compiler, loads the int8 package
    subprocess.run(["chmod", "-R", "a+rX", str(tmp_path)], check=True)  # the serving image runs as non-root
    PHASES.timed("kserve-storage download", started)

    started = time.monotonic()
    container, url, key, spec = start_predictor(images, (models_dir, manifest),
                                                f"embedding-pipeline-ctr-{uuid.uuid4().hex[:6]}")
    try:
        wait_for_probe(url, spec["readinessProbe"], 180, container)
        PHASES.timed("serving container start to ready", started)
        digit = 7
        png = write_samples(tmp_path / "samples")[digit].read_bytes()
        status, body = post(f"{url}/v1/models/{run.params.get('model_name', 'embedding')}:predict",
                            {"instances": [{"data": base64.b64encode(png).decode()}]}, key)
        assert status == 200, body
        (answer,) = body["predictions"]
        assert "pred" in answer and answer["model_version"] == run.params["model_version"], answer
        print(f"sample digit {digit}: pred={answer['pred']} unknown={answer['unknown']} dist={answer['dist']:.3f}")
        assert post(f"{url}/v1/models/embedding:predict", {"instances": []}, None)[0] == 401
    finally:
        container.remove()


def test_a_task_failing_in_its_container_fails_the_run(images, docker_host, tmp_path):
    """The task's exit status reaches kfp.local (see run_docker_container in RUN_SCRIPT)."""
    started = time.monotonic()
    result = run_in_containers(images, docker_host, tmp_path / "root", {"source": "no-such-source:x"}, {},
                               component="load_data")
    PHASES.timed("failing task in a container", started)
    log = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode != 0, log[-3000:]
    assert "Task 'load-data' finished with status FAILURE" in log, log[-3000:]
    assert '"exit": 1' in log and "no-such-source" in log


def test_no_storage_secret_reaches_the_logs_or_the_outputs(container_run):
    """The deploy task had the storage credentials in its environment (as a Secret would give them); neither
    the run's log nor any artifact it wrote contains them."""
    secret = client_env(container_run.endpoint)["AWS_SECRET_ACCESS_KEY"]
    assert secret not in container_run.log
    for path in container_run.run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert secret.encode() not in path.read_bytes(), path
