"""A Kubernetes API server stand-in on loopback for the paths the gate, deploy and rollback call.

It behaves like the real API server (and KServe's controller behind it) where the pipeline's correctness
depends on it:

- InferenceServices (serving.kserve.io/v1beta1, a CRD with the status subresource): GET, POST, PUT and PATCH
  as `application/merge-patch+json` (RFC 7386) or `application/json-patch+json` (RFC 6902). Other patch types
  answer 415: the API server has no strategic merge patch for custom resources. ConfigMaps: GET, POST, PUT.
  PersistentVolumeClaims and Secrets: GET (tests add them with `add_pvc`, `add_secret`).
- metadata.generation rises when spec changes, never on a metadata-only change; metadata.resourceVersion
  rises on every write, the controller's status writes included. A PUT, or a patch, that carries a stale
  metadata.resourceVersion answers 409 Conflict; a PUT of a custom resource without one answers 422. Status
  sent to the main resource is ignored (status subresource).
- KServe's controller, simulated from KServe 0.13-0.15's source: every change of the InferenceService's
  spec, labels or annotations (KServe copies labels and annotations, less its disallowed list, into the
  revision template) makes a new revision `reconcile_delay_s` later; it becomes ready `ready_delay_s` after
  that, or fails when `fail_revisions` is set. status.observedGeneration is the Knative Service's or the
  Deployment's generation (one per template), as KServe copies it, not the InferenceService's; no storageUri
  is reported in status. Serverless (`mode`, the default): a failed revision is Ready False with reason
  RevisionFailed, as Knative's Configuration reports it, and traffic stays on the last ready revision.
  RawDeployment: the webhook's deploymentMode annotation, 0.13's status (latestCreatedRevision is the
  Deployment's revision, Ready is its Available, True while old pods run), and the predictor Deployment at
  apps/v1 (a rolling update; a failed revision ends in ProgressDeadlineExceeded).
- Serverless traffic as KServe and Knative split it (support.kserve_traffic): canaryTrafficPercent against the
  latest rolled-out revision, tag routing (`latest`, `prev`, each with its URL), the rolled-out revisions in status;
  changing canaryTrafficPercent alone makes no revision.
- KServe's composition: a spec that names the shipped ClusterServingRuntime (deploy/kserve/servingruntime.yaml)
  is merged with it as KServe merges them and checked as Knative's webhook (serverless) or the API server (the
  raw Deployment) would (support.kserve_compose). A pod they would refuse makes no revision at all: KServe's
  write of the Knative Service or the Deployment is refused, its reconcile fails and the status stays where it
  was. The reasons are kept in `refused`.
- RBAC: only the verbs the Role in deploy/kubeflow/rbac.yaml grants (on its resourceNames where it names them), in
  its namespace, else 403 (`forbidden`
  refuses everything); 401 for a wrong token.
- Faults on demand: `fail_next(method, resource, code)` answers the next matching request with that code;
  `lose_answer_next(method, resource)` stores the next write but answers 504;
  `interfere_next(method, resource)` makes another writer (the controller) change the object just before the
  next matching request, so a resourceVersion read before it is stale.

Every request is recorded in `requests`.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from support.http import send_json
from support.kserve_compose import KNATIVE, RAW, ComposeError, compose, pod_errors
from support.kserve_traffic import ksvc_traffic, propagate, route_traffic

from pipeline.releases import RAW_MODE_NAMES
from settings import REPO
from serving.runtimes import SERVING_RUNTIMES

ISVC = ("serving.kserve.io", "inferenceservices")
PATH = re.compile(r"^/(?:apis/(?P<group>[^/]+)/(?P<version>[^/]+)|api/(?P<core>v1))/namespaces/(?P<namespace>[^/]+)/"
                  r"(?P<resource>[^/?]+)(?:/(?P<name>[^/?]+))?(?:\?.*)?$")
SERVED = {ISVC: "v1beta1", ("", "configmaps"): "v1", ("", "persistentvolumeclaims"): "v1", ("", "secrets"): "v1",
          ("apps", "deployments"): "v1"}
#: KServe's default serviceAnnotationDisallowedList (pkg/constants): annotations not copied to revisions.
NOT_PROPAGATED = ("autoscaling.knative.dev/min-scale", "autoscaling.knative.dev/max-scale",
                  "internal.serving.kserve.io/storage-initializer-sourceuri",
                  "kubectl.kubernetes.io/last-applied-configuration")
VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
MERGE_PATCH, JSON_PATCH = "application/merge-patch+json", "application/json-patch+json"
ROLE_FILE = REPO / "deploy" / "kubeflow" / "rbac.yaml"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class PatchError(Exception):
    pass


def json_patch(target: dict, operations: list) -> dict:
    """RFC 6902 JSON patch (add, remove, replace, test) on object paths."""
    out = copy.deepcopy(target)
    for op in operations:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if op["op"] == "test":
            if node.get(last) != op["value"]:
                raise PatchError(f"test failed at {op['path']}")
        elif op["op"] in ("add", "replace"):
            node[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            node.pop(last, None)
        else:
            raise PatchError(f"unsupported op {op['op']}")
    return out


def shipped_role() -> dict:
    return next(d for d in yaml.safe_load_all(ROLE_FILE.read_text()) if d and d["kind"] == "Role")


class KubernetesStandin:
    def __init__(self, token: str = "test-token", role: dict | None = None, reconcile_delay_s: float = 0.0,
                 ready_delay_s: float = 0.0, mode: str = "Serverless") -> None:
        self.token = token
        self.mode = mode
        self.role = role if role is not None else shipped_role()
        self.reconcile_delay_s = reconcile_delay_s
        self.ready_delay_s = ready_delay_s
        self.fail_revisions = ""  # non-empty: revisions made from now on fail with this message
        self.refused: list[str] = []  # why KServe could not make the pod of a spec (no revision was made)
        self.forbidden = False
        self.objects: dict[tuple[str, str, str], dict] = {}  # (resource, namespace, name) -> object
        self.revisions: dict[tuple[str, str], list[dict]] = {}  # InferenceService -> its revisions, oldest first
        #: InferenceService -> KServe's {"latest", "previous"} rolled-out revision (support.kserve_traffic.propagate)
        self.rolled_out: dict[tuple[str, str], dict[str, str]] = {}
        self.requests: list[dict] = []
        self._faults: list[dict] = []
        self._versions = itertools.count(1)
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ test controls

    def add_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
        self.objects[("secrets", namespace, name)] = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": encoded,
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(next(self._versions))}}

    def add_pvc(self, namespace: str, name: str, access_modes: list[str], bound: bool = True) -> None:
        pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(next(self._versions))},
               "spec": {"accessModes": list(access_modes), "resources": {"requests": {"storage": "1Gi"}}},
               "status": {"phase": "Bound", "accessModes": list(access_modes)} if bound else {"phase": "Pending"}}
        self.objects[("persistentvolumeclaims", namespace, name)] = pvc

    def fail_next(self, method: str, resource: str, code: int = 500, times: int = 1, after: int = 0) -> None:
        """The next `times` matching requests, once `after` more have passed, answer `code`."""
        self._faults.append({"method": method, "resource": resource, "code": code, "times": times, "kind": "fail",
                             "after": after})

    def lose_answer_next(self, method: str, resource: str, code: int = 504) -> None:
        """The next matching write is applied, but its answer is lost: the client sees `code` (a gateway timeout)."""
        self._faults.append({"method": method, "resource": resource, "code": code, "times": 1, "kind": "lose"})

    def interfere_next(self, method: str, resource: str, times: int = 1, after: int = 0) -> None:
        self._faults.append({"method": method, "resource": resource, "times": times, "kind": "interfere",
                             "after": after})

    def isvc(self, namespace: str, name: str) -> dict:
        with self._lock:
            self._reconcile()
            return copy.deepcopy(self.objects[("inferenceservices", namespace, name)])

    # ------------------------------------------------------------------ KServe's controller

    def _template(self, obj: dict) -> Any:
        """What a revision is made from: canaryTrafficPercent sets the Knative Service's traffic, not its template
        (createKnativeService), so changing only it makes no revision."""
        meta = obj["metadata"]
        notes = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in NOT_PROPAGATED}
        spec = copy.deepcopy(obj.get("spec") or {})
        (spec.get("predictor") or {}).pop("canaryTrafficPercent", None)
        return [spec, meta.get("labels") or {}, notes]

    def _refusal(self, obj: dict) -> str:
        """Why KServe could not make this spec's predictor pod from the shipped runtime it names (either of
        serving.runtimes.SERVING_RUNTIMES); "" when it can, or when the spec names another runtime (which this
        stand-in does not hold)."""
        model = ((obj.get("spec") or {}).get("predictor") or {}).get("model") or {}
        shipped = [rt.manifest for rt in SERVING_RUNTIMES.values() if rt.cluster_runtime == model.get("runtime")]
        if not shipped:
            return ""
        (runtime,) = [d for d in yaml.safe_load_all(shipped[0].read_text()) if d]
        try:
            container = compose(runtime, obj)
        except ComposeError as exc:
            return str(exc)
        return "; ".join(pod_errors(container, RAW if self.mode in RAW_MODE_NAMES else KNATIVE))

    def _new_revision(self, key: tuple[str, str], obj: dict) -> None:
        refused = self._refusal(obj)
        if refused:
            self.refused.append(refused)
            return
        revisions = self.revisions.setdefault(key, [])
        if revisions and revisions[-1]["template"] == self._template(obj):  # back to what runs after a refusal
            return
        now = time.monotonic()  # the delays as they are when the change is made
        revisions.append({"name": f"{key[1]}-predictor-{len(revisions) + 1:05d}", "fails": self.fail_revisions,
                          "created_at": now + self.reconcile_delay_s,
                          "done_at": now + self.reconcile_delay_s + self.ready_delay_s, "template": self._template(obj),
                          "storageUri": ((obj.get("spec") or {}).get("predictor") or {}).get("model", {})
                          .get("storageUri")})

    def _status(self, key: tuple[str, str], obj: dict) -> dict:
        now = time.monotonic()
        created = [r for r in self.revisions.get(key, []) if now >= r["created_at"]]
        if not created:
            return {}
        done = [r for r in created if now >= r["done_at"]]
        ready = [r for r in done if not r["fails"]]
        latest = created[-1]
        if self.mode in RAW_MODE_NAMES:
            condition = ({"type": "Ready", "status": "True"} if ready else
                         {"type": "Ready", "status": "False", "reason": "MinimumReplicasUnavailable"})
            status = {"observedGeneration": len(created),
                      "conditions": [{**condition, "type": "PredictorReady"},
                                     {"type": "IngressReady", "status": "True"}, condition],
                      "components": {"predictor": {"latestCreatedRevision": str(len(created))}}}
            if ready:
                status["url"] = f"http://{key[1]}.{key[0]}.example.com"
            return status
        predictor: dict[str, Any] = {"latestCreatedRevision": latest["name"]}
        if latest in ready:
            condition = {"type": "Ready", "status": "True"}
        elif latest in done:
            condition = {"type": "Ready", "status": "False", "reason": "RevisionFailed",
                         "message": f'Revision "{latest["name"]}" failed with message: {latest["fails"]}.'}
        else:
            condition = {"type": "Ready", "status": "Unknown"}
        status: dict[str, Any] = {"observedGeneration": len(created),
                                  "conditions": [{**condition, "type": "PredictorReady"},
                                                 {"type": "IngressReady", "status": "True"}, condition],
                                  "components": {"predictor": predictor}}
        if ready:
            predictor["latestReadyRevision"] = ready[-1]["name"]
            rolled = self.rolled_out.get(key, {})
            spec = (obj.get("spec") or {}).get("predictor") or {}
            targets = ksvc_traffic(spec.get("canaryTrafficPercent"), obj["metadata"].get("annotations") or {},
                                   rolled.get("latest", ""))
            traffic = route_traffic(targets, ready[-1]["name"], {r["name"] for r in ready}, f"{key[1]}-predictor",
                                    key[0])
            if traffic is None:  # Knative keeps the route as it was
                traffic = ((obj.get("status") or {}).get("components") or {}).get("predictor", {}).get("traffic", [])
            predictor["traffic"] = traffic
            rolled = self.rolled_out[key] = propagate(rolled, traffic, ready[-1]["name"], latest["name"])
            predictor.update({f"{which}RolledoutRevision": name for which, name in rolled.items() if name})
            status["url"] = predictor["url"] = f"http://{key[1]}.{key[0]}.example.com"
        return status

    def serving(self, namespace: str, name: str) -> dict[str, int]:
        """{revision name: percent of traffic} as the route now splits it (serverless)."""
        traffic = (((self.isvc(namespace, name).get("status") or {}).get("components") or {}).get("predictor")
                   or {}).get("traffic") or []
        out: dict[str, int] = {}
        for target in traffic:
            out[target["revisionName"]] = out.get(target["revisionName"], 0) + target["percent"]
        return out

    def _reconcile(self) -> None:
        """What the controller would have written by now: status changes, each a write (new resourceVersion)."""
        for (resource, namespace, name), obj in self.objects.items():
            if resource == "inferenceservices":
                status = self._status((namespace, name), obj)
                if status != obj.get("status"):
                    obj["status"] = status
                    obj["metadata"]["resourceVersion"] = str(next(self._versions))

    def served_storage_uri(self, namespace: str, name: str) -> str | None:
        """The storageUri of the revision that takes the most traffic (serverless; the newest on a tie) or the newest
        ready one (raw): what callers get (a real cluster shows it only in pods)."""
        now = time.monotonic()
        ready = [r for r in self.revisions.get((namespace, name), []) if now >= r["done_at"] and not r["fails"]]
        if not ready:
            return None
        shares = self.serving(namespace, name) if self.mode not in RAW_MODE_NAMES else {}
        return max(reversed(ready), key=lambda r: shares.get(r["name"], 0))["storageUri"]

    def storage_of(self, namespace: str, name: str, revision: str) -> str:
        """The storageUri revision `revision` of InferenceService `name` was made from."""
        return next(r["storageUri"] for r in self.revisions[(namespace, name)] if r["name"] == revision)

    def _deployment(self, namespace: str, name: str) -> dict | None:
        """The predictor Deployment of raw mode: one replica, rolled by surge (the old pod runs until the new one
        is available)."""
        key = (namespace, name.removesuffix("-predictor"))
        now = time.monotonic()
        created = [r for r in self.revisions.get(key, []) if now >= r["created_at"]]
        if self.mode not in RAW_MODE_NAMES or not name.endswith("-predictor") or not created:
            return None
        latest, older = created[-1], [r for r in created[:-1] if now >= r["done_at"] and not r["fails"]]
        done = now >= latest["done_at"]
        progressing = ({"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
                       if done and not latest["fails"] else
                       {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                        "message": f'ReplicaSet "{name}-{len(created)}" has timed out progressing.'}
                       if done else {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"})
        new_available = int(done and not latest["fails"])
        old_running = int(bool(older) and not new_available)
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace, "generation": len(created),
                             "resourceVersion": str(next(self._versions))},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": f"isvc.{name}"}},
                         "template": {"metadata": {"labels": {"app": f"isvc.{name}"}},
                                      "spec": {"containers": [{"name": "kserve-container", "image": "serving"}]}}},
                "status": {"observedGeneration": len(created), "replicas": 1 + old_running, "updatedReplicas": 1,
                           "availableReplicas": new_available + old_running, "conditions": [progressing]}}

    # ------------------------------------------------------------------ the API

    def _allowed(self, verb: str, group: str, resource: str, namespace: str, name: str | None) -> bool:
        if self.forbidden or namespace != self.role["metadata"]["namespace"]:
            return False
        return any(group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
                   and verb in rule.get("verbs", []) and name in rule.get("resourceNames", [name])
                   for rule in self.role["rules"])

    def _fault(self, method: str, resource: str) -> dict | None:
        for fault in self._faults:
            if fault["method"] == method and fault["resource"] == resource:
                if fault.get("after", 0) > 0:
                    fault["after"] -= 1
                    return None
                fault["times"] -= 1
                if fault["times"] <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict]:
        with self._lock:
            self._reconcile()
            return self._handle(method, path, headers, body)

    def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict]:
        self.requests.append({"method": method, "path": path, "headers": headers,
                              "body": json.loads(body) if body else None})
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        match = PATH.match(path)
        if not match:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        group, resource, namespace, name = (match["group"] or "", match["resource"], match["namespace"],
                                            match["name"])
        if SERVED.get((group, resource)) != (match["version"] or match["core"]):
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        kind = f"{resource}.{group}" if group else resource
        verb = VERBS[method] if name or method != "GET" else "list"
        if not self._allowed(verb, group, resource, namespace, name):
            return 403, _status(403, "Forbidden", f'{kind} "{name or ""}" is forbidden: User '
                                f'"system:serviceaccount:kubeflow:pipeline-runner" cannot {verb} resource '
                                f'"{resource}" in API group "{group}" in the namespace "{namespace}"')
        fault = self._fault(method, resource)
        if fault and fault["kind"] == "fail":
            return fault["code"], _status(fault["code"], "InternalError", "Internal error occurred: injected")
        if fault and fault["kind"] == "interfere" and (resource, namespace, name) in self.objects:
            self.objects[(resource, namespace, name)]["metadata"]["resourceVersion"] = str(next(self._versions))
        key = (resource, namespace, name or "")
        if resource == "deployments" and method == "GET" and name:
            deployment = self._deployment(namespace, name)
            if deployment is None:
                return 404, _status(404, "NotFound", f'{kind} "{name}" not found')
            return 200, deployment
        if method == "GET" and name:
            if key not in self.objects:
                return 404, _status(404, "NotFound", f'{kind} "{name}" not found')
            return 200, self.objects[key]
        if method == "POST" and not name and resource != "persistentvolumeclaims":
            obj = json.loads(body)
            key = (resource, namespace, obj["metadata"]["name"])
            if key in self.objects:
                return 409, _status(409, "AlreadyExists", f'{kind} "{key[2]}" already exists')
            obj["metadata"].update(namespace=namespace, resourceVersion=str(next(self._versions)),
                                   creationTimestamp=rfc3339(time.time()))
            obj.pop("status", None)
            if resource == "inferenceservices":
                obj["metadata"]["generation"] = 1
                if self.mode in RAW_MODE_NAMES:  # KServe's defaulting webhook
                    obj["metadata"].setdefault("annotations", {})["serving.kserve.io/deploymentMode"] = self.mode
                self._new_revision((namespace, key[2]), obj)
            self.objects[key] = obj
            return 201, obj
        if method in ("PUT", "PATCH") and name and resource != "persistentvolumeclaims":
            if key not in self.objects:
                return 404, _status(404, "NotFound", f'{kind} "{name}" not found')
            status, answer = self._write(method, key, kind, headers.get("content-type", ""), json.loads(body))
            if fault and fault["kind"] == "lose" and status < 300:
                return fault["code"], _status(fault["code"], "Timeout", "the write was stored, its answer was lost")
            return status, answer
        return 405, _status(405, "MethodNotAllowed", f"{method} is not supported on {kind}")

    def _write(self, method: str, key: tuple[str, str, str], kind: str, content_type: str,
               body: Any) -> tuple[int, dict]:
        before = self.objects[key]
        if method == "PATCH":
            if content_type.split(";")[0] == MERGE_PATCH and isinstance(body, dict):
                given = (body.get("metadata") or {}).get("resourceVersion")
                after = merge_patch(before, body)
            elif content_type.split(";")[0] == JSON_PATCH and isinstance(body, list):
                given = next((op["value"] for op in body if op.get("path") == "/metadata/resourceVersion"
                              and op.get("op") in ("test", "replace", "add")), None)
                try:
                    after = json_patch(before, body)
                except (PatchError, KeyError, IndexError, ValueError) as exc:
                    return 422, _status(422, "Invalid", f"the server rejected our request: {exc}")
            else:
                return 415, _status(415, "UnsupportedMediaType", f'the body of the request was in an unknown '
                                    f'format - accepted media types include: {JSON_PATCH}, {MERGE_PATCH}, '
                                    'application/apply-patch+yaml')
        else:
            given = (body.get("metadata") or {}).get("resourceVersion")
            if given is None and key[0] == "inferenceservices":
                return 422, _status(422, "Invalid", f'{kind} "{key[2]}" is invalid: metadata.resourceVersion: '
                                    "Invalid value: 0x0: must be specified for an update")
            after = copy.deepcopy(body)
        if given is not None and given != before["metadata"]["resourceVersion"]:
            return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on {kind} "{key[2]}": the object '
                                "has been modified; please apply your changes to the latest version and try again")
        for field in ("name", "namespace", "generation"):
            if field in before["metadata"]:
                after.setdefault("metadata", {})[field] = before["metadata"][field]
        if key[0] == "inferenceservices":
            after["status"] = before.get("status", {})  # the status subresource: ignored here
            if after.get("spec") != before.get("spec"):
                after["metadata"]["generation"] = before["metadata"]["generation"] + 1
        if after == before:
            return 200, before
        after["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[key] = after
        if key[0] == "inferenceservices" and self._template(after) != self._template(before):
            self._new_revision(key[1:], after)
        return 200, after

    def __enter__(self) -> str:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, answer = standin.handle(self.command, self.path, headers, body)
                send_json(self, status, answer)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __exit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def rfc3339(epoch: float) -> str:
    """A time as the API server writes metadata timestamps: whole seconds, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def write_kubeconfig(path: Path, server: str, token: str, namespace: str = "models") -> Path:
    """A kubeconfig whose one context talks to `server` with a bearer token (what `kubectl` would use)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "runner", "user": {"token": token}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "runner", "namespace": namespace}}],
    }))
    return path
