"""The no-regression gate: compare the new model with the one the InferenceService actually serves.

Deploy records what it deployed (ANNOTATIONS: accuracy, open-set rejection, version, .mar SHA-256, run id, and
the storageUri) in a ConfigMap beside the InferenceService (pipeline.kserve_deploy.record), and only once the
new revision serves; the previous entry is kept for rollback. The gate reads the record back through the
Kubernetes API before the next deploy, and trusts it only when it names the storageUri the InferenceService's
spec names, or when a newer spec has not come to serve (then the recorded model still has the traffic). No
InferenceService yet means a first deploy, which passes. An API that cannot be reached, a missing permission,
no record, or a record the serving spec contradicts means the current model is unknown: the run fails on one
line unless it says `allow_unknown_current=true`. Either way the comparison and its reason are returned for
the run's report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .kserve_deploy.api import GROUP, PLURAL, VERSION, core_v1_api, custom_objects_api
from .kserve_deploy.record import RECORD_PREFIX, STORAGE_URI_KEY, read_record, record_name
from .kserve_deploy.rollout import rollout_state, served_storage_uri

#: Keys of a deploy record entry, written by deploy (after the rollout) and read by the gate.
PREFIX = RECORD_PREFIX
ANNOTATIONS = {
    "accuracy": f"{PREFIX}/accuracy",
    "open_set_rejection": f"{PREFIX}/open-set-rejection",
    "model_version": f"{PREFIX}/model-version",
    "mar_sha256": f"{PREFIX}/mar-sha256",
    "run_id": f"{PREFIX}/run-id",
}


class GateError(Exception):
    """The current model cannot be known and the run did not allow that; one line."""


@dataclass(frozen=True)
class Deployed:
    """What the deploy record says the live InferenceService serves (None: nothing deployed yet)."""

    accuracy: float | None
    open_set_rejection: float | None = None
    model_version: str = ""
    mar_sha256: str = ""
    run_id: str = ""
    storage_uri: str = ""


@dataclass(frozen=True)
class Decision:
    deploy: bool
    reason: str
    current: Deployed | None = None


def annotations_for(accuracy: float, open_set_rejection: float, model_version: str, mar_sha256: str,
                    run_id: str) -> dict[str, str]:
    """The deploy record's entry for a model (strings, as ConfigMap data requires)."""
    values = {"accuracy": f"{accuracy:.6f}", "open_set_rejection": f"{open_set_rejection:.6f}",
              "model_version": model_version, "mar_sha256": mar_sha256, "run_id": run_id}
    return {ANNOTATIONS[key]: value for key, value in values.items()}


def _number(notes: dict[str, str], key: str) -> float | None:
    try:
        return float(notes[ANNOTATIONS[key]])
    except (KeyError, TypeError, ValueError):
        return None


def deployed_from(entry: dict[str, str]) -> Deployed:
    return Deployed(_number(entry, "accuracy"), _number(entry, "open_set_rejection"),
                    entry.get(ANNOTATIONS["model_version"], ""), entry.get(ANNOTATIONS["mar_sha256"], ""),
                    entry.get(ANNOTATIONS["run_id"], ""), entry.get(STORAGE_URI_KEY, ""))


def read_deployed(namespace: str, name: str, api: Any = None, core_api: Any = None) -> Deployed | None:
    """What InferenceService namespace/name serves, from its deploy record; None when the service does not exist,
    Deployed(None) when it has no record. Raises GateError when that cannot be known."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    where = f"InferenceService {namespace}/{name}"
    record_where = f"its deploy record ConfigMap {namespace}/{record_name(name)}"
    reading = where
    try:
        api = api or custom_objects_api()
        obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        reading = record_where
        record = read_record(core_api or core_v1_api(), namespace, name)
    except ApiException as exc:
        if exc.status == 404 and reading == where:
            return None
        if exc.status in (401, 403):
            what = ("inferenceservices.serving.kserve.io" if reading == where else "configmaps")
            raise GateError(f"cannot read {reading}: {exc.status} {exc.reason} (the run's service account needs get "
                            f"on {what}: deploy/kubeflow/rbac.yaml)") from None
        raise GateError(f"cannot read {reading}: {exc.status} {exc.reason}") from None
    except (HTTPError, OSError) as exc:
        raise GateError(f"cannot reach the Kubernetes API to read {reading}: {type(exc).__name__}") from None
    except Exception as exc:  # kserve.KServeError: no credentials at all
        raise GateError(f"cannot read {reading}: {str(exc).splitlines()[0]}") from None
    if record is None or not record.current:
        return Deployed(None)
    current = deployed_from(record.current)
    spec_uri = served_storage_uri(obj)
    if current.storage_uri != spec_uri and rollout_state(obj, None)[0] == "served":
        raise GateError(f"{where} serves {spec_uri or 'no storageUri'} but {record_where} names "
                        f"{current.storage_uri or 'none'} (changed outside the pipeline?)")
    return current


def decide(accuracy: float, namespace: str, name: str, allow_unknown_current: bool, api: Any = None,
           core_api: Any = None) -> Decision:
    """Deploy when nothing is deployed or the new accuracy is not lower than the deployed one."""
    where = f"{namespace}/{name}"
    try:
        current = read_deployed(namespace, name, api, core_api)
    except GateError as exc:
        if not allow_unknown_current:
            raise GateError(f"{exc}; set allow_unknown_current=true to deploy anyway") from None
        return Decision(True, f"current model unknown ({exc}); deploying because allow_unknown_current=true")
    if current is None:
        return Decision(True, f"first deploy: no InferenceService {where} yet")
    if current.accuracy is None:
        why = f"InferenceService {where} has no deploy record with {ANNOTATIONS['accuracy']}"
        if not allow_unknown_current:
            raise GateError(f"{why}; set allow_unknown_current=true to deploy anyway")
        return Decision(True, f"{why}; deploying because allow_unknown_current=true", current)
    served = f"deployed {current.accuracy:.4f} (version {current.model_version or '?'})"
    if accuracy >= current.accuracy:
        return Decision(True, f"new accuracy {accuracy:.4f} >= {served}", current)
    return Decision(False, f"new accuracy {accuracy:.4f} < {served}: not deploying", current)


def report(decision: Decision, accuracy: float, open_set_rejection: float) -> str:
    """The gate's section of the run's Markdown report."""
    current = decision.current
    rows = [("accuracy", f"{accuracy:.4f}", f"{current.accuracy:.4f}" if current and current.accuracy is not None
             else "-"),
            ("open-set rejection", f"{open_set_rejection:.4f}",
             f"{current.open_set_rejection:.4f}" if current and current.open_set_rejection is not None else "-"),
            ("model version", "", current.model_version if current else "-"),
            ("run", "", current.run_id if current else "-")]
    table = "\n".join(f"| {name} | {new} | {old} |" for name, new, old in rows)
    verdict = "deploy" if decision.deploy else "skip"
    return (f"## No-regression gate: {verdict}\n\n{decision.reason}\n\n| | new | deployed |\n|---|---|---|\n"
            f"{table}\n")
