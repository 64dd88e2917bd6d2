"""Deploy target `kserve`: the model store KServe's TorchServe runtime reads, and the InferenceService.

KServe's storage initializer copies `storageUri` to /mnt/models; the project's ServingRuntime
(deploy/kserve/servingruntime.yaml, the serving image) then runs `python -m serving.kserve_runtime`, which
starts TorchServe with `/mnt/models/config/config.properties` on loopback and answers KServe's v1 and
Open Inference v2 REST paths on port 8080. So each version is written as

    <storage_uri>/<version>/config/config.properties
    <storage_uri>/<version>/model-store/<model_name>.mar

and rolling forward means writing the next version beside it and patching the same
InferenceService's storageUri, which makes KServe start a new revision and shift traffic once it is Ready.
Deploy patches only after every file is uploaded, waits until the new revision serves (rollout_state), puts
the spec back when it does not, and only then records the version in a ConfigMap beside the service
(record_name), which the gate (pipeline.gate) and rollback (pipeline.rollback) read.

The package follows those steps, one module each: `layout` (the runtime's config.properties and the staged
layout), `publish` (writing it to storage), `manifest` (the InferenceService), `api` (the Kubernetes clients and
retries), `rollout` (patch, wait, put back), `record` (the deploy record), `claims` (pvc:// rules); `deploy` below
runs them in order. The names callers use are re-exported here.
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from settings import service_name_for

from .api import (API_ATTEMPTS, API_BACKOFF_S, CONFLICT_ATTEMPTS, GROUP, NAMESPACE_FILE, PLURAL, VERSION, api_client,
                  api_error, apps_v1_api, call, core_v1_api, custom_objects_api, own_namespace,
                  read_inference_service, resolve_namespace)
from .candidate import checker
from .canary import Canary, canary_reason, roll_out_canary
from .claims import check_claim
from .errors import KServeError
from .layout import (CONFIG_PATH, INFERENCE_PORT, METRICS_PORT, MODEL_STORE_MOUNT, SNAPSHOT_KEYS, STORE_DIR,
                     TORCHSERVE_METRICS_PORT, model_snapshot, runtime_properties, stage_layout)
from .manifest import (API_KEY_ENV, DEFAULT_API_KEY_SECRET, DEFAULT_RUNTIME, GRPC_PROTOCOL, LIVE_PATH, PREDICTOR_CPU,
                       PREDICTOR_MEMORY, PROTOCOLS, READY_PATH, Scaling, cluster_runtime, inference_service,
                       predictor_endpoint)
from .publish import CLUSTER_SCHEMES, local_path, publish, storage_uri, versioned
from .record import (LOCK_KEY, LOCK_SLACK_S, RECORD_HISTORY, RECORD_PREFIX, REVISION_KEY, STORAGE_URI_KEY, Record,
                     deploy_lock, read_record, record_name, record_served, revision_entry, write_record)
from .rollout import (MODE_ANNOTATION, OWNED_ANNOTATIONS, apply, deployment_state, is_raw, roll_out, rollout_state,
                      served_storage_uri, wait_ready)

#: Settings that tests patch (NAMESPACE_FILE, API_BACKOFF_S) are read in their own module (kserve_deploy.api):
#: patch them there; these names are copies.
__all__ = ["API_ATTEMPTS", "API_BACKOFF_S", "API_KEY_ENV", "CLUSTER_SCHEMES", "Canary", "CONFIG_PATH", "CONFLICT_ATTEMPTS",
           "DEFAULT_API_KEY_SECRET", "DEFAULT_RUNTIME", "GROUP", "GRPC_PROTOCOL", "INFERENCE_PORT", "LIVE_PATH",
           "LOCK_KEY", "LOCK_SLACK_S", "METRICS_PORT", "MODEL_STORE_MOUNT", "MODE_ANNOTATION", "NAMESPACE_FILE",
           "OWNED_ANNOTATIONS", "PLURAL", "PREDICTOR_CPU", "PREDICTOR_MEMORY", "PROTOCOLS", "READY_PATH",
           "RECORD_HISTORY", "RECORD_PREFIX", "REVISION_KEY", "SNAPSHOT_KEYS", "STORAGE_URI_KEY", "STORE_DIR",
           "TORCHSERVE_METRICS_PORT", "VERSION", "Deployment", "KServeError", "KServeTarget", "Record", "Scaling",
           "api_client", "api_error", "apply", "apps_v1_api", "call", "check_claim", "cluster_runtime",
           "core_v1_api", "custom_objects_api", "deploy", "deploy_lock", "deployment_state", "inference_service",
           "is_raw", "local_path", "model_snapshot", "own_namespace", "predictor_endpoint", "publish",
           "read_inference_service", "read_record", "record_name", "record_served", "resolve_namespace",
           "revision_entry", "roll_out", "rollout_state", "runtime_properties", "served_storage_uri", "stage_layout",
           "storage_uri", "target_manifest", "versioned", "wait_ready", "write_record"]


@dataclass(frozen=True)
class KServeTarget:
    """Where the model store goes and how the InferenceService looks."""

    storage_uri: str
    model_uri: str = ""
    namespace: str = ""  # "" = the namespace the task runs in
    service_name: str = ""
    protocol: str = "v1"
    runtime: str = DEFAULT_RUNTIME
    service_account: str = ""
    api_key_secret: str = DEFAULT_API_KEY_SECRET
    cpu: str = PREDICTOR_CPU
    memory: str = PREDICTOR_MEMORY
    timeout_s: float = 600.0
    poll_s: float = 5.0
    #: What is deployed (the gate's fields, pipeline.gate.annotations_for): recorded once the new revision serves.
    annotations: dict[str, str] = field(default_factory=dict)
    #: Secrets (in the InferenceService's namespace) the predictor pulls its image with.
    image_pull_secrets: list[str] = field(default_factory=list)
    #: The model container's `resources` ({"requests": {...}, "limits": {...}}) instead of cpu/memory for both.
    resources: dict[str, dict[str, str]] | None = None
    #: Replicas and the autoscaling target (manifest.Scaling).
    scaling: Scaling = field(default_factory=Scaling)
    #: How a new model version takes traffic (canary.Canary: a share, a window, where its signals are read).
    canary: Canary = field(default_factory=Canary)
    #: Who holds the deploy lock (record.deploy_lock) while this runs, as others are told: the pipeline run;
    #: "" = this host and process.
    lock_holder: str = ""


@dataclass(frozen=True)
class Deployment:
    location: str
    manifest: dict
    url: str
    #: How the rollout went, on one line (a canary and its verdict, or why all at once).
    rollout: str = ""


def deploy(mar: Path, model_name: str, version: str, target: KServeTarget, dry_run: bool = False,
           api: Any = None, core_api: Any = None) -> Deployment:
    """Publish `<storage_uri>/<version>/`, point the InferenceService at it and, once its new revision serves,
    record `target.annotations` as what it serves, with the predictor as deployed (dry run: layout and manifest
    only).

    The InferenceService is patched only after every file is uploaded; a rollout that does not come to serve
    leaves the spec and the record as they were. All of it runs under the service's deploy lock: a second deploy
    or rollback of the same service meanwhile is refused on one line.
    """
    if not target.storage_uri:
        raise KServeError("storage_uri is required: an s3://, gs:// or pvc:// location for the model store")
    if target.protocol not in PROTOCOLS:
        raise KServeError(f"protocol {target.protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if target.canary.problem():
        raise KServeError(f"canary: {target.canary.problem()}")
    if not Path(mar).is_file():
        raise KServeError(f"{mar}: model archive not found")
    location = versioned(target.storage_uri, version)
    model_uri = storage_uri(versioned(target.model_uri, version) if target.model_uri else location)
    scheme = urlsplit(model_uri).scheme
    if not dry_run and scheme not in CLUSTER_SCHEMES:
        raise KServeError(f"{model_uri}: the cluster cannot read a local path; use s3://, gs:// or "
                          "pvc://<claim>/<path> (local directories are for --kserve-dry-run only)")
    if dry_run and scheme not in CLUSTER_SCHEMES:
        local = local_path(model_uri)
        model_uri = local.resolve().as_uri() if local is not None else model_uri
    namespace = resolve_namespace(target.namespace)
    manifest = target_manifest(target, model_name, version, model_uri, namespace)
    service = manifest["metadata"]["name"]
    if dry_run:
        _publish(Path(mar), model_name, version, location)
        return Deployment(location, manifest, "", "dry run: nothing rolled out")
    core_api = core_api or core_v1_api()
    check_claim(core_api, model_uri, location, namespace)
    holder = target.lock_holder or f"{socket.gethostname()} pid {os.getpid()}"
    # A canary waits up to four times (split, then promote; or take back: the old spec, then the last step) and
    # watches its window: the lock must outlast all of it.
    rollout_s = 4 * target.timeout_s + target.canary.window_s if target.canary.percent else target.timeout_s
    with deploy_lock(core_api, namespace, service, holder, rollout_s + LOCK_SLACK_S):
        _publish(Path(mar), model_name, version, location)
        api = api or custom_objects_api()
        how = canary_reason(target.canary, read_inference_service(api, namespace, service), model_uri)
        if how:
            served = apply(manifest, target.timeout_s, api, target.poll_s)
        else:
            served, how = roll_out_canary(api, namespace, service, manifest, target.canary, model_name, version,
                                          target.timeout_s, target.poll_s,
                                          check=checker(core_api, namespace, target.api_key_secret, model_name,
                                                        Path(mar)))
        if target.annotations:
            entry = {**target.annotations, STORAGE_URI_KEY: model_uri,
                     REVISION_KEY: revision_entry(manifest, OWNED_ANNOTATIONS)}
            record_served(core_api, namespace, service, entry, f"version {version} ({model_uri})")
    return Deployment(location, manifest, (served.get("status") or {}).get("url", ""), how)


def target_manifest(target: KServeTarget, model_name: str, version: str, model_uri: str, namespace: str) -> dict:
    """The InferenceService deploy writes for `target`, serving `model_uri`."""
    return inference_service(target.service_name or service_name_for(model_name), namespace, model_uri,
                             target.protocol, model_name, version, target.runtime, target.service_account,
                             target.cpu, target.memory, target.api_key_secret,
                             image_pull_secrets=target.image_pull_secrets, resources=target.resources,
                             scaling=target.scaling)


def _publish(mar: Path, model_name: str, version: str, location: str) -> None:
    with tempfile.TemporaryDirectory(prefix="kserve-store-") as tmp:
        stage_layout(mar, model_name, version, Path(tmp))
        publish(Path(tmp), location)
