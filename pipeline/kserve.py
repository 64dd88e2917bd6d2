"""Deploy target `kserve`: the model store KServe's TorchServe runtime reads, and the InferenceService.

KServe's storage initializer copies `storageUri` to /mnt/models; the project's ServingRuntime
(deploy/kserve/servingruntime.yaml, the serving image) then runs `python -m serving.kserve_runtime`, which
starts TorchServe with `/mnt/models/config/config.properties` on loopback and answers KServe's v1 and
Open Inference v2 REST paths on port 8080. So each version is written as

    <storage_uri>/<version>/config/config.properties
    <storage_uri>/<version>/model-store/<model_name>.mar

and rolling forward means writing the next version beside it and patching the same
InferenceService's storageUri, which makes KServe start a new revision and shift traffic once it is Ready.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from settings import (CONFIG_FILE, MODEL_CONFIG_FILE, POD_TORCHSERVE_PORT, Endpoints, properties, read_properties,
                      write_properties)

from .manifests import ManifestError, validate

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
PROTOCOLS = ("v1", "v2")
#: TorchServe's inference and management APIs inside the pod: loopback only, behind the gateway.
INFERENCE_PORT = POD_TORCHSERVE_PORT
#: Prometheus metrics, scraped from outside the pod: the port of config.properties' metrics_address.
METRICS_PORT = Endpoints.from_properties(properties()).ports()["metrics"]
#: The ClusterServingRuntime in deploy/kserve/servingruntime.yaml.
DEFAULT_RUNTIME = "mnist-embedding-torchserve"
#: Secret (in the InferenceService's namespace) whose key `api-key` callers present as a bearer token.
DEFAULT_API_KEY_SECRET = "mnist-embedding-api-key"
API_KEY_ENV = "INFERENCE_API_KEY"
#: Where the deploy task has the claim of a pvc:// storage URI mounted (kfp-kubernetes mount_pvc).
PVC_MOUNT_ENV, PVC_MOUNT_DEFAULT = "PVC_MOUNT_PATH", "/mnt/pvc"
CLUSTER_SCHEMES = ("s3", "gs", "pvc")
CONFIG_PATH = "config/config.properties"
STORE_DIR = "model-store"
MODEL_STORE_MOUNT = "/mnt/models/model-store"
SNAPSHOT_KEYS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")
#: Settings of the project's config.properties that hold inside the cluster too (limits, metrics format).
CARRIED = ("max_request_size", "max_response_size", "limit_max_image_pixels", "job_queue_size",
           "default_response_timeout", "vmargs", "metrics_mode", "enable_model_api")


class KServeError(Exception):
    """One-line reason the model could not be published or served by KServe."""


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
    cpu: str = "1"
    memory: str = "2Gi"
    timeout_s: float = 600.0
    poll_s: float = 5.0
    annotations: dict[str, str] = field(default_factory=dict)


#: Where a pod finds its own namespace.
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def resolve_namespace(namespace: str, namespace_file: Path = NAMESPACE_FILE) -> str:
    """The given namespace, else the pipeline run's own (read inside its pod); KServeError when neither."""
    if namespace:
        return namespace
    try:
        own = namespace_file.read_text().strip()
    except OSError:
        own = ""
    if not own:
        raise KServeError("kserve_namespace is required (not running in a pod whose namespace could be read)")
    return own


@dataclass(frozen=True)
class Deployment:
    location: str
    manifest: dict
    url: str


#: TorchServe's own metrics inside the pod: loopback only. The gateway serves them on METRICS_PORT together
#: with its per-request latency histogram (serving.gateway_metrics), so the scrape target stays one port.
TORCHSERVE_METRICS_PORT = INFERENCE_PORT + 2


def model_snapshot(model_name: str, version: str, model_config: Path = MODEL_CONFIG_FILE) -> dict:
    """TorchServe's startup snapshot: the runtime loads exactly the models listed here."""
    settings = yaml.safe_load(Path(model_config).read_text()) or {}
    missing = [key for key in SNAPSHOT_KEYS if key not in settings]
    if missing:
        raise KServeError(f"{model_config}: missing {', '.join(missing)}")
    entry = {"defaultVersion": True, "marName": f"{model_name}.mar", **{key: settings[key] for key in SNAPSHOT_KEYS}}
    return {"name": "startup.cfg", "modelCount": 1, "models": {model_name: {version: entry}}}


def runtime_properties(model_name: str, version: str, base_config: Path = CONFIG_FILE,
                       model_config: Path = MODEL_CONFIG_FILE) -> dict[str, str]:
    """config.properties for the runtime pod.

    TorchServe listens on loopback with its own token check off: the gateway in front of it
    (serving.kserve_runtime) is the only way in and checks the caller's bearer key. No request envelope:
    the handler reads KServe's formats itself, so frontend batching stays on. settings.SERVER_PROPERTIES
    (limits, metrics format and model_metrics_auto_detect) are copied from `base_config`, which must hold
    every one of them. TorchServe's metrics stay on loopback; `gateway_metrics_address` (a key TorchServe
    ignores) tells the gateway to serve them, with its own request histogram, on METRICS_PORT.
    """
    from settings import GATEWAY_METRICS_KEY, SERVER_PROPERTIES

    base = read_properties(base_config)
    missing = [key for key in SERVER_PROPERTIES if key not in base]
    if missing:
        raise KServeError(f"{base_config}: missing {', '.join(missing)} (settings.SERVER_PROPERTIES hold in the "
                          "cluster too)")
    props = {key: base[key] for key in SERVER_PROPERTIES}
    props.update({
        "inference_address": f"http://127.0.0.1:{INFERENCE_PORT}",
        "management_address": f"http://127.0.0.1:{INFERENCE_PORT + 1}",
        "metrics_address": f"http://127.0.0.1:{TORCHSERVE_METRICS_PORT}",
        GATEWAY_METRICS_KEY: f"http://0.0.0.0:{METRICS_PORT}",
        "disable_token_authorization": "true",
        "install_py_dep_per_model": "false",
        "model_store": MODEL_STORE_MOUNT,
        "model_snapshot": json.dumps(model_snapshot(model_name, version, model_config), separators=(",", ":")),
    })
    return props


def stage_layout(mar: Path, model_name: str, version: str, out: Path) -> None:
    """Write config/config.properties and model-store/<model_name>.mar under `out`."""
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / STORE_DIR).mkdir(exist_ok=True)
    write_properties(runtime_properties(model_name, version), out / CONFIG_PATH)
    shutil.copy2(mar, out / STORE_DIR / f"{model_name}.mar")


def versioned(uri: str, version: str) -> str:
    return f"{uri.rstrip('/')}/{version}"


def _local_path(location: str) -> Path | None:
    """The directory a local path, file:// or pvc:// location is written to; None for object storage."""
    parts = urlsplit(location)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise KServeError(f"{location}: file:// URIs must name a local path (file:///dir)")
        return Path(parts.path)
    if parts.scheme == "pvc":
        mount = Path(os.environ.get(PVC_MOUNT_ENV, PVC_MOUNT_DEFAULT))
        if not parts.netloc:
            raise KServeError(f"{location}: pvc:// URIs name the claim: pvc://<claim>/<path>")
        if not mount.is_dir():
            raise KServeError(f"{location}: claim {parts.netloc} is not mounted at {mount} in this task "
                              f"(mount it there, or set {PVC_MOUNT_ENV})")
        return mount / parts.path.strip("/")
    return Path(location) if not parts.scheme else None


def publish(staging: Path, location: str) -> None:
    """Copy the staged layout to s3://, gs://, pvc:// (a mounted claim) or a local directory, replacing that version.

    Credentials come only from the environment, as the cloud SDKs define it (AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL or an IAM role; GOOGLE_APPLICATION_CREDENTIALS or Workload
    Identity), never from arguments, and are never logged.
    """
    parts = urlsplit(location)
    if parts.scheme not in ("", "file", *CLUSTER_SCHEMES):
        raise KServeError(f"cannot write to {parts.scheme}:// storage: use s3://, gs://, pvc://<claim>/<path> "
                          "or (for development) a local directory")
    local = _local_path(location)
    if local is not None:
        local = local.resolve()
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.parent / f".{local.name}.partial-{uuid.uuid4().hex[:8]}"
        shutil.copytree(staging, partial)
        if local.exists():
            shutil.rmtree(local)
        os.replace(partial, local)
        return
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    # The .mar last: a reader that finds it finds the whole version.
    files.sort(key=lambda p: p.suffix == ".mar")
    keys = [f"{parts.path.strip('/')}/{p.relative_to(staging).as_posix()}".lstrip("/") for p in files]
    if parts.scheme == "gs":
        _upload_gcs(parts.netloc, files, keys)
    else:
        _upload_s3(parts.netloc, files, keys)


def _upload_gcs(bucket_name: str, files: list[Path], keys: list[str]) -> None:
    try:
        from google.cloud import storage
    except ImportError:
        raise KServeError("gs:// storage needs google-cloud-storage (pip install google-cloud-storage)") from None
    import google.api_core.exceptions
    import google.auth.exceptions

    try:
        bucket = storage.Client().bucket(bucket_name)
        for path, key in zip(files, keys, strict=True):
            bucket.blob(key).upload_from_filename(str(path))
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise KServeError(f"no Google credentials for gs://{bucket_name}: {exc}") from None
    except google.api_core.exceptions.GoogleAPIError as exc:
        raise KServeError(f"gs://{bucket_name}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def _upload_s3(bucket_name: str, files: list[Path], keys: list[str]) -> None:
    try:
        import boto3
        import botocore.exceptions
    except ImportError:
        raise KServeError("s3:// storage needs boto3 (pip install boto3)") from None
    try:
        # A fresh session: endpoint, region and credentials from the environment as it is now (AWS_* variables).
        client = boto3.session.Session().client("s3")
        client.head_bucket(Bucket=bucket_name)  # a missing bucket or permission fails before any upload
        for path, key in zip(files, keys, strict=True):
            client.upload_file(str(path), bucket_name, key)
    except botocore.exceptions.NoCredentialsError:
        raise KServeError(f"no AWS credentials for s3://{bucket_name}: set AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (from a Secret), or give the pod an IAM role") from None
    except botocore.exceptions.ClientError as exc:
        error = exc.response.get("Error", {})
        code = {"404": "NoSuchBucket", "403": "AccessDenied"}.get(str(error.get("Code")), error.get("Code", "error"))
        raise KServeError(f"s3://{bucket_name}: {code}: {error.get('Message') or 'refused'}") from None
    except (botocore.exceptions.BotoCoreError, boto3.exceptions.S3UploadFailedError) as exc:
        raise KServeError(f"s3://{bucket_name}: {str(exc).splitlines()[0]}") from None


def service_name_for(model_name: str) -> str:
    """A DNS-1035 InferenceService name from a model name ('my_model' -> 'my-model')."""
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")
    return name if name[:1].isalpha() else f"m-{name}"


def inference_service(name: str, namespace: str, storage_uri: str, protocol: str, model_name: str, version: str,
                      runtime: str = DEFAULT_RUNTIME, service_account: str = "", cpu: str = "1", memory: str = "2Gi",
                      api_key_secret: str = DEFAULT_API_KEY_SECRET, annotations: dict[str, str] | None = None) -> dict:
    """The InferenceService manifest, checked against KServe's InferenceService schema.

    The caller's bearer key reaches the runtime as INFERENCE_API_KEY from the Secret `api_key_secret`
    (key `api-key`); without the Secret the pod does not start, so the model is never served openly.
    """
    resources = {"cpu": cpu, "memory": memory}
    model: dict[str, Any] = {
        "modelFormat": {"name": "pytorch"},
        "protocolVersion": protocol,
        "storageUri": storage_uri,
        # Two single-threaded workers (model-config.yaml) instead of threads oversubscribing the CPU limit.
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": api_key_secret, "key": "api-key"}}}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
    }
    if runtime:
        model["runtime"] = runtime
    predictor: dict[str, Any] = {"minReplicas": 1, "model": model}
    if service_account:
        predictor["serviceAccountName"] = service_account
    manifest = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": model_name, "app.kubernetes.io/version": version}},
        "spec": {"predictor": predictor},
    }
    if annotations:
        manifest["metadata"]["annotations"] = dict(annotations)
    try:
        validate(manifest)
    except ManifestError as exc:
        raise KServeError(f"invalid InferenceService: {exc}") from None
    return manifest


def custom_objects_api() -> Any:
    """The Kubernetes API for custom objects: in-cluster credentials, else the kubeconfig ($KUBECONFIG as it is
    now: the client library reads that variable only once, at import)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        try:
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                    client_configuration=configuration)
        except (config.ConfigException, OSError) as exc:
            raise KServeError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from None
    return client.CustomObjectsApi(client.ApiClient(configuration))


def _predictor_status(obj: dict) -> dict:
    return ((obj.get("status") or {}).get("components") or {}).get("predictor") or {}


def apply(manifest: dict, timeout_s: float = 600.0, api: Any = None, poll_s: float = 5.0) -> dict:
    """Create the InferenceService, or merge-patch the existing one, then wait until it serves the new spec."""
    from kubernetes.client.exceptions import ApiException

    api = api or custom_objects_api()
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    where = (GROUP, VERSION, namespace, PLURAL)
    try:
        try:
            existing = api.get_namespaced_custom_object(*where, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            existing = None
        previous = None
        if existing is None:
            api.create_namespaced_custom_object(*where, manifest)
        else:
            patched = api.patch_namespaced_custom_object(*where, name, manifest)
            if patched["metadata"].get("generation") != existing["metadata"].get("generation"):
                previous = _predictor_status(existing).get("latestReadyRevision")
        return wait_ready(api, namespace, name, previous, timeout_s, poll_s)
    except ApiException as exc:
        raise KServeError(f"InferenceService {namespace}/{name}: {exc.status} {exc.reason}") from None


def wait_ready(api: Any, namespace: str, name: str, previous_revision: str | None, timeout_s: float,
               poll_s: float = 5.0) -> dict:
    """Poll until Ready is True and the newest revision (not `previous_revision`) serves.

    A re-apply that changes nothing (same generation) passes `previous_revision=None` and waits for
    Ready only; in RawDeployment mode there are no revisions and Ready alone decides.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), {})
        predictor = _predictor_status(obj)
        latest = predictor.get("latestReadyRevision")
        fresh = previous_revision is None or latest != previous_revision
        rolled = latest == predictor.get("latestCreatedRevision") and fresh
        if ready.get("status") == "True" and rolled:
            return obj
        if time.monotonic() >= deadline:
            why = ready.get("message") or ready.get("reason") or "no Ready condition yet"
            raise KServeError(f"InferenceService {namespace}/{name} not Ready after {timeout_s:.0f}s: {why}")
        time.sleep(poll_s)


def deploy(mar: Path, model_name: str, version: str, target: KServeTarget, dry_run: bool = False,
           api: Any = None) -> Deployment:
    """Publish `<storage_uri>/<version>/` and point the InferenceService at it (dry run: manifest only)."""
    if not target.storage_uri:
        raise KServeError("storage_uri is required: an s3://, gs:// or pvc:// location for the model store")
    if target.protocol not in PROTOCOLS:
        raise KServeError(f"protocol {target.protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if not Path(mar).is_file():
        raise KServeError(f"{mar}: model archive not found")
    location = versioned(target.storage_uri, version)
    model_uri = versioned(target.model_uri, version) if target.model_uri else location
    scheme = urlsplit(model_uri).scheme
    if not dry_run and scheme not in CLUSTER_SCHEMES:
        raise KServeError(f"{model_uri}: the cluster cannot read a local path; use s3://, gs:// or "
                          "pvc://<claim>/<path> (local directories are for --kserve-dry-run only)")
    if dry_run and scheme not in CLUSTER_SCHEMES:
        local = _local_path(model_uri)
        model_uri = local.resolve().as_uri() if local is not None else model_uri
    manifest = inference_service(target.service_name or service_name_for(model_name),
                                 resolve_namespace(target.namespace), model_uri, target.protocol, model_name, version,
                                 target.runtime, target.service_account, target.cpu, target.memory,
                                 target.api_key_secret, target.annotations)
    with tempfile.TemporaryDirectory(prefix="kserve-store-") as tmp:
        stage_layout(Path(mar), model_name, version, Path(tmp))
        publish(Path(tmp), location)
    if dry_run:
        return Deployment(location, manifest, "")
    served = apply(manifest, target.timeout_s, api, target.poll_s)
    return Deployment(location, manifest, (served.get("status") or {}).get("url", ""))
