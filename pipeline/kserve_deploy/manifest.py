"""The InferenceService manifest: its predictor, the model container's one port and probes, resources and the
callers' key, checked against KServe's schema."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from settings import KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT, WORKER_THREADS
from serving.runtimes import DEFAULT_SERVING_RUNTIME, SERVING_RUNTIMES

from ..manifests import ManifestError, validate
from .api import GROUP, VERSION
from .errors import KServeError

PROTOCOLS = ("v1", "v2", "grpc-v2")
#: Open Inference gRPC: Knative allows one container port, so a grpc-v2 predictor declares only the gateway's gRPC
#: port, named h2c (which Knative routes as HTTP/2 cleartext), as KServe's own grpc-v2 samples do
#: (docs/samples/v1beta1/torchserve/v1/grpc.yaml at v0.15.2).
GRPC_PROTOCOL = "grpc-v2"
#: The gateway's probe paths (serving/gateway/app.py PROBE_PATHS, answered without the key): ready = a worker of
#: the model is READY (serving/kserve_runtime/torchserve.py ready: the model is loaded), live = TorchServe answers.
READY_PATH, LIVE_PATH = "/v2/health/ready", "/v2/health/live"
#: The ClusterServingRuntime of the default serving runtime (deploy/kserve/servingruntime.yaml).
DEFAULT_RUNTIME = SERVING_RUNTIMES[DEFAULT_SERVING_RUNTIME].cluster_runtime
#: Secret (in the InferenceService's namespace) whose key `api-key` callers present as a bearer token.
DEFAULT_API_KEY_SECRET = "mnist-embedding-api-key"
API_KEY_ENV = "INFERENCE_API_KEY"
#: The predictor's CPU and memory, requests and limits alike (deploy/kserve/servingruntime.yaml says the same; a
#: test holds them equal). From `python -m bench limits` (bench/results/limits.md): two workers, the JVM and the
#: gateway peaked at 594-688 MB of memory cgroup under c=64 on the 5k gallery, so 1536Mi leaves the JVM room to
#: grow its heap to its -Xmx512m; 1 CPU halved req/s at c=16 and doubled p99 at c=1 against 2 CPUs (the two
#: workers each keep a core busy).
PREDICTOR_CPU, PREDICTOR_MEMORY = "2", "1536Mi"
#: Requests in flight per pod that Knative's autoscaler aims at (its default, 100, would pile up six times what one
#: pod serves well): at 2 CPUs a pod answered 310-400 req/s at c=16 with p99 68-162 ms, and c=64 only queued
#: longer (docs/performance.md, "Under Kubernetes limits"). Replicas: at least one (no cold start), at most four
#: unless raised (a cap on what a traffic spike can cost).
SCALE_TARGET, MIN_REPLICAS, MAX_REPLICAS = 16, 1, 4
#: How Knative reads the target: revision annotations KServe copies from the InferenceService's own (all but its
#: serviceAnnotationDisallowedList, kserve pkg/constants at v0.15.2). Raw deployment mode ignores them and keeps
#: KServe's HPA on CPU; spec.scaleTarget would instead be read there as a CPU percentage.
KNATIVE_TARGET, KNATIVE_METRIC = "autoscaling.knative.dev/target", "autoscaling.knative.dev/metric"
#: Tag routing (kserve pkg/constants EnableRoutingTagAnnotationKey): a canary revision gets its own URL, tag
#: `latest`, and the revision it is measured against the tag `prev` (pipeline.kserve_deploy.canary).
TAG_ROUTING = "serving.kserve.io/enable-tag-routing"


@dataclass(frozen=True)
class Scaling:
    """The predictor's replicas and the in-flight requests per pod Knative scales on."""

    min_replicas: int = MIN_REPLICAS
    max_replicas: int = MAX_REPLICAS
    target: int = SCALE_TARGET

    def problem(self) -> str | None:
        """Why these cannot be deployed, on one line; None when they can."""
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            return (f"replicas must satisfy 0 <= min ({self.min_replicas}) <= max ({self.max_replicas}) and "
                    "max >= 1")
        if self.target < 1:
            return f"the scale target must be at least 1 request in flight per pod, not {self.target}"
        return None

    def annotations(self) -> dict[str, str]:
        return {KNATIVE_METRIC: "concurrency", KNATIVE_TARGET: str(self.target)}


def cluster_runtime(serving_runtime: str, named: str = "") -> str:
    """The ClusterServingRuntime the predictor names: `named` when given, else the project's one for
    `serving_runtime` (serving.runtimes.SERVING_RUNTIMES); KServeError for an unknown serving runtime."""
    if named:
        return named
    if serving_runtime not in SERVING_RUNTIMES:
        raise KServeError(f"serving runtime {serving_runtime!r} is not one of {', '.join(SERVING_RUNTIMES)}")
    return SERVING_RUNTIMES[serving_runtime].cluster_runtime


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
                      resources: dict[str, dict[str, str]] | None = None, scaling: Scaling = Scaling()) -> dict:
    """The InferenceService manifest, checked against KServe's InferenceService schema.

    The caller's bearer key reaches the runtime as INFERENCE_API_KEY from the Secret `api_key_secret`
    (key `api-key`); without the Secret the pod does not start, so the model is never served openly.
    `resources` replaces the model container's requests and limits (default: `cpu` and `memory` for both).
    `scaling` sets the replicas (both modes) and Knative's target (its annotations; raw mode ignores them).
    """
    if any(not secret for secret in image_pull_secrets or ()):
        raise KServeError("invalid InferenceService: an imagePullSecrets entry needs a Secret name")
    if scaling.problem():
        raise KServeError(f"invalid InferenceService: {scaling.problem()}")
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
    predictor: dict[str, Any] = {"minReplicas": scaling.min_replicas, "maxReplicas": scaling.max_replicas,
                                 "model": model}
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
    manifest["metadata"]["annotations"] = {**scaling.annotations(), TAG_ROUTING: "true", **(annotations or {})}
    try:
        validate(manifest)
    except ManifestError as exc:
        raise KServeError(f"invalid InferenceService: {exc}") from None
    return manifest
