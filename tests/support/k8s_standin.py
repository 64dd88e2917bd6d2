"""A Kubernetes API server stand-in on loopback for the InferenceService paths the gate and deploy call.

It speaks what the real `kubernetes` client sends: GET, POST (create) and PATCH (JSON merge patch) on
/apis/serving.kserve.io/v1beta1/namespaces/<ns>/inferenceservices[/<name>], answering with objects or
Kubernetes `Status` errors (404 for none, 403 when `forbidden`, 401 for a wrong token). A created or
patched InferenceService becomes Ready at once (one revision per spec change). Every request is recorded.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from support.http import send_json

PATH = re.compile(r"^/apis/serving\.kserve\.io/v1beta1/namespaces/([^/]+)/inferenceservices(?:/([^/?]+))?(?:\?.*)?$")


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


class KubernetesStandin:
    def __init__(self, token: str = "test-token") -> None:
        self.token = token
        self.objects: dict[tuple[str, str], dict] = {}
        self.requests: list[dict] = []
        self.forbidden = False
        self._server: ThreadingHTTPServer | None = None

    def _ready(self, obj: dict, changed: bool) -> None:
        meta = obj["metadata"]
        if changed:
            meta["generation"] = meta.get("generation", 0) + 1
        name, ns = meta["name"], meta["namespace"]
        revision = f"{name}-predictor-{meta['generation']:05d}"
        obj["status"] = {"url": f"http://{name}.{ns}.example.com",
                         "conditions": [{"type": "Ready", "status": "True"}],
                         "components": {"predictor": {"latestCreatedRevision": revision,
                                                      "latestReadyRevision": revision}}}

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict]:
        self.requests.append({"method": method, "path": path, "headers": headers,
                              "body": json.loads(body) if body else None})
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        match = PATH.match(path)
        if not match:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace, name = match.groups()
        if self.forbidden:
            return 403, _status(403, "Forbidden", f'inferenceservices.serving.kserve.io "{name}" is forbidden: '
                                f'User "system:serviceaccount:kubeflow:pipeline-runner" cannot {method.lower()} '
                                f'resource "inferenceservices" in namespace "{namespace}"')
        key = (namespace, name or "")
        if method == "GET" and name:
            if key not in self.objects:
                return 404, _status(404, "NotFound", f'inferenceservices.serving.kserve.io "{name}" not found')
            return 200, self.objects[key]
        if method == "POST" and not name:
            obj = json.loads(body)
            key = (namespace, obj["metadata"]["name"])
            if key in self.objects:
                return 409, _status(409, "AlreadyExists", "already exists")
            self.objects[key] = obj
            self._ready(obj, changed=True)
            return 201, obj
        if method == "PATCH" and name:
            if key not in self.objects:
                return 404, _status(404, "NotFound", "not found")
            before = self.objects[key]
            after = merge_patch(before, json.loads(body))
            self._ready(after, changed=after.get("spec") != before.get("spec"))
            self.objects[key] = after
            return 200, after
        return 405, _status(405, "MethodNotAllowed", method)

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


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "code": code}


def write_kubeconfig(path: Path, server: str, token: str, namespace: str = "models") -> Path:
    """A kubeconfig whose one context talks to `server` with a bearer token (what `kubectl` would use)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "runner", "user": {"token": token}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "runner", "namespace": namespace}}],
    }))
    return path
