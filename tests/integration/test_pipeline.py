"""The Kubeflow pipeline with the real kfp SDK: compiled DAG, a full kfp.local run served by TorchServe,
the quality gate, the CLI, and the KServe deploy target (storage layout, manifest, runtime config)."""

import copy
import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from serving.server import Instance, LocalServerError, free_ports, private_instance, start, stop
from support.idx_fixtures import make_idx_dir

from pipeline import params as P
from pipeline.kserve_deploy import KServeError, KServeTarget, deploy
from settings import MODEL_CONFIG_FILE, REPO, read_properties, with_ports, write_properties

TASKS = {"load-data", "train", "build-index", "evaluate", "archive", "check-quality"}
TINY = {"epochs": 1, "embedding_dim": 16, "width": 8}
KFP_TYPES = {int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", str: "STRING", bool: "BOOLEAN"}
ANSWER_KEYS = {"pred", "dist", "confidence", "unknown", "neighbours"}


def _cli(*args: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=300)


def _sample_png(tmp: Path, digit: int = 3) -> bytes:
    from serving.samples import write_samples

    return write_samples(tmp)[digit].read_bytes()


# ---------------------------------------------------------------- compiled package


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    from kfp import compiler

    from pipeline.pipeline import mnist_embedding_pipeline

    out = tmp_path_factory.mktemp("compiled") / "pipeline.yaml"
    compiler.Compiler().compile(mnist_embedding_pipeline, str(out))
    spec, platform = yaml.safe_load_all(out.read_text())  # the pipeline, then its Kubernetes platform config
    return {**spec, **platform}


def _conditions_above(spec: dict, target: str, dag: dict | None = None, chain: tuple = ()) -> tuple | None:
    """(task name, trigger condition) of every condition group enclosing the task running `target`."""
    for task in (dag or spec["root"]["dag"]["tasks"]).values():
        component = spec["components"][task["componentRef"]["name"]]
        link = chain + ((task["taskInfo"]["name"], task.get("triggerPolicy", {}).get("condition", "")),)
        if task["componentRef"]["name"] == f"comp-{target}":
            return link
        if "dag" in component:
            found = _conditions_above(spec, target, component["dag"]["tasks"], link)
            if found:
                return found
    return None


def test_compiled_dag_tasks_and_edges(compiled):
    root = compiled["root"]["dag"]["tasks"]
    assert set(root) == TASKS | {"condition-1"}
    artifact_edges = {
        (task, name): (src["taskOutputArtifact"]["producerTask"], src["taskOutputArtifact"]["outputArtifactKey"])
        for task, spec in root.items() for name, src in spec.get("inputs", {}).get("artifacts", {}).items()
    }
    assert artifact_edges == {
        ("train", "dataset"): ("load-data", "dataset"),
        ("build-index", "dataset"): ("load-data", "dataset"),
        ("build-index", "model"): ("train", "model"),
        ("evaluate", "dataset"): ("load-data", "dataset"),
        ("evaluate", "artifacts"): ("build-index", "artifacts"),
        ("archive", "artifacts"): ("evaluate", "evaluated"),
        ("check-quality", "evaluated"): ("evaluate", "evaluated"),
        ("condition-1", "pipelinechannel--archive-mar"): ("archive", "mar"),
        ("condition-1", "pipelinechannel--evaluate-evaluated"): ("evaluate", "evaluated"),
    }
    depends = {task: set(spec.get("dependentTasks", [])) for task, spec in root.items()}
    assert depends == {"load-data": set(), "train": {"load-data"}, "build-index": {"load-data", "train"},
                       "evaluate": {"load-data", "build-index"}, "archive": {"evaluate"},
                       "check-quality": {"evaluate"}, "condition-1": {"archive", "check-quality", "evaluate"}}
    verdict = root["condition-1"]["inputs"]["parameters"]["pipelinechannel--check-quality-Output"]
    assert verdict["taskOutputParameter"] == {"producerTask": "check-quality", "outputParameterKey": "Output"}
    quality = root["check-quality"]["inputs"]["parameters"]
    for name in ("min_accuracy", "min_open_set_rejection", "min_digits_accepted"):
        assert quality[name] == {"componentInputParameter": name}, name


def _named(chain: tuple) -> list[str]:
    return [name for name, condition in chain if condition]


def test_compiled_gate_guards_both_deploy_targets(compiled):
    local = _conditions_above(compiled, "deploy-local")
    assert _named(local) == ["quality-gate", "target-local"], local
    gate = dict(local)["quality-gate"]
    assert "check-quality-Output" in gate and "'pass'" in gate
    assert "'local'" in dict(local)["target-local"]
    compare = _conditions_above(compiled, "compare-with-deployed")
    assert _named(compare) == ["quality-gate", "target-kserve"], compare
    for task, storage in (("deploy-kserve", "object-storage"), ("deploy-kserve-2", "pvc-storage")):
        chain = _conditions_above(compiled, task)
        assert _named(chain) == ["quality-gate", "target-kserve", "no-regression", storage], chain
        conditions = dict(chain)
        assert "compare-with-deployed-Output" in conditions["no-regression"]
        assert "'deploy'" in conditions["no-regression"]
        assert "'kserve'" in conditions["target-kserve"]
    for task in ("deploy-local", "deploy-kserve", "compare-with-deployed"):
        executor = compiled["components"][f"comp-{task}"]["executorLabel"]
        assert executor in compiled["deploymentSpec"]["executors"]


def test_compiled_kserve_deploy_takes_credentials_only_from_the_secret(compiled):
    """Storage credentials reach the deploy task from a Kubernetes Secret (kfp-kubernetes), the claim of a
    pvc:// target is mounted, and nothing secret is a parameter or appears in the package."""
    executors = compiled["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    object_storage = executors["exec-deploy-kserve"]
    pvc_storage = executors["exec-deploy-kserve-2"]
    for config in (object_storage, pvc_storage):
        assert "secretAsEnv" not in config  # SecretAsEnv.optional needs backend 2.15: the files of the volume instead
        (volume,) = config["secretAsVolume"]
        assert volume["mountPath"] == P.STORAGE_SECRET_MOUNT and volume["optional"] is True
        assert volume["secretName"] == P.STORAGE_SECRET.default
    assert "pvcMount" not in object_storage
    (mount,) = pvc_storage["pvcMount"]
    assert mount["mountPath"] == "/mnt/pvc"
    assert mount["componentInputParameter"] == "pipelinechannel--kserve_pvc_claim"
    declared = compiled["root"]["inputDefinitions"]["parameters"]
    secretish = {name for name in declared if any(w in name for w in ("secret", "key", "token", "password"))}
    assert secretish == {"kserve_api_key_secret", "kserve_image_pull_secret"}  # names of Secrets, not their values
    assert all(re.fullmatch(r"[a-z0-9-]*", declared[name]["defaultValue"]) for name in secretish)


def test_compiled_train_task_takes_the_training_parameters(compiled):
    inputs = compiled["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    for name in ("epochs", "embedding_dim", "width", "seed", "k", "quantize", "precision"):
        assert inputs[name] == {"componentInputParameter": name}, name


def test_compiled_parameters_match_the_table(compiled):
    declared = compiled["root"]["inputDefinitions"]["parameters"]
    assert set(declared) == set(P.DEFAULTS)
    for p in P.PARAMS:
        assert declared[p.name]["parameterType"] == KFP_TYPES[p.type], p.name
        assert declared[p.name].get("defaultValue") == p.default, p.name
    assert declared["deploy_target"]["defaultValue"] == "none"
    assert declared["allow_unknown_current"]["defaultValue"] is False


def test_cli_compile_takes_the_image_from_the_environment(tmp_path):
    out = tmp_path / "p.yaml"
    proc = _cli("compile", "--out", str(out), PIPELINE_IMAGE="registry.example.com/team/mnist:1.2.3")
    assert proc.returncode == 0, proc.stderr
    spec = next(yaml.safe_load_all(out.read_text()))
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {"registry.example.com/team/mnist:1.2.3"}
    commands = [" ".join(e["container"]["command"]) for e in spec["deploymentSpec"]["executors"].values()]
    assert all("pip install" not in c for c in commands)


# ---------------------------------------------------------------- full local run


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """One whole pipeline run with kfp.local, deploying to a TorchServe on free ports (stopped at the end).

    It runs from a directory outside the repository without PYTHONPATH, so the tasks find the project
    only through what run_local sets up.
    """
    from pipeline.local_run import run_local

    work = tmp_path_factory.mktemp("kfp-local")
    instance = private_instance(work / "serve")
    # One epoch of a tiny network: a stand-in to serve, far below the open-set minimums (tests/unit/test_pipeline_quality)
    values = P.validate({**TINY, "min_accuracy": 0.5, "min_open_set_rejection": 0.0, "deploy_target": "local",
                         "serve_workdir": str(instance.workdir), "serve_config": str(instance.config)})
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(work)
            mp.delenv("PYTHONPATH", raising=False)
            started = time.perf_counter()
            run = run_local(values, work / "outputs")
            seconds = time.perf_counter() - started
        print(f"\nkfp.local run: accuracy {run.accuracy:.4f} in {seconds:.1f}s")
        yield run, instance, values
    finally:
        stop(instance)


@pytest.mark.serving
def test_local_run_writes_every_artifact(local_run):
    from handler.artifacts import verify_artifacts
    from training.data import Dataset

    run, _, _ = local_run
    out = run.outputs
    assert TASKS | {"deploy-local"} == set(out)
    data = Dataset.load(out["load-data"]["dataset"].path)
    assert (len(data.train_images), len(data.test_images)) == (4000, 1000)
    assert out["load-data"]["dataset"].metadata["format"] == "npz"
    # The digits profile's default, int8: the train task compiled model.pt2 and passed it on.
    assert out["train"]["model"].metadata["framework"] == "aotinductor"
    assert {"model.pt2", "train.json"} <= {p.name for p in out["train"]["model"].path.iterdir()}
    gallery = {p.name for p in out["build-index"]["artifacts"].path.iterdir()}
    assert {"model.pt2", "index.faiss", "labels.json"} <= gallery
    metadata = verify_artifacts(out["evaluate"]["evaluated"].path)
    assert metadata.model_file == "model.pt2"
    assert metadata.embedding_dim == TINY["embedding_dim"]
    assert out["evaluate"]["Output"] == pytest.approx(metadata.metrics.accuracy)
    logged = out["evaluate"]["metrics"].metadata
    assert logged["accuracy"] == pytest.approx(run.accuracy)
    assert logged["threshold"] == pytest.approx(metadata.threshold)
    assert 0.0 <= logged["open_set_rejection"] <= 1.0
    matrix = out["evaluate"]["confusion"].metadata["confusionMatrix"]
    assert [a["displayName"] for a in matrix["annotationSpecs"]] == list(data.classes)
    assert sum(sum(row["row"]) for row in matrix["rows"]) == len(data.test_images)
    report = out["evaluate"]["report"].path.read_text()
    assert f"{run.accuracy:.4f}" in report and "| 9 |" in report
    mar = out["archive"]["mar"]
    assert (mar.path / "embedding.mar").is_file()
    assert mar.metadata["version"] == "1.0" and mar.metadata["mar_name"] == "embedding.mar"


@pytest.mark.serving
def test_local_run_serves_the_new_archive(local_run, tmp_path):
    from pipeline.local_command import ask_local
    from serving.server import model_status

    run, instance, values = local_run
    assert run.deployed_by == "deploy-local"
    assert run.outputs["deploy-local"]["Output"] == f"{instance.endpoints.inference}/predictions/embedding"
    assert instance.pid() is not None
    assert [v["modelVersion"] for v in model_status(instance)] == ["1.0"]
    answer = ask_local(values, tmp_path)
    assert ANSWER_KEYS <= set(answer) and answer["pred"] in [str(d) for d in range(10)]
    assert len(answer["neighbours"]) == values["k"]


@pytest.mark.serving
def test_local_deploy_replaces_the_running_server(local_run, tmp_path):
    from pipeline.local_serving import serve_archive
    from client import EmbeddingClient

    run, instance, _ = local_run
    before = instance.pid()
    served = serve_archive(run.outputs["archive"]["mar"].path, "embedding", instance.workdir, instance.config)
    assert served.pid() not in (None, before)
    with EmbeddingClient(served.endpoints.inference, token=served.keys()["inference"]) as client:
        answer = client.predict(_sample_png(tmp_path))
    assert ANSWER_KEYS <= set(answer)


@pytest.mark.serving
def test_local_deploy_switches_runtime_and_back(local_run, tmp_path):
    """serving_runtime=python replaces the workdir's TorchServe with the python runtime on the same ports and key
    file, answering the same; torchserve then takes them back."""
    from pipeline.local_serving import serve_archive
    from serving.server import recorded_here
    from client import EmbeddingClient

    run, instance, _ = local_run
    store = run.outputs["archive"]["mar"].path
    with EmbeddingClient(instance.endpoints.inference, token=instance.keys()["inference"]) as client:
        want = client.predict(_sample_png(tmp_path))
    try:
        served = serve_archive(store, "embedding", instance.workdir, instance.config, runtime="python")
        assert served.pid() is None and recorded_here(served).runtime == "python"
        with EmbeddingClient(served.endpoints.inference, token=served.keys()["inference"]) as client:
            got = client.predict(_sample_png(tmp_path))
        assert got == want
    finally:
        back = serve_archive(store, "embedding", instance.workdir, instance.config)
    assert back.pid() is not None and recorded_here(back).runtime == "torchserve"
    with pytest.raises(LocalServerError, match="not one of torchserve, python"):
        serve_archive(store, "embedding", instance.workdir, instance.config, runtime="java")


def test_cli_run_local_gate_skips_deploy(tmp_path):
    make_idx_dir(tmp_path / "idx", n_train=300, n_test=100)
    instance = private_instance(tmp_path / "serve")
    proc = _cli("run-local", "--workdir", str(tmp_path / "out"), "--data-source", f"idx:{tmp_path / 'idx'}",
                "--epochs", "1", "--embedding-dim", "8", "--width", "4", "--min-accuracy", "1.01",
                "--serve-workdir", str(instance.workdir), "--serve-config", str(instance.config), cwd=tmp_path)
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert "not deployed: quality gate not passed" in proc.stdout
        (run_dir,) = (tmp_path / "out").glob("mnist-embedding-*")
        assert {p.name for p in run_dir.iterdir()} == TASKS
        assert f"archive.mar: {run_dir / 'archive' / 'mar'}" in proc.stdout
        assert instance.pid() is None and not instance.key_file.exists()
    finally:
        stop(instance)


def test_check_quality_task_stops_a_model_that_lets_non_digits_through(tiny_artifacts, tmp_path):
    """The gate's task with kfp.local on a real 2-epoch model: accurate enough, but its open-set figure is below the
    default minimum, so "fail" (nothing deploys); with that minimum off, "pass"."""
    from kfp import dsl, local
    from kfp.dsl import Model

    from pipeline.components import check_quality
    from pipeline.local_run import read_outputs, task_environment

    @dsl.pipeline(name="quality-gate")
    def gate(evaluated_dir: str, min_open_set_rejection: float):
        imported = dsl.importer(artifact_uri=evaluated_dir, artifact_class=Model, reimport=False)
        check_quality(evaluated=imported.output, min_accuracy=P.DEFAULTS["min_accuracy"],
                      min_open_set_rejection=min_open_set_rejection,
                      min_digits_accepted=P.DEFAULTS["min_digits_accepted"])

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "runs"))
    verdicts = []
    for minimum in (P.DEFAULTS["min_open_set_rejection"], 0.0):
        with task_environment():
            gate(evaluated_dir=str(tiny_artifacts), min_open_set_rejection=minimum)
        run_dir = max((tmp_path / "runs").glob("quality-gate-*"))
        outputs = read_outputs(run_dir)["check-quality"]
        verdicts.append(outputs["Output"])
        report = outputs["report"].path.read_text()
        assert "| non-digits answered unknown |" in report
    assert verdicts == ["fail", "pass"]


# ---------------------------------------------------------------- CLI errors


@pytest.mark.parametrize("argv, code, message", [
    (["run-local", "--epochs", "0"], 1, "epochs=0: must be a positive integer"),
    (["run-local", "--deploy-target", "kserve"], 1, "needs kserve_storage_uri"),
    (["run-local", "--kserve-storage-uri", "pvc://a/x", "--kserve-pvc-claim", "b"], 1,
     "kserve_pvc_claim='b' but kserve_storage_uri names claim 'a'"),
    (["run-local", "--model-version", "1.0-"], 1, "model_version='1.0-'"),
    (["run-local", "--index-type", "annoy"], 2, "invalid choice: 'annoy'"),
    (["run-local", "--quantize", "int4"], 2, "invalid choice: 'int4'"),
    (["submit", "--epochs", "two"], 2, "invalid int value: 'two'"),
])
def test_cli_bad_parameters_fail_on_one_line(argv, code, message, capsys):
    from pipeline.cli import main

    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code and len(err) == 1 and message in err[0], err


def test_params_reject_unknown_names():
    with pytest.raises(P.ParamError, match="unknown parameter"):
        P.validate({"epoch": 3})


# ---------------------------------------------------------------- KServe


@pytest.fixture(scope="module")
def mar(local_run) -> Path:
    return local_run[0].outputs["archive"]["mar"].path / "embedding.mar"


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_kserve_dry_run_layout_and_manifest(mar, tmp_path):
    from pipeline.kserve_deploy import API_KEY_ENV, DEFAULT_API_KEY_SECRET, DEFAULT_RUNTIME, OWNED_ANNOTATIONS
    from pipeline.manifests import validate

    store = tmp_path / "store"
    result = deploy(mar, "embedding", "1.0", KServeTarget(storage_uri=store.as_uri(), namespace="models",
                                                          protocol="v2"), dry_run=True)
    assert _files(store) == ["1.0/config/config.properties", "1.0/model-store/embedding.mar"]
    assert (store / "1.0/model-store/embedding.mar").read_bytes() == mar.read_bytes()
    manifest = result.manifest
    validate(manifest)
    assert (manifest["apiVersion"], manifest["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert manifest["metadata"] | {"labels": None, "annotations": None} == {
        "name": "embedding", "namespace": "models", "labels": None, "annotations": None}
    assert set(manifest["metadata"]["annotations"]) == set(OWNED_ANNOTATIONS)  # the autoscaling target only
    model = manifest["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "pytorch"} and model["protocolVersion"] == "v2"
    assert model["storageUri"] == (store / "1.0").as_uri() and result.url == ""
    assert set(model["resources"]) == {"requests", "limits"}
    assert model["runtime"] == DEFAULT_RUNTIME
    key_env = next(e for e in model["env"] if e["name"] == API_KEY_ENV)
    assert key_env["valueFrom"] == {"secretKeyRef": {"name": DEFAULT_API_KEY_SECRET, "key": "api-key"}}

    props = read_properties(store / "1.0/config/config.properties")
    # TorchServe only on loopback inside the pod: the gateway (serving.kserve_runtime) is the way in.
    assert props["inference_address"] == "http://127.0.0.1:8085"
    assert props["management_address"] == "http://127.0.0.1:8086"
    # TorchServe's metrics on loopback; the gateway serves them with its latency histogram on the metrics port.
    assert props["metrics_address"] == "http://127.0.0.1:8087"
    assert props["gateway_metrics_address"] == "http://0.0.0.0:8082"
    assert props["disable_token_authorization"] == "true" and props["install_py_dep_per_model"] == "false"
    assert "enable_envvars_config" not in props and "service_envelope" not in props
    assert props["model_store"] == "/mnt/models/model-store"
    snapshot = json.loads(props["model_snapshot"])
    assert snapshot["modelCount"] == 1 and list(snapshot["models"]) == ["embedding"]
    entry = snapshot["models"]["embedding"]["1.0"]
    settings = yaml.safe_load(MODEL_CONFIG_FILE.read_text())
    assert entry == {"defaultVersion": True, "marName": "embedding.mar",
                     **{k: settings[k] for k in ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay",
                                                 "responseTimeout")}}


@pytest.mark.parametrize("path, value, where", [
    (("spec", "predictor", "model", "protocolversion"), "v2", "protocolversion"),
    (("metadata", "name"), "Embedding_1", "metadata.name"),
    (("spec", "predictor", "model", "resources", "limits", "memory"), "2 GB", "limits.memory"),
    (("spec", "predictor", "minReplicas"), "1", "minReplicas"),
])
def test_kserve_schema_rejects_what_the_cluster_would_drop_or_refuse(path, value, where):
    from pipeline.kserve_deploy import inference_service
    from pipeline.manifests import ManifestError, validate

    manifest = inference_service("embedding", "default", "s3://bucket/embedding/1.0", "v1", "embedding", "1.0")
    node = manifest
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ManifestError, match=where.replace(".", r"\.")):
        validate(manifest)


@pytest.mark.serving
@pytest.mark.parametrize("protocol", ["v1", "v2"])
def test_kserve_runtime_config_serves_with_a_real_torchserve(mar, tmp_path, protocol):
    """The generated config.properties on other loopback ports (model_snapshot and batching kept) loads, and
    TorchServe's own v1/v2 routes answer KServe protocol requests, several images and a bad one per request."""
    from client import BadImageError, EmbeddingClient

    deploy(mar, "embedding", "1.0", KServeTarget(namespace="models", storage_uri=str(tmp_path / "store"), protocol=protocol),
           dry_run=True)
    generated = read_properties(tmp_path / "store/1.0/config/config.properties")
    local = with_ports(generated, *free_ports(5))
    assert {k for k in local if local[k] != generated.get(k)} <= {
        "inference_address", "management_address", "metrics_address", "grpc_inference_port", "grpc_management_port"}
    instance = Instance(tmp_path / "ts", tmp_path / "ts" / "config.properties", "embedding")
    instance.workdir.mkdir(parents=True)
    write_properties(local, instance.config)
    try:
        start(instance, tmp_path / "store/1.0/model-store")
        assert instance.keys() == {}
        client = EmbeddingClient(instance.endpoints.inference, protocol=protocol)
        png = _sample_png(tmp_path)
        answers = client.predict_batch([png, b"not an image", png])
        assert ANSWER_KEYS <= set(answers[0]) and answers[0] == answers[2]
        assert isinstance(answers[1], BadImageError)
    finally:
        stop(instance)


def test_kserve_component_dry_run_with_kfp_local(mar, tmp_path):
    from kfp import dsl, local
    from kfp.dsl import Model

    from pipeline.components import deploy_kserve
    from pipeline.local_run import task_environment

    @dsl.pipeline(name="kserve-dry-run")
    def dry_run(store_dir: str, storage_uri: str):
        imported = dsl.importer(artifact_uri=store_dir, artifact_class=Model, reimport=False,
                                metadata={"accuracy": 0.9312, "open_set_rejection": 0.5})
        deploy_kserve(mar=imported.output, model_name="embedding", model_version="2.0", storage_uri=storage_uri,
                      model_uri="pvc://models/embedding", namespace="serving", service_name="", protocol="v1",
                      runtime="torchserve-faiss", service_account="models-sa",
                      api_key_secret="models-key", run_id="run-42", dry_run=True)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "runs"))
    with task_environment():
        dry_run(store_dir=str(mar.parent), storage_uri=str(tmp_path / "store"))
    (written,) = (tmp_path / "runs").glob("kserve-dry-run-*/deploy-kserve/manifest")
    manifest = json.loads(written.read_text())
    predictor = manifest["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == "pvc://models/embedding/2.0"
    assert predictor["model"]["runtime"] == "torchserve-faiss" and predictor["serviceAccountName"] == "models-sa"
    assert manifest["metadata"]["namespace"] == "serving"
    assert _files(tmp_path / "store") == ["2.0/config/config.properties", "2.0/model-store/embedding.mar"]
    # What is deployed is recorded only once a revision serves (never by a dry run), and never as annotations,
    # which KServe would copy into a new revision: the only annotations are the autoscaling target's, at the
    # pipeline's defaults, which the component's own defaults repeat (kfp runs its source without this module).
    from pipeline.kserve_deploy.rollout import OWNED_ANNOTATIONS
    from pipeline.params import DEFAULTS

    assert set(manifest["metadata"]["annotations"]) == set(OWNED_ANNOTATIONS)
    assert manifest["metadata"]["annotations"]["autoscaling.knative.dev/target"] == str(DEFAULTS["kserve_scale_target"])
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (DEFAULTS["kserve_min_replicas"],
                                                                    DEFAULTS["kserve_max_replicas"])
    defaults = {name: p.default for name, p in inspect.signature(deploy_kserve.python_func).parameters.items()}
    assert (defaults["serving_runtime"], defaults["min_replicas"], defaults["max_replicas"], defaults["scale_target"],
            defaults["watch_timeout_s"], defaults["canary_percent"], defaults["canary_window_s"],
            defaults["prometheus_url"]) == (
        DEFAULTS["serving_runtime"], DEFAULTS["kserve_min_replicas"], DEFAULTS["kserve_max_replicas"],
        DEFAULTS["kserve_scale_target"], DEFAULTS["kserve_watch_timeout"], DEFAULTS["kserve_canary_percent"],
        DEFAULTS["kserve_canary_window"], DEFAULTS["kserve_prometheus_url"])
    assert manifest["metadata"]["labels"]["app.kubernetes.io/version"] == "2.0"


class FakeConfigMaps:
    """CoreV1Api stand-in holding ConfigMaps (the deploy record and its lock), with resourceVersion checks."""

    def __init__(self) -> None:
        self.maps: dict[str, object] = {}
        self.version = 0

    def read_namespaced_config_map(self, name, namespace):
        from kubernetes.client.exceptions import ApiException

        if name not in self.maps:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.maps[name])

    def create_namespaced_config_map(self, namespace, body):
        from kubernetes.client.exceptions import ApiException

        if body.metadata.name in self.maps:
            raise ApiException(status=409, reason="AlreadyExists")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.maps[body.metadata.name] = copy.deepcopy(body)

    def replace_namespaced_config_map(self, name, namespace, body):
        from kubernetes.client.exceptions import ApiException

        if name not in self.maps or self.maps[name].metadata.resource_version != body.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        body.metadata.resource_version = str(self.version)
        self.maps[name] = copy.deepcopy(body)


class FakeCluster:
    """CustomObjectsApi stand-in for the KServe controller: a spec change creates a revision that the
    next poll still sees starting and the one after sees serving (never, with `stuck` set)."""

    def __init__(self, stuck: str = "") -> None:
        self.objects: dict[str, dict] = {}
        self.calls: list[str] = []
        self.starting: set[str] = set()
        self.stuck = stuck

    def _new_revision(self, name: str) -> None:
        obj = self.objects[name]
        obj["metadata"]["generation"] = obj["metadata"].get("generation", 0) + 1
        status = obj.setdefault("status", {"url": f"http://{name}.example.com",
                                           "conditions": [{"type": "Ready", "status": "False"}],
                                           "components": {"predictor": {}}})
        revision = f"{name}-predictor-{obj['metadata']['generation']:05d}"
        status["components"]["predictor"]["latestCreatedRevision"] = revision
        if self.stuck:
            status["conditions"][0]["message"] = self.stuck
        self.starting.add(name)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        from kubernetes.client.exceptions import ApiException

        self.calls.append("get")
        if name not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        view = copy.deepcopy(self.objects[name])
        if name in self.starting and not self.stuck:
            self.starting.discard(name)
            status = self.objects[name]["status"]
            predictor = status["components"]["predictor"]
            predictor["latestReadyRevision"] = predictor["latestCreatedRevision"]
            status["conditions"][0]["status"] = "True"
        return view

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self.calls.append("create")
        self.objects[body["metadata"]["name"]] = copy.deepcopy(body)
        self._new_revision(body["metadata"]["name"])
        return copy.deepcopy(self.objects[body["metadata"]["name"]])

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body):
        self.calls.append("patch")
        obj = self.objects[name]
        if body["spec"] != obj["spec"]:
            obj["spec"] = copy.deepcopy(body["spec"])
            self._new_revision(name)
        return copy.deepcopy(obj)


def test_kserve_rolls_forward_by_patching_the_same_service(mar, tmp_path):
    cluster = FakeCluster()
    target = KServeTarget(namespace="models", storage_uri=str(tmp_path / "store"), model_uri="s3://models/embedding", poll_s=0.01,
                          timeout_s=5)
    maps = FakeConfigMaps()
    first = deploy(mar, "embedding", "1.0", target, api=cluster, core_api=maps)
    second = deploy(mar, "embedding", "2.0", target, api=cluster, core_api=maps)
    # Each deploy reads the service first (a canary or all at once?), then rolls out.
    assert cluster.calls == ["get", "get", "create", "get", "get", "get", "get", "patch", "get", "get"]
    assert maps.maps["embedding-deployed-model"].data == {}  # the lock each took, given back
    served = cluster.objects["embedding"]
    assert served["spec"]["predictor"]["model"]["storageUri"] == "s3://models/embedding/2.0/"
    assert served["status"]["components"]["predictor"]["latestReadyRevision"] == "embedding-predictor-00002"
    assert first.url == second.url == "http://embedding.example.com"
    assert _files(tmp_path / "store") == ["1.0/config/config.properties", "1.0/model-store/embedding.mar",
                                          "2.0/config/config.properties", "2.0/model-store/embedding.mar"]


def test_kserve_times_out_with_the_ready_condition_message(mar, tmp_path):
    cluster = FakeCluster(stuck="Revision failed: ImagePullBackOff")
    target = KServeTarget(namespace="models", storage_uri=str(tmp_path / "store"), model_uri="s3://models/embedding", poll_s=0.01,
                          timeout_s=0.05)
    with pytest.raises(KServeError, match="not Ready after 0s: Revision failed: ImagePullBackOff"):
        deploy(mar, "embedding", "1.0", target, api=cluster, core_api=FakeConfigMaps())


def test_kserve_raw_deployment_mode_needs_only_ready():
    from pipeline.kserve_deploy import wait_ready

    class RawDeployment:
        def get_namespaced_custom_object(self, *where):
            return {"status": {"conditions": [{"type": "Ready", "status": "True"}], "url": "http://embedding"}}

    assert wait_ready(RawDeployment(), "default", "embedding", None, timeout_s=1)["status"]["url"] == "http://embedding"


@pytest.mark.parametrize("uri, message", [
    ("pvc://models/embedding", "claim models is not mounted at /nonexistent/pvc"),
    ("hdfs://namenode/models", "cannot write to hdfs://"),
])
def test_kserve_refuses_storage_it_cannot_write(mar, uri, message, monkeypatch):
    monkeypatch.setenv("PVC_MOUNT_PATH", "/nonexistent/pvc")
    with pytest.raises(KServeError, match=message):
        deploy(mar, "embedding", "1.0", KServeTarget(namespace="models", storage_uri=uri), dry_run=True)
