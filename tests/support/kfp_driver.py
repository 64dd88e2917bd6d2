"""What a Kubeflow Pipelines v2 backend hands a task of a compiled package, per supported backend version: the
executor input the driver resolves, the pod it runs in, and the environment the kubelet gives that pod's container.

Written from kubeflow/pipelines' source at each tag of pipeline.releases (2.3.0, 2.4.1, 2.5.0, 2.15.0, 2.16.0),
read with `git show TAG:path`; tests/unit/test_run_id.py checks each piece against upstream's own test cases where
they exist. The pieces, composed in `run_task`:

- ``resolve_constant``: the driver's handling of a task input that is a constant (`runtimeValue.constant`), where
  the SDK puts dsl.PIPELINE_JOB_ID_PLACEHOLDER and its siblings.
  2.3.0 and 2.4.1: backend/src/v2/driver/driver.go, resolveInputs, case TaskInputsSpec_InputParameterSpec_RuntimeValue:
  the constant is the parameter's value as written (`inputs.ParameterValues[name] = runtimeValue.GetConstant()`), so
  `{{$.pipeline_job_uuid}}` reaches the component as those 19 characters.
  2.5.0: driver.go, resolveInputParameter, same case: a constant that is exactly one of five placeholders becomes
  the run's display name (pipeline_job_name), Argo Workflow name (pipeline_job_resource_name), run id
  (pipeline_job_uuid), the task's name (pipeline_task_name) or its DAG execution id (pipeline_task_uuid).
  2.15.0: resolve.go, resolveInputParameter: the same five, and first `{{$.workspace_path}}` anywhere in the string
  (component.WorkspaceMountPath, "/kfp-workspace"). 2.16.0: resolve.go, the same plus pipeline_job_create_time_utc
  and pipeline_job_schedule_time_utc (upstream's cases: resolve_test.go, TestResolvePipelineJob*TimePlaceholder).
- ``resolve_inputs``: the rest of resolveInputs at every tag: componentInputParameter from the parent DAG's
  parameters, taskOutputParameter from the producer task's outputs (MLMD there, `outputs` here), artifacts from
  componentInputArtifact / taskOutputArtifact; DAG tasks (conditions) are resolved the same way on the way down.
  Trigger conditions are not evaluated: the caller names the branch (`path`).
- ``provision_outputs``: driver.go provisionOutputs (2.3.0): one output artifact URI per output under the pipeline
  root, <root>/<task>/<output> (metadata.GenerateOutputURI), parameter files per output, the executor's output file.
  Here the root and the files are under a directory the caller gives (upstream: the bucket, /tmp/kfp/outputs).
- ``pod``: the main container's env, from driver.go initPodSpecPatch (the container spec's env, name and value) then
  extendPodSpecPatch (2.3.0 and 2.4.1 driver.go; k8s.go from 2.15.0): secretAsEnv (secretKeyRef), configMapAsEnv
  (configMapKeyRef), fieldPathAsEnv (fieldRef), in that order (upstream's cases: driver_test.go / k8s_test.go,
  Test_extendPodSpecPatch_FieldPathAsEnv). Its labels: what the KFP API server sets on the Workflow's
  spec.podMetadata (backend/src/apiserver/template/v2_template.go, RunWorkflow: SetPodMetadataLabels(
  util.LabelKeyWorkflowRunId = "pipeline/runid", options.RunId), the same at every tag), which Argo copies onto
  every pod it creates beside its own workflow label (argoproj/argo-workflows workflow/controller/workflowpod.go,
  createWorkflowPod and addMetadata: Spec.PodMetadata.Labels into pod.Labels; LabelKeyWorkflow
  "workflows.argoproj.io/workflow" = the Workflow's name).
- ``container_env``: the kubelet's values for that env: `value` as is, `fieldRef` through
  ExtractFieldPathAsString (kubernetes/kubernetes pkg/fieldpath/fieldpath.go: metadata.name, .namespace, .uid, and
  metadata.labels['<key>'] / metadata.annotations['<key>'] split by SplitMaybeSubscriptedPath, the key checked as
  a qualified name, a missing key giving ""; the paths the API documents for env in k8s.io/api core/v1/types.go,
  EnvVarSource.FieldRef, at v0.32.3), `secretKeyRef` from the Secrets given.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.releases import KFP_VERSIONS, Version

WORKSPACE_MOUNT_PATH = "/kfp-workspace"
RUN_ID_LABEL = "pipeline/runid"  # util.LabelKeyWorkflowRunId
ARGO_WORKFLOW_LABEL = "workflows.argoproj.io/workflow"  # common.LabelKeyWorkflow


@dataclass(frozen=True)
class Run:
    """One KFP run as the API server knows it."""

    run_id: str  # the run's UUID: options.RunId
    display_name: str  # the run's name in the UI: RunDisplayName
    resource_name: str  # the Argo Workflow's name: RunName
    namespace: str = "kubeflow-user"
    create_time: str = "2026-01-09T12:34:56Z"
    schedule_time: str = "2026-01-09T13:00:00Z"


@dataclass
class Task:
    """What the container driver hands the launcher for one task."""

    name: str
    component: str
    executor: str
    dag_execution_id: int
    parameters: dict[str, Any]
    artifacts: dict[str, list[dict]]


@dataclass
class Outputs:
    """Upstream tasks' outputs as MLMD would hold them: task name -> output name -> value / artifact list."""

    parameters: dict[str, dict[str, Any]] = field(default_factory=dict)
    artifacts: dict[str, dict[str, list[dict]]] = field(default_factory=dict)


class DriverError(ValueError):
    """A task the driver would fail."""


def _supported(version: Version) -> None:
    if version not in KFP_VERSIONS:
        raise ValueError(f"no emulation of KFP backend {version}: only pipeline.releases' {KFP_VERSIONS}")


def resolve_constant(version: Version, value: Any, run: Run, task_name: str, dag_execution_id: int) -> Any:
    """A `runtimeValue.constant` input as the driver of `version` passes it to the task."""
    _supported(version)
    if version < (2, 5, 0) or not isinstance(value, str):
        return value
    if version >= (2, 15, 0) and "{{$.workspace_path}}" in value:
        return value.replace("{{$.workspace_path}}", WORKSPACE_MOUNT_PATH)
    exact = {"{{$.pipeline_job_name}}": run.display_name, "{{$.pipeline_job_resource_name}}": run.resource_name,
             "{{$.pipeline_job_uuid}}": run.run_id, "{{$.pipeline_task_name}}": task_name,
             "{{$.pipeline_task_uuid}}": str(dag_execution_id)}
    if version >= (2, 16, 0):
        exact.update({"{{$.pipeline_job_create_time_utc}}": run.create_time,
                      "{{$.pipeline_job_schedule_time_utc}}": run.schedule_time})
    return exact.get(value, value)


def _component(spec: dict, name: str) -> dict:
    return spec["root"] if name == "root" else spec["components"][name]


def resolve_inputs(version: Version, task_spec: dict, task_name: str, parent: dict[str, Any],
                   parent_artifacts: dict[str, list[dict]], outputs: Outputs, run: Run,
                   dag_execution_id: int) -> tuple[dict[str, Any], dict[str, list[dict]]]:
    """(parameters, artifacts) of one task of a DAG whose own inputs are `parent` / `parent_artifacts`."""
    params: dict[str, Any] = {}
    for name, source in task_spec.get("inputs", {}).get("parameters", {}).items():
        if "componentInputParameter" in source:
            key = source["componentInputParameter"]
            if key not in parent:
                raise DriverError(f"{task_name}: parent DAG does not have input parameter {key}")
            params[name] = parent[key]
        elif "taskOutputParameter" in source:
            producer, key = source["taskOutputParameter"]["producerTask"], \
                source["taskOutputParameter"]["outputParameterKey"]
            try:
                params[name] = outputs.parameters[producer][key]
            except KeyError:
                raise DriverError(f"{task_name}: cannot find output parameter {key} of {producer}") from None
        elif "runtimeValue" in source:
            params[name] = resolve_constant(version, source["runtimeValue"]["constant"], run, task_name,
                                            dag_execution_id)
        else:
            raise DriverError(f"{task_name}: parameter spec {source} not implemented")
    artifacts: dict[str, list[dict]] = {}
    for name, source in task_spec.get("inputs", {}).get("artifacts", {}).items():
        if "componentInputArtifact" in source:
            artifacts[name] = parent_artifacts[source["componentInputArtifact"]]
        else:
            producer = source["taskOutputArtifact"]["producerTask"]
            artifacts[name] = outputs.artifacts[producer][source["taskOutputArtifact"]["outputArtifactKey"]]
    return params, artifacts


def root_parameters(spec: dict, runtime: dict[str, Any]) -> dict[str, Any]:
    """The root DAG's parameters: the run's runtime config over the spec's defaults (RootDAG in driver.go)."""
    declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    values = {name: body["defaultValue"] for name, body in declared.items() if "defaultValue" in body}
    values.update(runtime)
    missing = sorted(name for name, body in declared.items() if name not in values and not body.get("isOptional"))
    if missing:
        raise DriverError(f"root: no value for {', '.join(missing)}")
    return values


def find_path(spec: dict, task_name: str) -> list[str]:
    """The task names from the root DAG down to `task_name` (KFP names every task of a package uniquely)."""
    def walk(component: str, trail: list[str]) -> list[str] | None:
        for name, body in _component(spec, component)["dag"]["tasks"].items():
            ref = body["componentRef"]["name"]
            if name == task_name:
                return [*trail, name]
            if "dag" in spec["components"][ref]:
                found = walk(ref, [*trail, name])
                if found:
                    return found
        return None

    path = walk("root", [])
    if path is None:
        raise KeyError(task_name)
    return path


def run_task(version: Version, spec: dict, path: list[str], runtime: dict[str, Any], outputs: Outputs,
             run: Run) -> Task:
    """The container task at the end of `path` (task names from the root DAG down through condition DAGs), its
    inputs resolved at every level as the DAG drivers and the container driver of `version` resolve them."""
    _supported(version)
    params, artifacts = root_parameters(spec, runtime), {}
    component = "root"
    for depth, name in enumerate(path, start=1):
        task_spec = _component(spec, component)["dag"]["tasks"][name]
        params, artifacts = resolve_inputs(version, task_spec, name, params, artifacts, outputs, run, depth)
        component = task_spec["componentRef"]["name"]
    body = _component(spec, component)
    if "executorLabel" not in body:
        raise DriverError(f"{path[-1]} is a DAG, not a container task")
    return Task(path[-1], component, body["executorLabel"], len(path), params, artifacts)


def provision_outputs(spec: dict, task: Task, root: Path) -> dict:
    """ExecutorInput.outputs for `task` under `root` (provisionOutputs)."""
    declared = _component(spec, task.component).get("outputDefinitions", {})
    return {"artifacts": {name: {"artifacts": [{"name": name, "type": body["artifactType"],
                                                "uri": str(root / task.name / name), "metadata": {}}]}
                          for name, body in declared.get("artifacts", {}).items()},
            "parameters": {name: {"outputFile": str(root / "outputs" / task.name / name)}
                           for name in declared.get("parameters", {})},
            "outputFile": str(root / "outputs" / task.name / "output_metadata.json")}


def executor_input(spec: dict, task: Task, root: Path) -> dict:
    """The ExecutorInput JSON the launcher passes the component's executor (kfp.dsl.executor.Executor)."""
    return {"inputs": {"parameterValues": copy.deepcopy(task.parameters),
                       "artifacts": {name: {"artifacts": copy.deepcopy(items)}
                                     for name, items in task.artifacts.items()}},
            "outputs": provision_outputs(spec, task, root)}


def pod(spec: dict, platform: dict, task: Task, run: Run) -> dict:
    """The task's pod, as far as the run id and the environment go: metadata, and the main container's env."""
    container = spec["deploymentSpec"]["executors"][task.executor]["container"]
    config = platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}) \
        .get("executors", {}).get(task.executor, {})
    env: list[dict] = [{"name": e["name"], "value": e.get("value", "")} for e in container.get("env", [])]
    for secret in config.get("secretAsEnv", []):
        for pair in secret.get("keyToEnv", []):
            env.append({"name": pair["envVar"], "valueFrom": {"secretKeyRef": {
                "name": secret["secretName"], "key": pair["secretKey"], "optional": secret.get("optional")}}})
    for config_map in config.get("configMapAsEnv", []):
        for pair in config_map.get("keyToEnv", []):
            env.append({"name": pair["envVar"], "valueFrom": {"configMapKeyRef": {
                "name": config_map["configMapName"], "key": pair["configMapKey"]}}})
    for item in config.get("fieldPathAsEnv", []):
        env.append({"name": item["name"], "valueFrom": {"fieldRef": {"fieldPath": item["fieldPath"]}}})
    labels = {ARGO_WORKFLOW_LABEL: run.resource_name, "workflows.argoproj.io/completed": "false",
              RUN_ID_LABEL: run.run_id}
    return {"metadata": {"name": f"{run.resource_name}-{task.name}", "namespace": run.namespace,
                         "uid": "0f0e0d0c-0000-4000-8000-000000000001", "labels": labels, "annotations": {}},
            "spec": {"containers": [{"name": "main", "image": container["image"], "env": env}]}}


# apimachinery's IsQualifiedName: an optional DNS-1123 subdomain prefix and "/", then a name of at most 63 characters.
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return False
    return bool(name) and len(name) <= 63 and bool(_NAME.match(name))


def split_subscripted(path: str) -> tuple[str, str, bool]:
    """SplitMaybeSubscriptedPath: "a.b['k']" -> ("a.b", "k", True); otherwise (path, "", False)."""
    if not path.endswith("']"):
        return path, "", False
    head, sep, key = path[:-2].partition("['")
    if not sep or not head:
        return path, "", False
    return head, key, True


def field_path_value(metadata: dict, path: str) -> str:
    """ExtractFieldPathAsString on a pod's metadata; ValueError where Kubernetes errs."""
    head, key, subscripted = split_subscripted(path)
    if subscripted:
        if head not in ("metadata.labels", "metadata.annotations"):
            raise ValueError(f"fieldPath {path!r} does not support subscript")
        if not qualified_name(key.lower() if head == "metadata.annotations" else key):
            raise ValueError(f"invalid key subscript in {path}")
        return (metadata.get(head.split(".")[1]) or {}).get(key, "")
    if path in ("metadata.labels", "metadata.annotations"):
        values = metadata.get(path.split(".")[1]) or {}
        return "\n".join(f"{k}={json.dumps(values[k])}" for k in sorted(values))  # FormatMap's %q
    if path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return metadata.get(path.split(".")[1], "")
    raise ValueError(f"unsupported fieldPath: {path}")


def container_env(pod_spec: dict, secrets: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    """The main container's environment as the kubelet sets it."""
    secrets = secrets or {}
    (main,) = [c for c in pod_spec["spec"]["containers"] if c["name"] == "main"]
    env: dict[str, str] = {}
    for var in main.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = var.get("value", "")
        elif "fieldRef" in source:
            env[var["name"]] = field_path_value(pod_spec["metadata"], source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secrets.get(ref["name"], {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise ValueError(f"secret {ref['name']} key {ref['key']} not found (CreateContainerConfigError)")
            if value is not None:
                env[var["name"]] = value
        else:
            raise ValueError(f"{var['name']}: no emulation of {sorted(source)}")
    return env
