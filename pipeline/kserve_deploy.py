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
"""

from __future__ import annotations

import copy
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

from cli_common import UsageError
from owned_paths import replaceable_dir
from settings import (CONFIG_FILE, KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT, MODEL_CONFIG_FILE, POD_TORCHSERVE_PORT,
                      PVC_MOUNT_DEFAULT, PVC_MOUNT_ENV, WORKER_THREADS, Endpoints, properties, read_properties,
                      write_properties)

from .manifests import ManifestError, validate
from .releases import RAW_MODE_NAMES

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
PROTOCOLS = ("v1", "v2", "grpc-v2")
#: Open Inference gRPC: Knative allows one container port, so a grpc-v2 predictor declares only the gateway's gRPC
#: port, named h2c (which Knative routes as HTTP/2 cleartext), as KServe's own grpc-v2 samples do
#: (docs/samples/v1beta1/torchserve/v1/grpc.yaml at v0.15.2).
GRPC_PROTOCOL = "grpc-v2"
#: The gateway's probe paths (serving/gateway/app.py PROBE_PATHS, answered without the key): ready = a worker of
#: the model is READY (serving/kserve_runtime/torchserve.py ready: the model is loaded), live = TorchServe answers.
READY_PATH, LIVE_PATH = "/v2/health/ready", "/v2/health/live"
#: TorchServe's inference and management APIs inside the pod: loopback only, behind the gateway.
INFERENCE_PORT = POD_TORCHSERVE_PORT
#: Prometheus metrics, scraped from outside the pod: the port of config.properties' metrics_address.
METRICS_PORT = Endpoints.from_properties(properties()).ports()["metrics"]
#: The ClusterServingRuntime in deploy/kserve/servingruntime.yaml.
DEFAULT_RUNTIME = "mnist-embedding-torchserve"
#: Secret (in the InferenceService's namespace) whose key `api-key` callers present as a bearer token.
DEFAULT_API_KEY_SECRET = "mnist-embedding-api-key"
API_KEY_ENV = "INFERENCE_API_KEY"
#: The predictor's CPU and memory, requests and limits alike (deploy/kserve/servingruntime.yaml says the same; a
#: test holds them equal). From `python -m bench limits` (bench/results/limits.md): two workers, the JVM and the
#: gateway peaked at 594-688 MB of memory cgroup under c=64 on the 5k gallery, so 1536Mi leaves the JVM room to
#: grow its heap to its -Xmx512m; 1 CPU halved req/s at c=16 and doubled p99 at c=1 against 2 CPUs (the two
#: workers each keep a core busy).
PREDICTOR_CPU, PREDICTOR_MEMORY = "2", "1536Mi"
CLUSTER_SCHEMES = ("s3", "gs", "pvc")
CONFIG_PATH = "config/config.properties"
STORE_DIR = "model-store"
MODEL_STORE_MOUNT = "/mnt/models/model-store"
SNAPSHOT_KEYS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")


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


#: Where a pod finds its own namespace.
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def resolve_namespace(namespace: str) -> str:
    """The given namespace, else the pipeline run's own (read inside its pod); KServeError when neither."""
    if namespace:
        return namespace
    own = own_namespace()
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
        try:  # a version folder holds exactly what staging holds: replace nothing else
            replaceable_dir(local, "kserve-version", "kserve_storage_uri", known=[p.name for p in staging.iterdir()])
        except UsageError as exc:
            raise KServeError(str(exc)) from None
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
    key = ""
    try:
        # A fresh session: endpoint, region and credentials from the environment as it is now (AWS_* variables).
        client = boto3.session.Session().client("s3")
        client.head_bucket(Bucket=bucket_name)  # a missing bucket or permission fails before any upload
        for path, key in zip(files, keys, strict=True):
            client.upload_file(str(path), bucket_name, key)
        for path, key in zip(files, keys, strict=True):  # what the store holds, before anything points at it
            size = client.head_object(Bucket=bucket_name, Key=key)["ContentLength"]
            if size != path.stat().st_size:
                raise KServeError(f"s3://{bucket_name}/{key}: the store holds {size} bytes of "
                                  f"{path.stat().st_size}; nothing points at this version (rerun to upload it again)")
    except botocore.exceptions.NoCredentialsError:
        raise KServeError(f"no AWS credentials for s3://{bucket_name}: set AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (from a Secret), or give the pod an IAM role") from None
    except (botocore.exceptions.ClientError, boto3.exceptions.S3UploadFailedError,
            botocore.exceptions.BotoCoreError) as exc:
        after = f" (uploading {key}; nothing points at this version: rerun to upload it again)" if key else ""
        raise KServeError(f"{_s3_error(exc, bucket_name)}{after}") from None


def _s3_error(exc: Exception, bucket_name: str) -> str:
    """`s3://bucket: <S3 error code>: <message>` on one line (an upload failure wraps the service's error)."""
    import botocore.exceptions

    wrapped = exc.__cause__ or exc.__context__  # boto3 raises S3UploadFailedError while handling the ClientError
    cause = wrapped if isinstance(wrapped, botocore.exceptions.ClientError) else exc
    if isinstance(cause, botocore.exceptions.ClientError):
        error = cause.response.get("Error", {})
        code = {"404": "NoSuchBucket", "403": "AccessDenied"}.get(str(error.get("Code")), error.get("Code", "error"))
        return f"s3://{bucket_name}: {code}: {(error.get('Message') or 'refused').splitlines()[0]}"
    return f"s3://{bucket_name}: {str(exc).splitlines()[0]}"


def service_name_for(model_name: str) -> str:
    """A DNS-1035 InferenceService name from a model name ('my_model' -> 'my-model')."""
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")
    return name if name[:1].isalpha() else f"m-{name}"


def predictor_endpoint(protocol: str) -> dict[str, Any]:
    """The model container's one port and its probes, for `protocol`.

    The ServingRuntime (deploy/kserve/servingruntime.yaml) declares neither, as KServe's kserve-torchserve does:
    KServe merges the runtime's container with this one by strategic merge patch (MergeRuntimeContainers in
    kserve's pkg/controller/v1beta1/inferenceservice/utils/utils.go), so ports a runtime declared would be kept
    beside these and its probes would gain a second handler. The pod then passes Knative's checks (one port;
    one handler per probe) and Kubernetes' (tests/unit/test_kserve_compose.py composes and checks each protocol).

    Readiness is the gateway's /v2/health/ready on the REST port for every protocol: 200 only while a worker of
    the model is READY. A grpc-v2 pod serves REST there too (the runtime's --http-port); Knative's queue-proxy
    runs a readiness probe at the port the probe names by number, the kubelet does in raw mode. Liveness:
    /v2/health/live on the REST port for REST; for grpc-v2 a TCP connect to the gRPC port, since Knative points a
    liveness probe's HTTP or TCP port at the serving port (rewriteUserProbe), which answers only gRPC and has no
    grpc.health.v1 service for a gRPC probe. The TCP connect proves the gateway's event loop accepts; the
    container exits on its own when TorchServe dies.
    """
    readiness = {"httpGet": {"path": READY_PATH, "port": KSERVE_GATEWAY_PORT}, "initialDelaySeconds": 2,
                 "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 3}
    timing = {"initialDelaySeconds": 20, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}
    if protocol == GRPC_PROTOCOL:
        return {"ports": [{"name": "h2c", "containerPort": KSERVE_GRPC_PORT, "protocol": "TCP"}],
                "readinessProbe": readiness,
                "livenessProbe": {"tcpSocket": {"port": KSERVE_GRPC_PORT}, **timing}}
    return {"ports": [{"name": "http1", "containerPort": KSERVE_GATEWAY_PORT, "protocol": "TCP"}],
            "readinessProbe": readiness,
            "livenessProbe": {"httpGet": {"path": LIVE_PATH, "port": KSERVE_GATEWAY_PORT}, **timing}}


def inference_service(name: str, namespace: str, storage_uri: str, protocol: str, model_name: str, version: str,
                      runtime: str = DEFAULT_RUNTIME, service_account: str = "", cpu: str = PREDICTOR_CPU,
                      memory: str = PREDICTOR_MEMORY,
                      api_key_secret: str = DEFAULT_API_KEY_SECRET, annotations: dict[str, str] | None = None, *,
                      image_pull_secrets: list[str] | None = None,
                      resources: dict[str, dict[str, str]] | None = None) -> dict:
    """The InferenceService manifest, checked against KServe's InferenceService schema.

    The caller's bearer key reaches the runtime as INFERENCE_API_KEY from the Secret `api_key_secret`
    (key `api-key`); without the Secret the pod does not start, so the model is never served openly.
    `resources` replaces the model container's requests and limits (default: `cpu` and `memory` for both).
    """
    if any(not secret for secret in image_pull_secrets or ()):
        raise KServeError("invalid InferenceService: an imagePullSecrets entry needs a Secret name")
    if resources is not None and (not isinstance(resources, dict) or not resources):
        raise KServeError("invalid InferenceService: resources must be {\"requests\": {...}, \"limits\": {...}}")
    default = {"cpu": cpu, "memory": memory}
    model: dict[str, Any] = {
        "modelFormat": {"name": "pytorch"},
        "protocolVersion": protocol,
        "storageUri": storage_uri,
        # Single-threaded workers (settings.WORKER_THREADS) instead of threads oversubscribing the CPU limit.
        "env": [{"name": "OMP_NUM_THREADS", "value": str(WORKER_THREADS)},
                {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": api_key_secret, "key": "api-key"}}}],
        "resources": copy.deepcopy(resources) if resources is not None else {"requests": dict(default),
                                                                              "limits": dict(default)},
    }
    model.update(predictor_endpoint(protocol))
    if runtime:
        model["runtime"] = runtime
    predictor: dict[str, Any] = {"minReplicas": 1, "model": model}
    if service_account:
        predictor["serviceAccountName"] = service_account
    if image_pull_secrets:
        predictor["imagePullSecrets"] = [{"name": secret} for secret in image_pull_secrets]
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


def _api_client() -> Any:
    """A Kubernetes API client: in-cluster credentials, else the kubeconfig ($KUBECONFIG as it is now: the client
    library reads that variable only once, at import)."""
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
    return client.ApiClient(configuration)


def custom_objects_api() -> Any:
    """The Kubernetes API for custom objects (InferenceServices)."""
    from kubernetes import client

    return client.CustomObjectsApi(_api_client())


def core_v1_api() -> Any:
    """The Kubernetes core API (the deploy record's ConfigMap, PersistentVolumeClaims)."""
    from kubernetes import client

    return client.CoreV1Api(_api_client())


#: Attempts of one Kubernetes API call that answers 429 or 5xx, and the first pause between them (doubling).
API_ATTEMPTS, API_BACKOFF_S = 5, 0.5
#: Attempts of a write whose resourceVersion went stale (409 Conflict): re-read and re-apply.
CONFLICT_ATTEMPTS = 5


def _api_error(exc: Any) -> str:
    """`<code> <reason>: <the API server's message>` on one line."""
    message = ""
    try:
        message = json.loads(exc.body or "{}").get("message", "")
    except (TypeError, ValueError, AttributeError):
        pass
    return f"{exc.status} {exc.reason}" + (f": {message.splitlines()[0]}" if message else "")


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args)`, again with backoff while the API server answers 429 or 5xx. Only for reads and for writes that
    are safe to repeat: a create (a repeat answers 409 AlreadyExists) or a write carrying a resourceVersion (a
    repeat after a lost answer finds the version moved on and answers 409)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    pause = API_BACKOFF_S
    for attempt in range(1, API_ATTEMPTS + 1):
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if attempt == API_ATTEMPTS or not (exc.status == 429 or (exc.status or 0) >= 500):
                raise
        except (HTTPError, OSError) as exc:
            if attempt == API_ATTEMPTS:
                raise KServeError(f"cannot reach the Kubernetes API: {type(exc).__name__}") from None
        time.sleep(pause)
        pause = min(pause * 2, 8.0)
    raise AssertionError("unreachable")


def read_inference_service(api: Any, namespace: str, name: str) -> dict | None:
    """The InferenceService namespace/name; None when there is none. ApiException on other failures."""
    from kubernetes.client.exceptions import ApiException

    try:
        return _call(api.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _predictor_status(obj: dict) -> dict:
    return ((obj.get("status") or {}).get("components") or {}).get("predictor") or {}


def served_storage_uri(obj: dict) -> str:
    """The storageUri the InferenceService's spec names (KServe reports none in status)."""
    return (((obj.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("storageUri", "")


def _merge_diff(current: Any, target: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns `current` into `target`."""
    if not isinstance(current, dict) or not isinstance(target, dict):
        return copy.deepcopy(target)
    patch = {key: None for key in current if key not in target}
    for key, value in target.items():
        if key not in current or current[key] != value:
            patch[key] = _merge_diff(current.get(key), value)
    return patch


def _patch(api: Any, namespace: str, name: str, make: Any, existing: dict | None = None) -> tuple[dict, dict]:
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
            return existing, _call(api.patch_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name, body)
        except ApiException as exc:
            if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


#: Optional predictor fields the manifest sets only when asked: a patch removes them when no longer asked.
OPTIONAL_PREDICTOR_KEYS = ("serviceAccountName", "imagePullSecrets")
#: The model container's probes: a JSON merge patch merges objects key by key, so a probe whose handler changed
#: (an older release's tcpSocket readiness, now httpGet) would keep the old handler beside the new one, and KServe's
#: pod would carry two. The patch names what the probe no longer has as null.
PROBE_KEYS = ("readinessProbe", "livenessProbe", "startupProbe")


def _deploy_patch(manifest: dict, existing: dict) -> dict:
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
            model[key] = _merge_diff(old_model[key], model[key]) if key in model else None
    return {"metadata": {"labels": dict(manifest["metadata"].get("labels") or {})}, "spec": spec}


def _revert_patch(before: dict) -> Any:
    def make(current: dict) -> dict:
        patch = _merge_diff({"labels": current["metadata"].get("labels") or {}, "spec": current.get("spec") or {}},
                            {"labels": before["metadata"].get("labels") or {}, "spec": before.get("spec") or {}})
        return {"metadata": {"labels": patch.pop("labels", {})}, **patch}
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


def apps_v1_api() -> Any:
    """The Kubernetes apps API (the predictor Deployment of raw deployment mode)."""
    from kubernetes import client

    return client.AppsV1Api(_api_client())


def deployment_state(apps: Any, namespace: str, name: str) -> tuple[str, str]:
    """The rollout of the predictor Deployment KServe made for InferenceService `name`, judged as `kubectl rollout
    status` judges it: observed, every replica updated, no old replica left, every updated replica available."""
    from kubernetes.client.exceptions import ApiException

    for deployment_name in (f"{name}-predictor", f"{name}-predictor-default"):  # the second: KServe before 0.10
        try:
            deployment = _call(apps.read_namespaced_deployment, deployment_name, namespace)
            break
        except ApiException as exc:
            if exc.status in (401, 403):
                raise KServeError(f"cannot read Deployment {namespace}/{deployment_name}: {_api_error(exc)} (needs "
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
               poll_s: float = 5.0, apps_api: Any = None) -> dict:
    """Poll until the newest spec serves (rollout_state, and deployment_state in raw mode); KServeError on a
    failed revision or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        obj = read_inference_service(api, namespace, name)
        if obj is None:
            raise KServeError(f"InferenceService {namespace}/{name} disappeared while rolling out")
        state, why = rollout_state(obj, before)
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
                _call(api.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, create)
                return wait_ready(api, namespace, name, None, timeout_s, poll_s)
            except ApiException as exc:
                if exc.status != 409:  # created meanwhile (or by a lost answer): patch it instead
                    raise
            before = None
        # The object as first read stays the baseline: when a write is stored but its answer lost, the retry's
        # 409 re-read already holds the new spec, and comparing with it would hide the change.
        original = before
        before, patched = _patch(api, namespace, name, make, before)
        before = original or before
    except ApiException as exc:
        raise KServeError(f"{where}: {_api_error(exc)}") from None
    changed = patched["metadata"].get("generation") != before["metadata"].get("generation")
    try:
        return wait_ready(api, namespace, name, before if changed else None, timeout_s, poll_s)
    except (KServeError, ApiException, KeyboardInterrupt) as exc:
        failure = (f"{where}: {_api_error(exc)}" if isinstance(exc, ApiException) else
                   f"{where}: interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc))
        if changed:
            old = served_storage_uri(before) or "its previous spec"
            try:
                _patch(api, namespace, name, _revert_patch(before))
            except (ApiException, KServeError) as revert:
                detail = _api_error(revert) if isinstance(revert, ApiException) else str(revert)
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
    return roll_out(api, namespace, name, lambda existing: _deploy_patch(manifest, existing), timeout_s, poll_s,
                    create=manifest)


# ---------------------------------------------------------------- the deploy record

#: Prefix of the record's keys; the gate (pipeline.gate) names the others.
RECORD_PREFIX = "mnist-embedding"
STORAGE_URI_KEY = f"{RECORD_PREFIX}/storage-uri"
#: How many deployed versions the record keeps for rollback.
RECORD_HISTORY = 10


def record_name(service: str) -> str:
    """The ConfigMap, beside the InferenceService, that records what it serves.

    Not annotations on the InferenceService: KServe copies its annotations into the Knative revision template
    (pkg/controller/v1beta1/inferenceservice/components/predictor.go), so writing them after Ready would start
    another revision.
    """
    return f"{service}-deployed-model"


@dataclass(frozen=True)
class Record:
    """What the InferenceService serves, what it served before, and the versions it served (newest last)."""

    current: dict[str, str]
    previous: dict[str, str] | None
    history: list[dict[str, str]]
    resource_version: str = ""


def read_record(core: Any, namespace: str, service: str) -> Record | None:
    """The deploy record of `service`; None when there is none, empty entries when it cannot be parsed (edited by
    hand). ApiException on other failures."""
    from kubernetes.client.exceptions import ApiException

    try:
        obj = _call(core.read_namespaced_config_map, record_name(service), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    data = obj.data or {}
    try:
        current = json.loads(data["current"])
        previous = json.loads(data["previous"]) if data.get("previous") else None
        history = json.loads(data.get("history") or "[]")
        if not (isinstance(current, dict) and isinstance(previous, dict | None) and isinstance(history, list)):
            raise ValueError("not a record")
    except (KeyError, ValueError):
        current, previous, history = {}, None, []
    return Record(current, previous, history, obj.metadata.resource_version or "")


def write_record(core: Any, namespace: str, service: str, entry: dict[str, str]) -> None:
    """Make `entry` the current one (the current one becomes previous); a 409 re-reads and retries (bounded)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = record_name(service)
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        old = read_record(core, namespace, service)
        history = [e for e in (old.history if old else []) if e != entry] + [entry]
        data = {"current": json.dumps(entry, sort_keys=True),
                "history": json.dumps(history[-RECORD_HISTORY:], sort_keys=True)}
        if old is not None and old.current and old.current != entry:
            data["previous"] = json.dumps(old.current, sort_keys=True)
        elif old is not None and old.previous:
            data["previous"] = json.dumps(old.previous, sort_keys=True)
        meta = client.V1ObjectMeta(name=name, namespace=namespace,
                                   labels={"app.kubernetes.io/managed-by": "mnist-embedding-pipeline"},
                                   resource_version=old.resource_version if old else None)
        body = client.V1ConfigMap(metadata=meta, data=data)
        try:
            if old is None:
                _call(core.create_namespaced_config_map, namespace, body)
            else:
                _call(core.replace_namespaced_config_map, name, namespace, body)
            return
        except ApiException as exc:
            if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                raise


def record_served(core: Any, namespace: str, service: str, entry: dict[str, str], what: str) -> None:
    """write_record once `what` serves; KServeError on one line when the record cannot be written."""
    from kubernetes.client.exceptions import ApiException

    try:
        write_record(core, namespace, service, entry)
    except ApiException as exc:
        raise KServeError(f"{what} serves, but its record ConfigMap {namespace}/{record_name(service)} could not be "
                          f"written: {_api_error(exc)} (the gate refuses until a deploy or rollback records it)"
                          ) from None


# ---------------------------------------------------------------- pvc://

def own_namespace() -> str:
    """The namespace this pod runs in; '' outside a pod."""
    try:
        return NAMESPACE_FILE.read_text().strip()
    except OSError:
        return ""


def check_claim(core: Any, model_uri: str, storage_uri: str, namespace: str) -> None:
    """pvc:// rules: KServe mounts the claim in the InferenceService's namespace, the deploy task in its own, so
    where both name a claim the two namespaces must be one (checked when this runs in a pod); the claim must be
    ReadWriteMany, since the task writes while serving pods on other nodes read. KServeError otherwise."""
    from kubernetes.client.exceptions import ApiException

    parts = urlsplit(model_uri)
    if parts.scheme != "pvc":
        return
    claim = parts.netloc
    own = own_namespace()
    if urlsplit(storage_uri).scheme == "pvc" and own and own != namespace:
        raise KServeError(f"{model_uri}: KServe mounts claim {claim} from namespace {namespace} but this task runs "
                          f"in {own}, where its claim is mounted: deploy to {own}, or use s3:// or gs://")
    try:
        pvc = _call(core.read_namespaced_persistent_volume_claim, claim, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise KServeError(f"{model_uri}: no PersistentVolumeClaim {claim} in namespace {namespace}, where KServe "
                              "mounts it") from None
        hint = (" (needs get on persistentvolumeclaims: deploy/kubeflow/rbac.yaml)" if exc.status in (401, 403)
                else "")
        raise KServeError(f"cannot read PersistentVolumeClaim {namespace}/{claim}: {_api_error(exc)}{hint}") from None
    modes = (pvc.status.access_modes if pvc.status and pvc.status.access_modes else pvc.spec.access_modes) or []
    if "ReadWriteMany" not in modes:
        raise KServeError(f"{model_uri}: claim {namespace}/{claim} is {', '.join(modes) or 'without access modes'}; "
                          "it must be ReadWriteMany (the deploy task writes while serving pods read)")


# ---------------------------------------------------------------- deploy

def deploy(mar: Path, model_name: str, version: str, target: KServeTarget, dry_run: bool = False,
           api: Any = None, core_api: Any = None) -> Deployment:
    """Publish `<storage_uri>/<version>/`, point the InferenceService at it and, once its new revision serves,
    record `target.annotations` as what it serves (dry run: layout and manifest only).

    The InferenceService is patched only after every file is uploaded; a rollout that does not come to serve
    leaves the spec and the record as they were.
    """
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
    namespace = resolve_namespace(target.namespace)
    service = target.service_name or service_name_for(model_name)
    manifest = inference_service(service, namespace, model_uri, target.protocol, model_name, version,
                                 target.runtime, target.service_account, target.cpu, target.memory,
                                 target.api_key_secret, image_pull_secrets=target.image_pull_secrets,
                                 resources=target.resources)
    if not dry_run and (scheme == "pvc" or target.annotations):
        core_api = core_api or core_v1_api()
    if not dry_run:
        check_claim(core_api, model_uri, location, namespace)
    with tempfile.TemporaryDirectory(prefix="kserve-store-") as tmp:
        stage_layout(Path(mar), model_name, version, Path(tmp))
        publish(Path(tmp), location)
    if dry_run:
        return Deployment(location, manifest, "")
    served = apply(manifest, target.timeout_s, api, target.poll_s)
    if target.annotations:
        record_served(core_api, namespace, service, {**target.annotations, STORAGE_URI_KEY: model_uri},
                              f"version {version} ({model_uri})")
    return Deployment(location, manifest, (served.get("status") or {}).get("url", ""))
