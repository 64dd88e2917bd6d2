"""An operator's view of the cluster for the real `kubectl`, on loopback: what the alerts' runbooks run.

The InferenceService is KubernetesStandin's (support.k8s_standin: the spec the pipeline wrote, with the status
KServe's simulated controller reports, after KServe's merge with the shipped runtime). Each predictor pod is a real
container of the serving image, shown as the pod KServe and Knative make from the composed spec
(support.kserve_compose) for the InferenceService's ready revision. The other objects are the ones the project's
manifests write (the NetworkPolicy, the metrics Service and ServiceMonitor), as `kubectl apply` would store them.

`kubectl get`, `describe`, `logs`, `top` and `get events` call these paths and get the answers a real API server
gives (checked with kubectl 1.32 and Debian's kubectl 1.20):

- Discovery the legacy way (/api, /apis, /api/v1, /apis/<group>/<version>); kubectl 1.26+ asks for aggregated
  discovery first and reads a plain application/json answer as legacy (client-go discovery_client.go,
  ServerGroupsAndResources).
- Objects and lists, and meta.k8s.io/v1 Tables when the Accept header asks `as=Table`, every row carrying its object
  (`includeObject`: PartialObjectMetadata by default, Object when kubectl sorts). The server prints every column
  (GenerateOptions Wide) and kubectl hides priority-1 ones without `-o wide`. Columns: pods and events as
  kubernetes v1.32.0 pkg/printers/internalversion/printers.go (AddHandlers: podColumnDefinitions,
  eventColumnDefinitions; printPod, printEvent); the InferenceService's from KServe's CRD additionalPrinterColumns
  (kserve v0.13.1, v0.15.2 and v0.16.0 config/crd/full/serving.kserve.io_inferenceservices.yaml, the same in all
  three), evaluated as apiextensions-apiserver's tableconvertor does (first match, absent is <none>); a custom
  resource without printer columns (ServiceMonitor) gets Name and Age. Ages as apimachinery's
  duration.HumanDuration.
- labelSelector (equality) and fieldSelector (an event's involvedObject.*); pods/log from the container's own log
  since its current start (`container`, `tailLines`); metrics.k8s.io/v1beta1 PodMetrics from the engine's stats of
  the container.
- The pod's container as Knative's revision reconciler writes it (support.kserve_compose.knative_deployment_container:
  the port renamed user-port, the HTTP readiness probe moved to the queue-proxy) with the terminationMessagePolicy
  makeContainer gives it, FallbackToLogsOnError (knative.dev/serving pkg/reconciler/revision/resources/deploy.go):
  a container that fails leaves the tail of its log (80 lines, 2 KiB) as lastState.terminated.message.
- A kubelet for each pod: readiness is the composed readinessProbe against the container every periodSeconds, false
  after failureThreshold failures in a row; a container that exits is started again (restartCount, lastState
  .terminated with its exit code and reason Error or OOMKilled, the phase stays Running); the events it records
  (Pulled, Created, Started, Unhealthy), counted as client-go's recorder aggregates them; the scheduler's
  Scheduled, written through events.k8s.io/v1 (eventTime, no lastTimestamp); and KServe's InferenceServiceReady
  event (kserve v0.15.2 pkg/controller/v1beta1/inferenceservice/controller.go, Reconcile; source
  v1beta1Controllers, cmd/manager/main.go).

Not here: writes, watches, port-forward and exec (their stream protocols), the liveness probe, Knative's
queue-proxy container (the pod shows only kserve-container), set-based selectors and the log options other than
container and tailLines (each answers 400).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from support.containers import Container, http_get
from support.kserve_compose import knative_deployment_container
from support.http import send_json
from support.k8s_standin import KubernetesStandin, _status, rfc3339

NODE = socket.gethostname()  # the machine the containers run on
CONTAINER = "kserve-container"

#: (group, version) -> [(resource, singular, kind, short names)]: what discovery lists, all namespaced, read-only.
RESOURCES = {
    ("", "v1"): [("pods", "pod", "Pod", ["po"]), ("pods/log", "", "Pod", []), ("events", "event", "Event", ["ev"]),
                 ("services", "service", "Service", ["svc"])],
    ("networking.k8s.io", "v1"): [("networkpolicies", "networkpolicy", "NetworkPolicy", ["netpol"])],
    ("serving.kserve.io", "v1beta1"): [("inferenceservices", "inferenceservice", "InferenceService", ["isvc"])],
    ("monitoring.coreos.com", "v1"): [("servicemonitors", "servicemonitor", "ServiceMonitor", ["smon"])],
    ("metrics.k8s.io", "v1beta1"): [("pods", "", "PodMetrics", [])],
}
KIND_RESOURCE = {kind: (group, version, resource) for (group, version), listed in RESOURCES.items()
                 for resource, _, kind, _ in listed if group != "metrics.k8s.io" and "/" not in resource}
PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                  r"(?:/namespaces/(?P<namespace>[^/]+))?(?:/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)"
                  r"(?:/(?P<sub>log))?)?)?$")

#: kubernetes v1.32.0 pkg/printers/internalversion/printers.go, AddHandlers: (name, type, priority).
POD_COLUMNS = [("Name", "string", 0), ("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "string", 0),
               ("Age", "string", 0), ("IP", "string", 1), ("Node", "string", 1), ("Nominated Node", "string", 1),
               ("Readiness Gates", "string", 1)]
EVENT_COLUMNS = [("Last Seen", "string", 0), ("Type", "string", 0), ("Reason", "string", 0),
                 ("Object", "string", 0), ("Subobject", "string", 1), ("Source", "string", 1),
                 ("Message", "string", 0), ("First Seen", "string", 1), ("Count", "string", 1),
                 ("Name", "string", 1)]
#: KServe's CRD additionalPrinterColumns (see above): (name, type, jsonPath).
ISVC_COLUMNS = [("URL", "string", ".status.url"), ("Ready", "string", ".status.conditions[?(@.type=='Ready')].status"),
                ("Prev", "integer", ".status.components.predictor.traffic[?(@.tag=='prev')].percent"),
                ("Latest", "integer", ".status.components.predictor.traffic[?(@.latestRevision==true)].percent"),
                ("PrevRolledoutRevision", "string",
                 ".status.components.predictor.traffic[?(@.tag=='prev')].revisionName"),
                ("LatestReadyRevision", "string",
                 ".status.components.predictor.traffic[?(@.latestRevision==true)].revisionName"),
                ("Age", "date", ".metadata.creationTimestamp")]
JSONPATH_STEP = re.compile(r"\.(\w+)|\[\?\(@\.(\w+)==(?:'([^']*)'|(true|false))\)\]")


def epoch_of(stamp: str) -> float:
    """An RFC 3339 time (the engine's nanoseconds and offset included) as seconds since the epoch."""
    stamp = re.sub(r"(\.\d{6})\d+", r"\1", stamp.strip()).replace("Z", "+00:00")
    stamp = re.sub(r" ([+-]\d{2})(\d{2}) \w+$", r"\1:\2", stamp).replace(" ", "T", 1)
    return dt.datetime.fromisoformat(stamp).timestamp()


def human_duration(seconds: float) -> str:
    """apimachinery pkg/util/duration HumanDuration: about three significant figures, from seconds to years."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    days, years = hours // 24, hours // (24 * 365)

    def two(big: int, unit: str, small: int, small_unit: str) -> str:
        return f"{big}{unit}{small}{small_unit}" if small else f"{big}{unit}"

    if minutes < 10:
        return two(minutes, "m", s % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return two(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return two(days, "d", hours % 24, "h")
    if hours < 24 * 365 * 2:
        return f"{days}d"
    return two(years, "y", days % 365, "d") if hours < 24 * 365 * 8 else f"{years}y"


def since(stamp: str) -> str:
    return human_duration(time.time() - epoch_of(stamp)) if stamp else "<unknown>"


def jsonpath_first(obj: Any, path: str) -> Any:
    """The first value of a Kubernetes JSONPath made of fields and `[?(@.k=='v')]` filters; None when absent."""
    values = [obj]
    for key, fkey, fstr, fbool in JSONPATH_STEP.findall(path):
        if key:
            values = [v[key] for v in values if isinstance(v, dict) and key in v]
        else:
            want = fstr if fbool == "" else fbool == "true"
            values = [item for v in values if isinstance(v, list) for item in v
                      if isinstance(item, dict) and item.get(fkey) == want]
    return values[0] if values else None


class SelectorError(ValueError):
    pass


def matches(labels: dict, selector: str) -> bool:
    """An equality-based label (or field) selector: `k=v`, `k==v`, `k!=v`, comma-separated; SelectorError for
    anything else (set-based selectors are not emulated)."""
    for term in filter(None, selector.split(",")):
        parsed = re.match(r"^([^!=()\s]+)(!=|==|=)([^!=()\s]*)$", term)
        if parsed is None:
            raise SelectorError(f"unable to parse requirement: {term!r} (only equality selectors are emulated)")
        key, op, value = parsed.groups()
        if (labels.get(key) == value) != (op != "!="):
            return False
    return True


@dataclass
class Pod:
    """A predictor pod: one real container, shown as the pod the cluster would make from the composed spec."""

    name: str
    namespace: str
    container: Container
    spec: dict  # the composed kserve-container
    url: str  # where the kubelet reaches the container's probe port
    labels: dict
    uid: str
    created: float = field(default_factory=time.time)
    restarts: int = 0
    last_state: dict = field(default_factory=dict)
    ready: bool = False
    failures: int = 0  # readiness probe failures in a row
    started_at: str = ""
    next_probe: float = 0.0

    def object(self) -> dict:
        inspect = self.container.inspect()
        state = inspect["State"]
        running = state["Status"] == "running"
        ip = (inspect.get("NetworkSettings") or {}).get("IPAddress") or ""
        limits = (self.spec.get("resources") or {}).get("limits") or {}
        requests = (self.spec.get("resources") or {}).get("requests") or {}
        conditions = [{"type": t, "status": "True" if ok else "False"}
                      for t, ok in (("Initialized", True), ("Ready", self.ready and running),
                                    ("ContainersReady", self.ready and running), ("PodScheduled", True))]
        status = {"name": CONTAINER, "ready": self.ready and running, "started": running,
                  "restartCount": self.restarts, "image": self.container_image(inspect),
                  "imageID": inspect.get("Image", ""), "containerID": f"podman://{inspect['Id']}",
                  "state": ({"running": {"startedAt": rfc3339(epoch_of(state["StartedAt"]))}} if running else
                            {"terminated": {"exitCode": state["ExitCode"], "reason": _exit_reason(state)}}),
                  "lastState": copy.deepcopy(self.last_state)}
        spec = knative_deployment_container({**self.spec, "name": CONTAINER, "ports": [
            {k: v for k, v in p.items() if k != "hostPort"} for p in self.spec.get("ports", [])]})
        spec["terminationMessagePolicy"] = "FallbackToLogsOnError"
        qos = "Guaranteed" if limits and limits == requests else "Burstable"
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                             "labels": dict(self.labels), "creationTimestamp": rfc3339(self.created)},
                "spec": {"containers": [spec], "nodeName": NODE, "restartPolicy": "Always",
                         "serviceAccountName": "default"},
                "status": {"phase": "Running", "conditions": conditions,
                           "hostIP": "127.0.0.1", "podIP": ip, "podIPs": [{"ip": ip}] if ip else [],
                           "startTime": rfc3339(self.created), "containerStatuses": [status], "qosClass": qos}}

    @staticmethod
    def container_image(inspect: dict) -> str:
        return inspect.get("ImageName") or (inspect.get("Config") or {}).get("Image", "")


def _exit_reason(state: dict) -> str:
    return "OOMKilled" if state.get("OOMKilled") else ("Completed" if state.get("ExitCode") == 0 else "Error")


class OperatorAPI:
    """Serves the cluster's read paths to kubectl; a background kubelet keeps the pods' state and events."""

    def __init__(self, standin: KubernetesStandin, namespace: str = "models") -> None:
        self.standin = standin
        self.namespace = namespace
        self.pods: list[Pod] = []
        self.objects: dict[tuple[str, str, str], dict] = {}  # (resource, namespace, name) -> object
        self.events: list[dict] = []
        self.ready_isvcs: set[str] = set()
        self.error: BaseException | None = None  # what stopped the kubelet, if anything did
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ what is in the cluster

    def apply(self, obj: dict) -> None:
        """Store a manifest's object in this namespace, as `kubectl apply -n NS` would."""
        group, _, resource = KIND_RESOURCE[obj["kind"]]
        obj = copy.deepcopy(obj)
        obj["metadata"] = {**obj["metadata"], "namespace": self.namespace,
                           "creationTimestamp": rfc3339(time.time()),
                           "uid": hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:32]}
        with self._lock:
            self.objects[(resource, self.namespace, obj["metadata"]["name"])] = obj

    def add_pod(self, isvc: str, container: Container, spec: dict, url: str) -> Pod:
        """The predictor pod of InferenceService `isvc`'s latest ready revision (serverless), backed by `container`."""
        status = self.standin.isvc(self.namespace, isvc)["status"]
        revision = status["components"]["predictor"]["latestReadyRevision"]
        digest = hashlib.sha256(container.inspect()["Id"].encode()).hexdigest()
        labels = {"serving.kserve.io/inferenceservice": isvc, "component": "predictor", "app": revision,
                  "serving.knative.dev/revision": revision, "serving.knative.dev/service": f"{isvc}-predictor",
                  "serving.knative.dev/configuration": f"{isvc}-predictor"}
        pod = Pod(f"{revision}-deployment-{digest[:10]}-{digest[10:15]}", self.namespace, container,
                  copy.deepcopy(spec), url, labels, f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-"
                  f"{digest[20:32]}")
        pod.started_at = container.inspect()["State"]["StartedAt"]
        image = Pod.container_image(container.inspect())
        with self._lock:
            self.pods.append(pod)
            self._event(pod, "Scheduled", f"Successfully assigned {self.namespace}/{pod.name} to {NODE}",
                        source="default-scheduler", path="", series=True)
            self._started(pod, image)
        return pod

    def _started(self, pod: Pod, image: str) -> None:
        self._event(pod, "Pulled", f'Container image "{image}" already present on machine')
        self._event(pod, "Created", f"Created container: {CONTAINER}")
        self._event(pod, "Started", f"Started container {CONTAINER}")

    def _event(self, pod: Pod | None, reason: str, message: str, kind: str = "Normal", source: str = "kubelet",
               path: str | None = None, obj: dict | None = None, series: bool = False) -> None:
        """Record an event, aggregated as client-go's recorder does: the same object, reason and message add to
        the count of the one already there. `series`: written through events.k8s.io/v1, as the scheduler does,
        which the core/v1 view shows with eventTime and without first/lastTimestamp or count."""
        involved = obj or {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid,
                           "apiVersion": "v1",
                           **({"fieldPath": f"spec.containers{{{CONTAINER}}}"} if path is None else {})}
        now = rfc3339(time.time())
        for event in self.events:
            if event["involvedObject"] == involved and (event["reason"], event["message"]) == (reason, message):
                event["count"] += 1
                event["lastTimestamp"] = now
                return
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{involved['name']}.{len(self.events):016x}", "namespace": involved["namespace"],
                         "creationTimestamp": now, "uid": f"event-{len(self.events)}"},
            "involvedObject": involved, "reason": reason, "message": message, "type": kind, "count": 1,
            "source": {"component": source, **({"host": NODE} if source == "kubelet" else {})},
            "firstTimestamp": now, "lastTimestamp": now, "reportingComponent": source,
            "reportingInstance": NODE if source == "kubelet" else ""}
        if series:
            event.update(eventTime=now, source={}, firstTimestamp=None, lastTimestamp=None, count=0)
        self.events.append(event)

    # ------------------------------------------------------------------ the kubelet and KServe's events

    def sync(self) -> None:
        """One turn of the kubelet over every pod: restart what exited, probe readiness when due."""
        with self._lock:
            for pod in self.pods:
                self._sync_pod(pod)
            self._isvc_events()

    def _sync_pod(self, pod: Pod) -> None:
        inspect = pod.container.inspect()
        state = inspect["State"]
        if state["Status"] == "exited":
            terminated = {"exitCode": state["ExitCode"], "reason": _exit_reason(state),
                          "startedAt": rfc3339(epoch_of(state["StartedAt"])),
                          "finishedAt": rfc3339(epoch_of(state["FinishedAt"])),
                          "containerID": f"podman://{inspect['Id']}"}
            if state["ExitCode"] != 0:  # FallbackToLogsOnError: the log's last 80 lines, at most 2 KiB
                tail = "".join(pod.container.logs(since=pod.started_at).splitlines(keepends=True)[-80:])
                terminated["message"] = tail.encode()[-2048:].decode(errors="ignore")
            pod.last_state = {"terminated": terminated}
            pod.restarts += 1
            pod.ready, pod.failures = False, 0
            pod.container.start()
            pod.started_at = pod.container.inspect()["State"]["StartedAt"]
            self._started(pod, Pod.container_image(inspect))
            pod.next_probe = time.monotonic() + float(pod.spec["readinessProbe"].get("initialDelaySeconds", 0))
            return
        probe = pod.spec["readinessProbe"]
        if state["Status"] != "running" or time.monotonic() < pod.next_probe:
            return
        pod.next_probe = time.monotonic() + float(probe.get("periodSeconds", 10))
        path, port = probe["httpGet"]["path"], probe["httpGet"]["port"]
        try:
            code = http_get(pod.url + path, timeout=float(probe.get("timeoutSeconds", 1)))[0]
        except OSError:  # refused, reset or timed out
            code = 0
        if 200 <= code < 400:
            pod.ready, pod.failures = True, 0
            return
        pod.failures += 1
        pod.ready = pod.ready and pod.failures < int(probe.get("failureThreshold", 3))
        ip = (inspect.get("NetworkSettings") or {}).get("IPAddress") or "127.0.0.1"
        why = (f"HTTP probe failed with statuscode: {code}" if code else
               f'Get "http://{ip}:{port}{path}": dial tcp {ip}:{port}: connect: connection refused')
        self._event(pod, "Unhealthy", f"Readiness probe failed: {why}", kind="Warning")

    def _isvc_events(self) -> None:
        for (resource, namespace, name), obj in list(self.standin.objects.items()):
            if resource != "inferenceservices" or namespace != self.namespace:
                continue
            conditions = (self.standin.isvc(namespace, name).get("status") or {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            if ready and name not in self.ready_isvcs:
                self._event(None, "InferenceServiceReady", f"InferenceService [{name}] is Ready",
                            source="v1beta1Controllers",
                            obj={"kind": "InferenceService", "namespace": namespace, "name": name,
                                 "uid": obj["metadata"].get("uid", name), "apiVersion": "serving.kserve.io/v1beta1"})
            (self.ready_isvcs.add if ready else self.ready_isvcs.discard)(name)

    def _kubelet(self) -> None:
        try:
            while not self._stop.wait(0.5):
                self.sync()
        except Exception as exc:  # kept for the test to show: a kubelet that stopped turns nothing ready again
            self.error = exc

    # ------------------------------------------------------------------ the API

    def _list(self, resource: str, group: str, namespace: str | None) -> list[dict]:
        if resource == "pods" and group in ("", "metrics.k8s.io"):
            objects = [p.object() for p in self.pods]
        elif resource == "events":
            objects = copy.deepcopy(self.events)
        elif resource == "inferenceservices":
            objects = [self.standin.isvc(ns, name) for (r, ns, name) in list(self.standin.objects)
                       if r == "inferenceservices"]
        else:
            objects = [copy.deepcopy(o) for (r, _, _), o in self.objects.items() if r == resource]
        return [o for o in objects if namespace is None or o["metadata"]["namespace"] == namespace]

    def handle(self, path: str, accept: str) -> tuple[int, Any, str]:
        """(status, body, content type) for a GET."""
        url = urllib.parse.urlsplit(path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        if url.path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}, ""
        if url.path == "/apis":
            groups = [{"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                       "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in RESOURCES if g]
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}, ""
        match = PATH.match(url.path)
        if not match:
            return 404, _status(404, "NotFound", "the server could not find the requested resource"), ""
        group, version = (match["group"] or "", match["version"] or match["core"])
        listed = RESOURCES.get((group, version))
        if listed is None:
            return 404, _status(404, "NotFound", "the server could not find the requested resource"), ""
        if not match["resource"]:
            return 200, {"kind": "APIResourceList", "apiVersion": "v1",
                         "groupVersion": f"{group}/{version}" if group else version,
                         "resources": [{"name": r, "singularName": s, "namespaced": True, "kind": k,
                                        "verbs": ["get"] if "/" in r else ["get", "list"], "shortNames": short}
                                       for r, s, k, short in listed]}, ""
        resource, name = match["resource"], match["name"]
        if resource not in {r for r, *_ in listed}:
            return 404, _status(404, "NotFound", "the server could not find the requested resource"), ""
        with self._lock:
            objects = self._list(resource, group, match["namespace"])
            selector = {"labelSelector": lambda o: o["metadata"].get("labels") or {},
                        "fieldSelector": lambda o: _fields(o)}
            for param, fields in selector.items():
                if query.get(param):
                    try:
                        objects = [o for o in objects if matches(fields(o), query[param])]
                    except SelectorError as exc:
                        return 400, _status(400, "BadRequest", str(exc)), ""
            if group == "metrics.k8s.io":
                objects = [self._metrics(o) for o in objects]
            kind = next(k for r, _, k, _ in listed if r == resource)
            if name:
                found = [o for o in objects if o["metadata"]["name"] == name]
                if not found:
                    what = f"{resource}.{group}" if group else resource
                    return 404, _status(404, "NotFound", f'{what} "{name}" not found'), ""
                if match["sub"] == "log":
                    return self._log(found[0], query)
                return (200, self._table(resource, found, query) if "as=Table" in accept else found[0], "")
        if "as=Table" in accept:
            return 200, self._table(resource, objects, query), ""
        return 200, {"kind": f"{kind}List", "apiVersion": f"{group}/{version}" if group else version,
                     "metadata": {"resourceVersion": "1"}, "items": objects}, ""

    def _log(self, pod: dict, query: dict) -> tuple[int, Any, str]:
        wanted = query.get("container", CONTAINER)
        if wanted != CONTAINER:
            return 400, _status(400, "BadRequest", f"container {wanted} is not valid for pod "
                                f"{pod['metadata']['name']}"), ""
        unsupported = sorted(set(query) - {"container", "tailLines", "follow"})
        if unsupported or query.get("follow") == "true":
            return 400, _status(400, "BadRequest", f"not emulated by this stand-in: {', '.join(unsupported)}"), ""
        backing = next(p for p in self.pods if p.name == pod["metadata"]["name"])
        text = backing.container.logs(since=backing.started_at)
        lines = text.split("\n")
        lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
        if query.get("tailLines"):
            lines = lines[-int(query["tailLines"]):] if int(query["tailLines"]) else []
        return 200, "".join(lines), "text/plain"

    def _metrics(self, pod: dict) -> dict:
        backing = next(p for p in self.pods if p.name == pod["metadata"]["name"])
        cores, memory = backing.container.usage()
        return {"kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {k: pod["metadata"][k] for k in ("name", "namespace", "labels", "creationTimestamp")},
                "timestamp": rfc3339(time.time()), "window": "15s",
                "containers": [{"name": CONTAINER, "usage": {"cpu": f"{int(cores * 1e9)}n",
                                                             "memory": f"{int(memory // 1024)}Ki"}}]}

    def _table(self, resource: str, objects: list[dict], query: dict) -> dict:
        if resource == "pods":
            columns, rows = POD_COLUMNS, [_pod_cells(o) for o in objects]
        elif resource == "events":
            columns, rows = EVENT_COLUMNS, [_event_cells(o) for o in objects]
        elif resource == "inferenceservices":
            columns = [("Name", "string", 0)] + [(n, t, 0) for n, t, _ in ISVC_COLUMNS]
            rows = [[o["metadata"]["name"], *[_crd_cell(o, t, p) for _, t, p in ISVC_COLUMNS]] for o in objects]
        else:
            columns = [("Name", "string", 0), ("Age", "date", 0)]
            rows = [[o["metadata"]["name"], since(o["metadata"].get("creationTimestamp", ""))] for o in objects]
        whole = query.get("includeObject") == "Object"
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": "1"},
                "columnDefinitions": [{"name": n, "type": t, "format": "name" if n == "Name" else "",
                                       "description": "", "priority": p} for n, t, p in columns],
                "rows": [{"cells": cells, "object": o if whole else
                          {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                           "metadata": o["metadata"]}} for cells, o in zip(rows, objects)]}

    def __enter__(self) -> str:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body, content_type = api.handle(self.path, self.headers.get("Accept", ""))
                if content_type == "text/plain":
                    data = body.encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    send_json(self, status, body)

            def _refuse(self) -> None:
                send_json(self, 405, _status(405, "MethodNotAllowed", "this stand-in serves reads only"))

            do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self._thread = threading.Thread(target=self._kubelet, daemon=True)
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __exit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._stop.set()
        self._thread.join(timeout=60)  # no probe or restart of the container after this
        self._server.shutdown()
        self._server.server_close()


def _fields(obj: dict) -> dict:
    """The fields a fieldSelector can name: metadata.name/namespace, and an event's involvedObject.*."""
    out = {f"metadata.{k}": obj["metadata"].get(k, "") for k in ("name", "namespace")}
    out.update({f"involvedObject.{k}": v for k, v in (obj.get("involvedObject") or {}).items()})
    return out


def _pod_cells(pod: dict) -> list:
    """printPod: ready/total, the status reason, restarts with the time of the last one, age, and the wide cells."""
    statuses = pod["status"].get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    reason = pod["status"]["phase"]
    for status in statuses:
        terminated = status["state"].get("terminated")
        if terminated:
            reason = terminated.get("reason") or f"ExitCode:{terminated['exitCode']}"
    restarts = sum(s["restartCount"] for s in statuses)
    finished = [s["lastState"]["terminated"]["finishedAt"] for s in statuses
                if (s.get("lastState") or {}).get("terminated")]
    restarts_cell = f"{restarts} ({since(max(finished))} ago)" if finished else str(restarts)
    return [pod["metadata"]["name"], f"{ready}/{len(pod['spec']['containers'])}", reason, restarts_cell,
            since(pod["metadata"]["creationTimestamp"]), pod["status"].get("podIP") or "<none>",
            pod["spec"].get("nodeName") or "<none>", "<none>", "<none>"]


def _event_cells(event: dict) -> list:
    """printEvent: last seen, type, reason, kind/name, message, and the wide cells (subobject, source, first seen,
    count, name); an events.k8s.io event (no first/lastTimestamp) is dated by its eventTime, its source by its
    reportingComponent."""
    involved = event["involvedObject"]
    first = since(event.get("firstTimestamp") or event.get("eventTime") or "")
    last = since(event["lastTimestamp"]) if event.get("lastTimestamp") else first
    source = ", ".join(filter(None, (event["source"].get("component"), event["source"].get("host")))) \
        or event.get("reportingComponent", "")
    return [last, event["type"], event["reason"], f"{involved['kind'].lower()}/{involved['name']}",
            involved.get("fieldPath", ""), source, event["message"].strip(), first, event["count"] or 1,
            event["metadata"]["name"]]


def _crd_cell(obj: dict, kind: str, path: str) -> Any:
    value = jsonpath_first(obj, path)
    if value is None:
        return None
    return since(value) if kind == "date" else value
