"""Rolling the InferenceService out: a merge patch carrying the resourceVersion it was made from, the wait until the
new spec serves (Knative revisions, or the predictor Deployment in raw mode), and the patch back when it does not."""

from __future__ import annotations

import copy
import time
from typing import Any

from ..releases import RAW_MODE_NAMES
from .api import (CONFLICT_ATTEMPTS, GROUP, PLURAL, VERSION, api_error, apps_v1_api, call, custom_objects_api,
                  read_inference_service)
from .errors import KServeError
from .manifest import KNATIVE_METRIC, KNATIVE_TARGET, TAG_ROUTING


def _predictor_status(obj: dict) -> dict:
    return ((obj.get("status") or {}).get("components") or {}).get("predictor") or {}


def served_storage_uri(obj: dict) -> str:
    """The storageUri the InferenceService's spec names (KServe reports none in status)."""
    return (((obj.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("storageUri", "")


def merge_diff(current: Any, target: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns `current` into `target`."""
    if not isinstance(current, dict) or not isinstance(target, dict):
        return copy.deepcopy(target)
    patch = {key: None for key in current if key not in target}
    for key, value in target.items():
        if key not in current or current[key] != value:
            patch[key] = merge_diff(current.get(key), value)
    return patch


def patch_isvc(api: Any, namespace: str, name: str, make: Any, existing: dict | None = None) -> tuple[dict, dict]:
    """Merge-patch the InferenceService with `make(existing)`, carrying the resourceVersion it was made from, so
    a write in between answers 409: then re-read and re-make (bounded). Returns (object patched, result)."""
    from kubernetes.client.exceptions import ApiException

    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        existing = existing if attempt == 1 and existing is not None else read_inference_service(api, namespace, name)
        if existing is None:
            raise KServeError(f"InferenceService {namespace}/{name} not found")
        body = make(existing)
        if existing["metadata"].get("resourceVersion"):
            body.setdefault("metadata", {})["resourceVersion"] = existing["metadata"]["resourceVersion"]
        try:
            return existing, call(api.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name, body)
        except ApiException as exc:
            if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


#: The InferenceService annotations deploy writes (the autoscaling target Knative reads from its revision, tag routing
#: that gives a canary its own URL): patched with the spec, and put back with it when the rollout fails. Others (the
#: user's, KServe's) are left alone.
OWNED_ANNOTATIONS = (KNATIVE_TARGET, KNATIVE_METRIC, TAG_ROUTING)
#: Optional predictor fields the manifest sets only when asked: a patch removes them when no longer asked.
OPTIONAL_PREDICTOR_KEYS = ("serviceAccountName", "imagePullSecrets", "canaryTrafficPercent")
#: The model container's probes: a JSON merge patch merges objects key by key, so a probe whose handler changed
#: (an older release's tcpSocket readiness, now httpGet) would keep the old handler beside the new one, and KServe's
#: pod would carry two. The patch names what the probe no longer has as null.
PROBE_KEYS = ("readinessProbe", "livenessProbe", "startupProbe")


def deploy_patch(manifest: dict, existing: dict) -> dict:
    spec = copy.deepcopy(manifest["spec"])
    old = (existing.get("spec") or {}).get("predictor") or {}
    for key in OPTIONAL_PREDICTOR_KEYS:
        if key in old and key not in spec["predictor"]:
            spec["predictor"][key] = None
    old_model, model = old.get("model") or {}, spec["predictor"]["model"]
    if "runtime" in old_model and "runtime" not in model:
        model["runtime"] = None
    for key in PROBE_KEYS:
        if isinstance(old_model.get(key), dict):
            model[key] = merge_diff(old_model[key], model[key]) if key in model else None
    owned = {key: value for key, value in (manifest["metadata"].get("annotations") or {}).items()
             if key in OWNED_ANNOTATIONS}
    return {"metadata": {"labels": dict(manifest["metadata"].get("labels") or {}), "annotations": owned},
            "spec": spec}


def owned_annotations_patch(current: dict, wanted: dict[str, str]) -> dict[str, str | None]:
    """The merge patch that gives the InferenceService `current` the OWNED_ANNOTATIONS values of `wanted` (null
    removes one wanted lacks); {} when they already agree."""
    now = current["metadata"].get("annotations") or {}
    return {key: wanted.get(key) for key in OWNED_ANNOTATIONS if now.get(key) != wanted.get(key)}


def revert_patch(before: dict) -> Any:
    def make(current: dict) -> dict:
        patch = merge_diff({"labels": current["metadata"].get("labels") or {}, "spec": current.get("spec") or {}},
                            {"labels": before["metadata"].get("labels") or {}, "spec": before.get("spec") or {}})
        notes = owned_annotations_patch(current, before["metadata"].get("annotations") or {})
        return {"metadata": {"labels": patch.pop("labels", {}), **({"annotations": notes} if notes else {})}, **patch}
    return make


#: KServe's deployment mode without Knative: a Deployment per component, no revisions.
MODE_ANNOTATION = "serving.kserve.io/deploymentMode"


def is_raw(obj: dict) -> bool:
    """Raw deployment mode: status.deploymentMode (KServe 0.15) or the annotation its webhook sets (0.13 on), under
    either name (0.16 calls it Standard and still accepts RawDeployment)."""
    notes = (obj.get("metadata") or {}).get("annotations") or {}
    return bool(RAW_MODE_NAMES & {(obj.get("status") or {}).get("deploymentMode"), notes.get(MODE_ANNOTATION)})


def rollout_state(obj: dict, before: dict | None) -> tuple[str, str]:
    """("served" | "failed" | "pending", why) of the InferenceService's newest spec, as far as its status tells.

    `before` is the object as read before a write that changed its spec (None: wait for the spec as it is).
    What KServe 0.13-0.15 report decides, read from their source: status.observedGeneration is copied from the
    Knative Service (serverless) or the Deployment (raw), not the InferenceService's own generation, and status
    names no storageUri. Serverless: a latestCreatedRevision new since `before` that is the latestReadyRevision
    holding all traffic, with Ready True; Ready False with reason RevisionFailed (Knative's verdict on the latest
    created revision) fails at once. Raw: observedGeneration (or 0.13-0.14's latestCreatedRevision, the
    Deployment's revision) must have moved since `before` and Ready be True; Ready there is the Deployment's
    Available, which old pods keep True, so wait_ready then asks the Deployment itself.
    """
    status = obj.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    predictor = _predictor_status(obj)
    created = predictor.get("latestCreatedRevision")
    raw = is_raw(obj)
    if before is not None:
        old, old_status = _predictor_status(before), before.get("status") or {}
        if raw or not (created or old.get("latestCreatedRevision")):
            pairs = [(status.get("observedGeneration"), old_status.get("observedGeneration")),
                     (created, old.get("latestCreatedRevision"))]
            known = [(new, was) for new, was in pairs if was is not None]
            if known and all(new == was for new, was in known):
                return "pending", "KServe has not updated the predictor Deployment yet"
        elif created in (None, old.get("latestCreatedRevision")):
            return "pending", f"KServe has not created a revision for the new spec yet (latest {created})"
    why = ready.get("message") or ready.get("reason") or "no Ready condition yet"
    if raw:
        return ("served", "") if ready.get("status") == "True" else ("pending", why)
    if ready.get("status") == "False" and ready.get("reason") == "RevisionFailed":
        return "failed", why
    latest = predictor.get("latestReadyRevision")
    if ready.get("status") != "True" and (ready.get("message") or ready.get("reason")):
        return "pending", why
    if created and latest != created:
        return "pending", f"revision {created} is not ready yet (traffic on {latest or 'none'})"
    if ready.get("status") != "True":
        return "pending", why
    share = sum(t.get("percent") or 0 for t in predictor.get("traffic") or [] if t.get("revisionName") == latest)
    if predictor.get("traffic") and share != 100:
        return "pending", f"revision {latest} has {share}% of the traffic"
    return "served", latest or ""



def deployment_state(apps: Any, namespace: str, name: str) -> tuple[str, str]:
    """The rollout of the predictor Deployment KServe made for InferenceService `name`, judged as `kubectl rollout
    status` judges it: observed, every replica updated, no old replica left, every updated replica available."""
    from kubernetes.client.exceptions import ApiException

    for deployment_name in (f"{name}-predictor", f"{name}-predictor-default"):  # the second: KServe before 0.10
        try:
            deployment = call(apps.read_namespaced_deployment, deployment_name, namespace)
            break
        except ApiException as exc:
            if exc.status in (401, 403):
                raise KServeError(f"cannot read Deployment {namespace}/{deployment_name}: {api_error(exc)} (needs "
                                  "get on deployments.apps: deploy/kubeflow/rbac.yaml)") from None
            if exc.status != 404:
                raise
    else:
        return "pending", f"no predictor Deployment {namespace}/{name}-predictor yet"
    where, spec, status = f"Deployment {namespace}/{deployment_name}", deployment.spec, deployment.status
    if (deployment.metadata.generation or 0) > (status.observed_generation or 0):
        return "pending", f"{where}: its new spec is not observed yet"
    progressing = next((c for c in status.conditions or [] if c.type == "Progressing"), None)
    if progressing is not None and progressing.reason == "ProgressDeadlineExceeded":
        return "failed", f"{where} exceeded its progress deadline: {progressing.message or ''}".rstrip(": ")
    wanted, updated = spec.replicas if spec.replicas is not None else 1, status.updated_replicas or 0
    if updated < wanted:
        return "pending", f"{where}: {updated} of {wanted} replicas updated"
    if (status.replicas or 0) > updated:
        return "pending", f"{where}: {(status.replicas or 0) - updated} old replicas still running"
    if (status.available_replicas or 0) < updated:
        return "pending", f"{where}: {status.available_replicas or 0} of {updated} updated replicas available"
    return "served", deployment_name


def wait_ready(api: Any, namespace: str, name: str, before: dict | None, timeout_s: float,
               poll_s: float = 5.0, apps_api: Any = None, state_of: Any = rollout_state) -> dict:
    """Poll until the newest spec serves (`state_of`: rollout_state, and deployment_state in raw mode); KServeError
    on a failed revision or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        obj = read_inference_service(api, namespace, name)
        if obj is None:
            raise KServeError(f"InferenceService {namespace}/{name} disappeared while rolling out")
        state, why = state_of(obj, before)
        if state == "served" and is_raw(obj):
            apps_api = apps_api or apps_v1_api()
            state, why = deployment_state(apps_api, namespace, name)
        if state == "served":
            return obj
        if state == "failed":
            raise KServeError(f"InferenceService {namespace}/{name}: rollout failed: {why}")
        if time.monotonic() >= deadline:
            raise KServeError(f"InferenceService {namespace}/{name} not Ready after {timeout_s:.0f}s: {why}")
        time.sleep(poll_s)


def roll_out(api: Any, namespace: str, name: str, make: Any, timeout_s: float, poll_s: float,
             create: dict | None = None) -> dict:
    """Write the InferenceService (merge patch `make(existing)`, or create `create` when there is none) and wait
    until the new spec serves. When it does not (failed revision, deadline, interrupt), the spec is patched back
    to what it was, so it never names a version that did not come to serve; KServeError says so on one line."""
    from kubernetes.client.exceptions import ApiException

    where = f"InferenceService {namespace}/{name}"
    try:
        before = read_inference_service(api, namespace, name)
        if before is None and create is not None:
            try:
                call(api.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, create)
                return wait_ready(api, namespace, name, None, timeout_s, poll_s)
            except ApiException as exc:
                if exc.status != 409:  # created meanwhile (or by a lost answer): patch it instead
                    raise
            before = None
        # The object as first read stays the baseline: when a write is stored but its answer lost, the retry's
        # 409 re-read already holds the new spec, and comparing with it would hide the change.
        original = before
        before, patched = patch_isvc(api, namespace, name, make, before)
        before = original or before
    except ApiException as exc:
        raise KServeError(f"{where}: {api_error(exc)}") from None
    changed = patched["metadata"].get("generation") != before["metadata"].get("generation")
    try:
        return wait_ready(api, namespace, name, before if changed else None, timeout_s, poll_s)
    except (KServeError, ApiException, KeyboardInterrupt) as exc:
        failure = (f"{where}: {api_error(exc)}" if isinstance(exc, ApiException) else
                   f"{where}: interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc))
        if changed:
            old = served_storage_uri(before) or "its previous spec"
            try:
                patch_isvc(api, namespace, name, revert_patch(before))
            except (ApiException, KServeError) as revert:
                detail = api_error(revert) if isinstance(revert, ApiException) else str(revert)
                raise KServeError(f"{failure}; putting the spec back on {old} failed too ({detail}): the spec names "
                                  "a version that does not serve") from None
            failure = f"{failure}; spec put back on {old}"
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise KServeError(failure) from None


def apply(manifest: dict, timeout_s: float = 600.0, api: Any = None, poll_s: float = 5.0) -> dict:
    """Create the InferenceService, or merge-patch the existing one, then wait until the new spec serves."""
    api = api or custom_objects_api()
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    return roll_out(api, namespace, name, lambda existing: deploy_patch(manifest, existing), timeout_s, poll_s,
                    create=manifest)
