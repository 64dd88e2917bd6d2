"""The compiled package parses, strictly, with the protobuf messages of the oldest supported Kubeflow Pipelines
backend (requirements/kfp-oldest.txt, in build/kfp-oldest-venv) and with the newest (.venv's kfp-kubernetes and
kfp-pipeline-spec), as the backend's API server and driver parse it; opt-in features are refused by the oldest.

Each environment parses through tests/support/kfp_strict_parse.py in a subprocess of its own interpreter
(isolated, -I: the script's directory would shadow the standard library's http).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline import kfp_backend
from pipeline.options import DEFAULT_RESOURCES, TASKS, CompileOptions, Resources
from settings import REPO

IMAGE = "registry.example.com/ml/mnist-embedding-pipeline:1.2.3"
PARSER = REPO / "tests" / "support" / "kfp_strict_parse.py"
NEWEST_ONLY = {"secret-name-parameter": (2, 5, 0)}
VARIANTS = {
    "default": CompileOptions(),
    "pull-secrets-and-resources": CompileOptions(
        image_pull_secrets=("regcred", "mirror-cred"),
        resources={**DEFAULT_RESOURCES, "train": Resources("3", "3500m", "3G", "6Gi")}),
    "secret-name-parameter": CompileOptions(secret_name_parameter=True),
    "data-pvc-claim": CompileOptions(data_pvc_claim="training-data"),
}


@pytest.fixture(scope="module")
def oldest_python() -> str:
    proc = subprocess.run([str(REPO / "scripts" / "kfp-oldest-venv.sh")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def _items(spec: dict, platform: dict) -> dict[str, dict]:
    """What a backend unmarshals, by name: the specs at upload, the container and Kubernetes config per task."""
    items = {"PipelineSpec": {"message": "PipelineSpec", "json": spec},
             "PipelineDeploymentConfig": {"message": "PipelineDeploymentConfig", "json": spec["deploymentSpec"]}}
    if platform:
        items["PlatformSpec"] = {"message": "PlatformSpec", "json": platform}
    for name, config in kfp_backend.executor_configs(platform).items():
        items[name] = {"message": "KubernetesExecutorConfig", "json": config}
    return items


def _parse(python: str, packages: dict[str, tuple[dict, dict]]) -> tuple[dict, dict[str, dict[str, str | None]]]:
    """(versions, label -> item name -> None or the parser's error) for every package, in `python`."""
    named = [(label, name, item) for label, (spec, platform) in packages.items()
             for name, item in _items(spec, platform).items()]
    proc = subprocess.run([python, "-I", str(PARSER)], input=json.dumps([item for _, _, item in named]),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    results: dict[str, dict[str, str | None]] = {}
    for (label, name, _), error in zip(named, answer["errors"], strict=True):
        results.setdefault(label, {})[name] = error
    return answer["versions"], results


def _raw_compile(pipeline, path: Path) -> tuple[dict, dict]:
    """What the SDK writes, before pipeline.kfp_backend.for_oldest."""
    from kfp import compiler

    compiler.Compiler().compile(pipeline, str(path))
    spec, platform = yaml.safe_load_all(path.read_text())
    return spec, platform


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, tuple[dict, dict, kfp_backend.Version]]:
    """Each variant compiled as `python -m pipeline compile` does, with the backend version it needs; "raw" is
    the default pipeline as the SDK compiles it."""
    from pipeline.cli import _compile, _documents
    from pipeline.pipeline import mnist_embedding_pipeline

    tmp = tmp_path_factory.mktemp("packages")
    compiled = {}
    for label, options in VARIANTS.items():
        path, needed, _ = _compile(tmp / f"{label}.yaml", IMAGE, options)
        compiled[label] = (*_documents(path), needed)
    spec, platform = _raw_compile(mnist_embedding_pipeline, tmp / "raw.yaml")
    compiled["raw"] = (spec, platform, kfp_backend.required(spec, platform)[0])
    return compiled


@pytest.fixture(scope="module")
def pre_fix(tmp_path_factory) -> tuple[dict, dict]:
    """The construct the deploy task used before, an optional Secret as environment variables, compiled and
    made as old as it can be (pipeline.kfp_backend.for_oldest)."""
    from kfp import dsl, kubernetes

    @dsl.component(base_image=IMAGE, install_kfp_package=False, packages_to_install=[])
    def deploy() -> None:
        pass

    @dsl.pipeline(name="pre-fix")
    def pre_fix_pipeline() -> None:
        kubernetes.use_secret_as_env(deploy(), secret_name="storage", optional=True,
                                     secret_key_to_env={"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID"})

    spec, platform = _raw_compile(pre_fix_pipeline, tmp_path_factory.mktemp("pre-fix") / "pre-fix.yaml")
    kfp_backend.for_oldest(spec, platform)
    return spec, platform


@pytest.fixture(scope="module")
def oldest(oldest_python, packages, pre_fix) -> tuple[dict, dict]:
    return _parse(oldest_python, {**{k: v[:2] for k, v in packages.items()}, "pre-fix": pre_fix})


@pytest.fixture(scope="module")
def newest(packages, pre_fix) -> tuple[dict, dict]:
    return _parse(sys.executable, {**{k: v[:2] for k, v in packages.items()}, "pre-fix": pre_fix})


def _failed(results: dict[str, str | None]) -> dict[str, str]:
    return {name: error for name, error in results.items() if error}


def test_the_oldest_environment_holds_the_pinned_messages(oldest):
    versions, _ = oldest
    pins = dict(re.findall(r"^([a-z-]+)==(\S+)$", (REPO / "requirements" / "kfp-oldest.txt").read_text(), re.M))
    assert versions == {name: pins[name] for name in versions}
    assert versions["kfp-kubernetes"].startswith("1.") and versions["protobuf"].startswith("4.")


@pytest.mark.parametrize("label", [v for v in VARIANTS if v not in NEWEST_ONLY])
def test_the_package_parses_on_the_oldest_backend(packages, oldest, label):
    spec, platform, needed = packages[label]
    _, results = oldest
    assert needed == kfp_backend.OLDEST
    assert not _failed(results[label])
    configured = {name for name in results[label] if name.startswith("exec-")}  # each task's config was parsed
    pulling = bool(VARIANTS[label].image_pull_secrets)
    assert configured == ({f"exec-{task}" for task in TASKS} | {"exec-deploy-kserve-2"} if pulling else
                          {"exec-load-data", "exec-deploy-kserve", "exec-deploy-kserve-2"})


@pytest.mark.parametrize("label", [*VARIANTS, "raw", "pre-fix"])
def test_the_newest_messages_parse_every_package(newest, label):
    versions, results = newest
    assert not _failed(results[label]), label
    assert int(versions["protobuf"].split(".")[0]) >= 6


@pytest.mark.parametrize("label", list(NEWEST_ONLY))
def test_an_opt_in_names_its_backend_and_the_oldest_refuses_it(packages, oldest, label):
    _, _, needed = packages[label]
    _, results = oldest
    assert needed == NEWEST_ONLY[label]
    failed = _failed(results[label])
    assert set(failed) == {"exec-load-data", "exec-deploy-kserve", "exec-deploy-kserve-2"}
    assert all('no field named "secretNameParameter"' in error for error in failed.values()), failed


def test_the_oldest_messages_refuse_the_pre_fix_constructs(pre_fix, oldest):
    """The check can fail: what the pipeline compiled to before is refused."""
    _, results = oldest
    (error,) = _failed(results["pre-fix"]).values()
    assert 'no field named "optional"' in error and "SecretAsEnv" in error
    assert kfp_backend.required(*pre_fix) == ((2, 15, 0), "an optional Secret as environment variables (exec-deploy)")
    raw = _failed(results["raw"])
    assert "pvcNameParameter" in raw["exec-deploy-kserve-2"] and "secretNameParameter" in raw["exec-deploy-kserve"]
    assert "resourceCpuLimit" in raw["PipelineDeploymentConfig"]


def _probe(message: str, field: str) -> dict:
    """A minimal message setting one field of pipeline.kfp_backend.FEATURES."""
    value = {"optional": True, "pvcNameParameter": {"componentInputParameter": "claim"},
             "secretNameParameter": {"componentInputParameter": "name"}}.get(field, "1")
    if message == "resources":
        return {"message": "PipelineDeploymentConfig",
                "json": {"executors": {"exec-x": {"container": {"image": IMAGE, "resources": {field: value}}}}}}
    return {"message": "KubernetesExecutorConfig", "json": {message: [{field: value}]}}


def test_every_feature_of_the_table_is_unknown_to_the_oldest_and_known_to_the_newest(oldest_python):
    probes = [_probe(message, field) for message, field in kfp_backend.FEATURES]
    for python, known in ((oldest_python, False), (sys.executable, True)):
        proc = subprocess.run([python, "-I", str(PARSER)], input=json.dumps(probes), capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        errors = json.loads(proc.stdout)["errors"]
        for (message, field), error in zip(kfp_backend.FEATURES, errors, strict=True):
            assert (error is None) == known, (message, field, error)
            assert known or f'no field named "{field}"' in error


@pytest.mark.parametrize("label", ["default", "pull-secrets-and-resources"])
def test_every_task_has_its_resources_in_the_fields_the_oldest_backend_reads(packages, label):
    from kfp.compiler.compiler_utils import _cpu_to_float, _memory_to_float

    spec, _, _ = packages[label]
    executors = spec["deploymentSpec"]["executors"]
    assert set(executors) == {f"exec-{task}" for task in TASKS} | {"exec-deploy-kserve-2"}
    for task, res in VARIANTS[label].resources.items():
        assert executors[f"exec-{task}"]["container"]["resources"] == {
            "cpuRequest": _cpu_to_float(res.cpu_request), "cpuLimit": _cpu_to_float(res.cpu_limit),
            "memoryRequest": _memory_to_float(res.memory_request),
            "memoryLimit": _memory_to_float(res.memory_limit)}, task


def test_the_storage_secret_is_a_constant_optional_volume(packages):
    _, platform, _ = packages["default"]
    configs = kfp_backend.executor_configs(platform)
    for name in ("exec-load-data", "exec-deploy-kserve", "exec-deploy-kserve-2"):
        (volume,) = configs[name]["secretAsVolume"]
        assert volume == {"mountPath": "/var/secrets/storage", "optional": True,
                          "secretName": "mnist-embedding-storage"}
        assert "secretAsEnv" not in configs[name]
    (mount,) = configs["exec-deploy-kserve-2"]["pvcMount"]
    assert mount == {"componentInputParameter": "pipelinechannel--kserve_pvc_claim", "mountPath": "/mnt/pvc"}
    assert "pvcMount" not in configs["exec-load-data"]


def test_the_deploy_tasks_take_the_run_id_from_their_pod_label(packages, oldest):
    """The run id reaches the deploy record on 2.3.0 too: a field-path env var, which the oldest driver's messages
    (kfp-kubernetes 1.3.0's FieldPathAsEnv) parse; {{$.pipeline_job_uuid}} stays the fallback input."""
    spec, platform, _ = packages["default"]
    configs = kfp_backend.executor_configs(platform)
    for name in ("exec-deploy-kserve", "exec-deploy-kserve-2"):
        assert configs[name]["fieldPathAsEnv"] == [{"name": kfp_backend.RUN_ID_ENV,
                                                    "fieldPath": "metadata.labels['pipeline/runid']"}]
        assert oldest[1]["default"][name] is None
    assert all("fieldPathAsEnv" not in config for name, config in configs.items() if "deploy-kserve" not in name)


def test_the_pinned_sdk_writes_optional_on_every_secret_as_env(tmp_path):
    """Why the package has no secretAsEnv at all: kfp-kubernetes from 2.15 writes `optional` even when it is
    false, which backends before 2.15 refuse (kubeflow/pipelines#12495)."""
    from importlib.metadata import version

    from kfp import dsl, kubernetes

    @dsl.component(base_image=IMAGE, install_kfp_package=False, packages_to_install=[])
    def task() -> None:
        pass

    @dsl.pipeline(name="secret-env")
    def secret_env() -> None:
        kubernetes.use_secret_as_env(task(), secret_name="s", secret_key_to_env={"k": "K"})

    spec, platform = _raw_compile(secret_env, tmp_path / "secret-env.yaml")
    kfp_backend.for_oldest(spec, platform)
    assert int(version("kfp-kubernetes").split(".")[0]) >= 2
    (env,) = kfp_backend.executor_configs(platform)["exec-task"]["secretAsEnv"]
    assert env["optional"] is False
    assert kfp_backend.required(spec, platform)[0] == (2, 15, 0)


def test_a_data_claim_is_mounted_in_the_load_data_task(packages):
    _, platform, _ = packages["data-pvc-claim"]
    (mount,) = kfp_backend.executor_configs(platform)["exec-load-data"]["pvcMount"]
    assert mount == {"constant": "training-data", "mountPath": "/mnt/pvc"}


def test_a_parameterised_resource_keeps_its_newer_field():
    """for_oldest drops a newer field only where its older twin says the same."""
    spec = {"deploymentSpec": {"executors": {"exec-x": {"container": {"resources": {
        "resourceCpuLimit": "{{$.inputs.parameters['pipelinechannel--cpu']}}", "resourceMemoryLimit": "2G",
        "memoryLimit": 2.0, "resourceCpuRequest": "500m", "cpuRequest": 1.0}}}}}}
    platform = {"platforms": {"kubernetes": {"deploymentSpec": {"executors": {"exec-x": {
        "secretAsVolume": [{"secretName": "a", "secretNameParameter": {"runtimeValue": {"constant": "b"}}}]}}}}}}
    kfp_backend.for_oldest(spec, platform)
    assert spec["deploymentSpec"]["executors"]["exec-x"]["container"]["resources"] == {  # 500m is not 1.0: kept
        "resourceCpuLimit": "{{$.inputs.parameters['pipelinechannel--cpu']}}", "memoryLimit": 2.0,
        "resourceCpuRequest": "500m", "cpuRequest": 1.0}
    assert "secretNameParameter" in kfp_backend.executor_configs(platform)["exec-x"]["secretAsVolume"][0]
    assert kfp_backend.required(spec, platform) == ((2, 5, 0), "a Secret's name from a run parameter (exec-x)")
