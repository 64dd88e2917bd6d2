"""The deploy record's run id on every supported KFP backend (pipeline.releases), through a stand-in of what each
backend hands the deploy task (tests/support/kfp_driver.py, written from kubeflow/pipelines' source per tag): the
compiled package's task inputs as that driver resolves them, the pod's env as the kubelet fills it, the component
run by kfp's own executor, and the deploy against the Kubernetes stand-in. Drivers 2.3.0 and 2.4.1 pass
{{$.pipeline_job_uuid}} through as written; the record must still name the run.

The stand-in's pieces are first checked against upstream's own test cases where they exist."""

from __future__ import annotations

import json

import pytest
from support.kfp_driver import (Outputs, Run, container_env, field_path_value, find_path, pod, resolve_constant,
                                run_task, split_subscripted)
from support.rollout import cluster, pvc, record  # noqa: F401 (fixtures)

from pipeline import kfp_backend, releases
from pipeline.gate import ANNOTATIONS

IMAGE = "registry.example.com/ml/mnist-embedding-pipeline:1.2.3"
RUN = Run(run_id="8d9f6c1e-4b1a-4c55-9a1e-3f2b7d0c5e11", display_name="mnist-embedding nightly",
          resource_name="mnist-embedding-x7k2q")
VERSIONS = [pytest.param(v, id=".".join(map(str, v))) for v in releases.KFP_VERSIONS]
RESOLVING = (2, 5, 0)  # the first driver that resolves {{$.pipeline_job_uuid}}


# ---------------------------------------------------------------- the stand-in against upstream's cases


def _pod_for(config: dict, env: list[dict] | None = None) -> dict:
    spec = {"deploymentSpec": {"executors": {"exec-x": {"container": {"image": IMAGE, "env": env or []}}}}}
    platform = {"platforms": {"kubernetes": {"deploymentSpec": {"executors": {"exec-x": config}}}}}
    from support.kfp_driver import Task

    return pod(spec, platform, Task("x", "comp-x", "exec-x", 1, {}, {}), RUN)


def test_field_path_env_is_upstreams_extend_pod_spec_patch():
    """kubeflow/pipelines 2.3.0 backend/src/v2/driver/driver_test.go, Test_extendPodSpecPatch_FieldPathAsEnv (the
    same cases at 2.4.1 and 2.5.0, k8s_test.go at 2.15.0 and 2.16.0)."""
    run_name = "metadata.annotations['pipelines.kubeflow.org/run_name']"
    field = {"name": "KFP_RUN_NAME", "valueFrom": {"fieldRef": {"fieldPath": run_name}}}
    alone = _pod_for({"fieldPathAsEnv": [{"name": "KFP_RUN_NAME", "fieldPath": run_name}]})
    assert alone["spec"]["containers"][0]["env"] == [field]
    mixed = _pod_for({"secretAsEnv": [{"secretName": "my-secret",
                                       "keyToEnv": [{"secretKey": "password", "envVar": "SECRET_VAR"}]}],
                      "fieldPathAsEnv": [{"name": "KFP_RUN_NAME", "fieldPath": run_name}]})
    assert mixed["spec"]["containers"][0]["env"] == [
        {"name": "SECRET_VAR", "valueFrom": {"secretKeyRef": {"name": "my-secret", "key": "password",
                                                              "optional": None}}}, field]


@pytest.mark.parametrize("placeholder, expected", [
    ("{{$.pipeline_job_create_time_utc}}", RUN.create_time), ("{{$.pipeline_job_schedule_time_utc}}", RUN.schedule_time)])
def test_time_placeholders_are_upstreams_resolve_test(placeholder, expected):
    """kubeflow/pipelines 2.16.0 backend/src/v2/driver/resolve_test.go, TestResolvePipelineJob{Create,Schedule}Time
    Placeholder; 2.15.0's resolveInputParameter has no such case and passes the constant through."""
    assert resolve_constant((2, 16, 0), placeholder, RUN, "t", 7) == expected
    assert resolve_constant((2, 15, 0), placeholder, RUN, "t", 7) == placeholder


@pytest.mark.parametrize("metadata, path, expected", [
    ({"namespace": "object-namespace"}, "metadata.namespace", "object-namespace"),
    ({"name": "object-name"}, "metadata.name", "object-name"),
    ({"labels": {"key": "value"}}, "metadata.labels", 'key="value"'),
    ({"labels": {"key": "value\n"}}, "metadata.labels", 'key="value\\n"'),
    ({"annotations": {"builder": "john-doe"}}, "metadata.annotations", 'builder="john-doe"'),
])
def test_field_paths_are_upstreams_extract_field_path_as_string(metadata, path, expected):
    """kubernetes/kubernetes pkg/fieldpath/fieldpath_test.go, TestExtractFieldPathAsString."""
    assert field_path_value(metadata, path) == expected


def test_field_path_errors_and_subscripts_are_upstreams():
    """TestExtractFieldPathAsString's invalid expression, and SplitMaybeSubscriptedPath's documented examples
    (pkg/fieldpath/fieldpath.go)."""
    with pytest.raises(ValueError, match="unsupported fieldPath"):
        field_path_value({"namespace": "object-namespace"}, "metadata.whoops")
    assert split_subscripted("metadata.annotations['myKey']") == ("metadata.annotations", "myKey", True)
    assert split_subscripted("metadata.annotations['a[b]c']") == ("metadata.annotations", "a[b]c", True)
    assert split_subscripted("metadata.labels['']") == ("metadata.labels", "", True)
    assert split_subscripted("metadata.labels") == ("metadata.labels", "", False)
    assert field_path_value({"labels": {"pipeline/runid": "r"}}, "metadata.labels['pipeline/runid']") == "r"
    assert field_path_value({"labels": {}}, "metadata.labels['pipeline/runid']") == ""  # no label: empty
    with pytest.raises(ValueError, match="invalid key subscript"):
        field_path_value({}, "metadata.labels['Not a key']")
    with pytest.raises(ValueError, match="does not support subscript"):
        field_path_value({}, "spec.nodeName['x']")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_job_uuid_placeholder_per_driver(version):
    """The problem: below 2.5.0 the driver passes the constant through as written."""
    resolved = resolve_constant(version, "{{$.pipeline_job_uuid}}", RUN, "deploy-kserve", 9)
    assert resolved == (RUN.run_id if version >= RESOLVING else "{{$.pipeline_job_uuid}}")
    assert resolve_constant(version, "plain", RUN, "deploy-kserve", 9) == "plain"


def test_the_stand_in_knows_only_the_supported_backends():
    with pytest.raises(ValueError, match="no emulation"):
        resolve_constant((2, 4, 0), "{{$.pipeline_job_uuid}}", RUN, "t", 1)


# ---------------------------------------------------------------- the compiled package on each backend


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[dict, dict]:
    """The default package as `python -m pipeline compile` writes it."""
    from pipeline.cli import _compile, _documents
    from pipeline.options import CompileOptions

    path, _, _ = _compile(tmp_path_factory.mktemp("package") / "pipeline.yaml", IMAGE, CompileOptions())
    return _documents(path)


RUNTIME = {"deploy_target": "kserve", "kserve_storage_uri": "pvc://models/embedding", "kserve_pvc_claim": "models",
           "kserve_namespace": "models", "model_version": "2.0"}


def _upstream(mar_dir: str) -> Outputs:
    """What the tasks before the deploy left in MLMD: the gates' answers and the archive."""
    mar = {"name": "mar", "type": {"schemaTitle": "system.Model", "schemaVersion": "0.0.1"}, "uri": mar_dir,
           "metadata": {"accuracy": 0.95, "open_set_rejection": 0.9, "model_name": "embedding"}}
    evaluated = {"name": "evaluated", "type": {"schemaTitle": "system.Model", "schemaVersion": "0.0.1"},
                 "uri": "/mnt/evaluated", "metadata": {"accuracy": 0.95}}
    return Outputs(parameters={"check-quality": {"Output": "pass"}, "compare-with-deployed": {"Output": "deploy"}},
                   artifacts={"archive": {"mar": [mar]}, "evaluate": {"evaluated": [evaluated]}})


@pytest.mark.parametrize("task", ["deploy-kserve", "deploy-kserve-2"])
@pytest.mark.parametrize("version", VERSIONS)
def test_both_deploy_tasks_get_the_run_id_on_every_supported_backend(package, version, task):
    spec, platform = package
    resolved = run_task(version, spec, find_path(spec, task), RUNTIME, _upstream("/mnt/mar"), RUN)
    env = container_env(pod(spec, platform, resolved, RUN))
    assert env[kfp_backend.RUN_ID_ENV] == RUN.run_id
    assert kfp_backend.run_id(resolved.parameters["run_id"], env) == RUN.run_id


def test_an_unresolved_placeholder_is_never_a_run_id():
    assert kfp_backend.run_id("{{$.pipeline_job_uuid}}", {kfp_backend.RUN_ID_ENV: "r-1"}) == "r-1"
    assert kfp_backend.run_id("local-run-3", {}) == "local-run-3"  # kfp.local resolves the placeholder itself
    with pytest.raises(ValueError, match=r"^no run id: \$KFP_RUN_ID .* '\{\{\$\.pipeline_job_uuid\}\}'"):
        kfp_backend.run_id("{{$.pipeline_job_uuid}}", {kfp_backend.RUN_ID_ENV: " "})


@pytest.mark.parametrize("version", VERSIONS)
def test_the_deploy_record_names_the_run_on_every_supported_backend(package, version, cluster, pvc, tmp_path,
                                                                    monkeypatch):
    """The pvc:// deploy task end to end: the driver's executor input and the pod's env, the component run by
    kfp.dsl.executor.Executor (as the task's container runs it), the deploy against the Kubernetes stand-in; the
    record it writes once the revision serves names the run."""
    from kfp.dsl import executor as kfp_executor
    from kfp.dsl.types import artifact_types

    from pipeline.components import deploy_kserve
    from support.kfp_driver import executor_input

    spec, platform = package
    mar_dir = tmp_path / "mar"
    mar_dir.mkdir()
    (mar_dir / "embedding.mar").write_bytes(b"PK archive bytes " * 64)
    task = run_task(version, spec, find_path(spec, "deploy-kserve-2"), RUNTIME, _upstream(str(mar_dir)), RUN)
    for name, value in container_env(pod(spec, platform, task, RUN)).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(artifact_types, "CONTAINER_TASK_ROOT", artifact_types.CONTAINER_TASK_ROOT)
    body = executor_input(spec, task, tmp_path / "root")
    kfp_executor.Executor(body, deploy_kserve.python_func).execute()

    current = record(cluster)["current"]
    assert current[ANNOTATIONS["run_id"]] == RUN.run_id, (version, task.parameters["run_id"])
    assert current[ANNOTATIONS["model_version"]] == "2.0"
    written = json.loads((tmp_path / "root" / "deploy-kserve-2" / "manifest").read_text())
    assert written["spec"]["predictor"]["model"]["storageUri"] == "pvc://models/embedding/2.0"
