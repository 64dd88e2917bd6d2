"""Which Kubeflow Pipelines backends a compiled package runs on: the one table of minimum versions.

A backend reads the package strictly: its API server unmarshals the pipeline and platform specs, and its
driver each task's Kubernetes config, with protobuf messages vendored at release time, and a field those
messages lack fails the run ("unknown field ... in kfp_kubernetes.SecretAsEnv"). The SDK writes newer fields
even for constant values (`secretNameParameter` beside `secretName`, `resourceCpuLimit` beside `cpuLimit`),
so `for_oldest` drops each such twin where the older field says the same: every backend from 2.4 on reads the
older field when the newer one is absent. What is left names the backend it needs (`required`).

The run id: a task learns its KFP run's id from its pod's `pipeline/runid` label (see RUN_ID_LABEL), not from
`{{$.pipeline_job_uuid}}`, which only drivers from 2.5.0 on resolve.

Nothing here imports kfp: `python -m pipeline submit` checks the backend before anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from . import releases
from .releases import Version

#: The oldest backend the default package runs on: the oldest in pipeline.releases (Kubeflow 1.9.1's). Its API
#: server's and driver's messages are those of requirements/kfp-oldest.txt; tests/integration/test_backend_compat.py
#: parses every package with them. The pipeline image (uid 10001) needs less: launchers before 2.0.2 create artifact
#: directories with mode 0644, which a non-root user cannot enter; those before 2.3.0 mount no emptyDir at /gcs,
#: /minio and /s3, so the image pre-creates them.
OLDEST: Version = releases.OLDEST.kfp

#: The label the KFP API server puts on every pod of a run, holding the run's id: RunWorkflow sets it on the
#: Workflow's spec.podMetadata (backend/src/apiserver/template/v2_template.go, SetPodMetadataLabels with
#: util.LabelKeyWorkflowRunId = "pipeline/runid"), as the ScheduledWorkflow controller does for recurring runs
#: (backend/src/crd/controller/scheduledworkflow/util/scheduled_workflow.go), at kubeflow/pipelines 2.3.0 through
#: 2.16.0. It is the value the 2.5.0+ drivers give {{$.pipeline_job_uuid}} (their --run_id, {{workflow.uid}},
#: which the API server replaces with the same run id: Workflow.ReplaceUID).
RUN_ID_LABEL = "pipeline/runid"
#: The deploy task's environment variable holding it, through the Kubernetes downward API
#: (kfp.kubernetes.use_field_path_as_env: KubernetesExecutorConfig.field_path_as_env, which every driver from
#: 2.3.0 on turns into an env var with a fieldRef: extendPodSpecPatch in backend/src/v2/driver/driver.go).
RUN_ID_ENV = "KFP_RUN_ID"
RUN_ID_FIELD_PATH = f"metadata.labels['{RUN_ID_LABEL}']"
_UNRESOLVED = re.compile(r"\{\{\$[^}]*\}\}")


@dataclass(frozen=True)
class Feature:
    since: Version
    what: str  # what in the package needs it, for the one-line refusal


#: Fields newer than OLDEST, keyed by (message, field) as the compiled YAML spells them.
FEATURES: dict[tuple[str, str], Feature] = {
    ("secretAsEnv", "secretNameParameter"): Feature((2, 5, 0), "a Secret's name from a run parameter"),
    ("secretAsVolume", "secretNameParameter"): Feature((2, 5, 0), "a Secret's name from a run parameter"),
    ("imagePullSecret", "secretNameParameter"): Feature((2, 5, 0), "an image pull secret from a run parameter"),
    ("pvcMount", "pvcNameParameter"): Feature((2, 5, 0), "a claim name as pvcNameParameter"),
    ("secretAsEnv", "optional"): Feature((2, 15, 0), "an optional Secret as environment variables"),
    **{("resources", name): Feature((2, 4, 0), "task resources from a run parameter")
       for name in ("resourceCpuLimit", "resourceCpuRequest", "resourceMemoryLimit", "resourceMemoryRequest")},
}

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")
#: Newer field -> its older twin, in the messages where the SDK writes both.
_SECRET_TWINS = {"secretAsEnv": "secretName", "secretAsVolume": "secretName", "imagePullSecret": "secretName"}
_PVC_OLD = ("constant", "componentInputParameter", "taskOutputParameter")
_RESOURCE_TWINS = {"resourceCpuLimit": "cpuLimit", "resourceCpuRequest": "cpuRequest",
                   "resourceMemoryLimit": "memoryLimit", "resourceMemoryRequest": "memoryRequest"}


def parse_version(tag_name: object) -> Version | None:
    """(major, minor, patch) of a healthz `tag_name` such as "2.3.0" or "v2.0.5"; None if it names none."""
    match = _VERSION.match(tag_name) if isinstance(tag_name, str) else None
    return tuple(int(g) for g in match.groups()) if match else None  # type: ignore[return-value]


def version_text(version: Version) -> str:
    return ".".join(map(str, version))


def executor_configs(platform: dict) -> dict[str, dict]:
    """Each executor's Kubernetes config (what the driver unmarshals) from the package's platform spec."""
    return platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})


def _fields(spec: dict, platform: dict) -> Iterator[tuple[str, str, str, dict]]:
    """(executor, message, field, the message) for each message that may carry a field of FEATURES."""
    for executor, config in executor_configs(platform).items():
        for message in ("secretAsEnv", "secretAsVolume", "imagePullSecret", "pvcMount"):
            for item in config.get(message, []):
                for name in item:
                    yield executor, message, name, item
    for executor, body in spec.get("deploymentSpec", {}).get("executors", {}).items():
        resources = body.get("container", {}).get("resources", {})
        for name in resources:
            yield executor, "resources", name, resources


def needs(spec: dict, platform: dict) -> list[tuple[Feature, str]]:
    """The features newer than OLDEST the package uses, each with the first executor that uses it."""
    found: dict[Feature, str] = {}
    for executor, message, name, _ in _fields(spec, platform):
        feature = FEATURES.get((message, name))
        if feature and feature.since > OLDEST:
            found.setdefault(feature, executor)
    return sorted(found.items(), key=lambda item: item[0].since, reverse=True)


def required(spec: dict, platform: dict) -> tuple[Version, str]:
    """The oldest backend that reads the package, and why (the newest feature it uses, or the floor)."""
    used = needs(spec, platform)
    if not used:
        return OLDEST, "the oldest backend this pipeline supports"
    feature, executor = used[0]
    return feature.since, f"{feature.what} ({executor})"


def _same_constant(parameter: Any, value: Any) -> bool:
    return isinstance(parameter, dict) and parameter == {"runtimeValue": {"constant": value}}


def for_oldest(spec: dict, platform: dict) -> None:
    """Drop, in place, each newer field whose older twin holds the same value (see the module's docstring)."""
    for _, message, name, item in list(_fields(spec, platform)):
        if name not in item:
            continue
        if message in _SECRET_TWINS and name == "secretNameParameter":
            if _same_constant(item[name], item.get(_SECRET_TWINS[message])):
                del item[name]
        elif message == "pvcMount" and name == "pvcNameParameter":
            old = [key for key in _PVC_OLD if key in item]
            if len(old) == 1 and _pvc_same(item[name], old[0], item[old[0]]):
                del item[name]
        elif message == "resources" and name in _RESOURCE_TWINS:
            value, old = item[name], item.get(_RESOURCE_TWINS[name])
            if isinstance(value, str) and not value.startswith("{{") and _same_quantity(name, value, old):
                del item[name]


def _same_quantity(name: str, text: str, old: Any) -> bool:
    """Whether the string quantity of a newer resource field is the number its older twin holds (kfp's own
    conversions: cores for CPU, GB for memory)."""
    from kfp.compiler.compiler_utils import _cpu_to_float, _memory_to_float

    if not isinstance(old, (int, float)):
        return False
    try:
        number = (_cpu_to_float if "Cpu" in name else _memory_to_float)(text)
    except ValueError:
        return False
    return abs(number - old) <= 1e-9 * max(1.0, abs(old))


def _pvc_same(parameter: dict, old: str, value: Any) -> bool:
    if old == "constant":
        return _same_constant(parameter, value)
    if old == "componentInputParameter":
        return parameter == {"componentInputParameter": value}
    return parameter == {"taskOutputParameter": value}


def run_id(passed: str, environ: Mapping[str, str]) -> str:
    """The KFP run id of the task: RUN_ID_ENV where the pod has it (every supported backend), else `passed` (the
    run_id input, {{$.pipeline_job_uuid}}: kfp.local resolves it). ValueError, one line, when neither names a run:
    a deploy record must not carry an unresolved placeholder."""
    from_label = (environ.get(RUN_ID_ENV) or "").strip()
    if from_label:
        return from_label
    if passed and not _UNRESOLVED.search(passed):
        return passed
    raise ValueError(f"no run id: ${RUN_ID_ENV} (the pod's {RUN_ID_LABEL} label) is not set and run_id is "
                     f"{passed!r}; the backend resolved neither")
