"""A stand-in Kubeflow Pipelines API server on loopback: the v2beta1 REST paths `python -m pipeline submit`
reaches through the real kfp client, each request recorded.

What kfp 2.17 (kfp.client.Client, kfp_server_api 2.17.3) calls during a submit:
  GET  /apis/v2beta1/healthz            the CLI's backend check (the API server's own JSON handler:
                                        {"commit_sha", "tag_name", "multi_user"}; tag_name is the image's
                                        TAG_NAME, "unknown" where built without one: pipeline.releases'
                                        healthz_tag per supported release)
  GET  /apis/v2beta1/experiments        create_experiment -> get_experiment: list filtered by display_name
  POST /apis/v2beta1/experiments        create_experiment, when none has the name
  POST /apis/v2beta1/runs               run_pipeline: the compiled spec inline (pipeline_spec) and the
                                        parameters (runtime_config.parameters)
Any other path answers 404 the way the API server does, and is recorded too.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from pipeline import releases
from serving.server import free_ports
from support.http import send_json

API = "/apis/v2beta1"
ROUTES = {  # (method, path) -> name used to inject failures
    ("GET", f"{API}/healthz"): "healthz",
    ("GET", f"{API}/experiments"): "list-experiments",
    ("POST", f"{API}/experiments"): "create-experiment",
    ("POST", f"{API}/runs"): "create-run",
}
GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 500: 13, 503: 14}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class KfpStandin:
    """`tag_name=None` leaves the key out of healthz; `failures` maps a route name to (status, message). The default
    answers as the oldest supported release's API server does."""

    tag_name: str | None = releases.OLDEST.healthz_tag
    multi_user: bool = False
    failures: dict[str, tuple[int, str]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    experiments: list[dict] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "KfpStandin":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def calls(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.requests]

    # ------------------------------------------------------------ the API
    def answer(self, request: Request) -> tuple[int, dict]:
        name = ROUTES.get((request.method, request.path))
        if name is None:
            return _error(404, f"Not Found: {request.method} {request.path}")
        if name in self.failures:
            return _error(*self.failures[name])
        if name == "healthz":
            health = {"commit_sha": "0123abc", "multi_user": self.multi_user}
            if self.tag_name is not None:
                health["tag_name"] = self.tag_name
            return 200, health
        if name == "list-experiments":
            wanted = _display_name(request.query)
            namespace = request.query.get("namespace", [""])[0]
            found = [e for e in self.experiments
                     if wanted in (None, e["display_name"]) and e.get("namespace", "") == namespace]
            return 200, ({"experiments": found, "total_size": len(found)} if found else {})
        if name == "create-experiment":
            body = request.json()
            experiment = {"experiment_id": str(uuid.uuid4()), "display_name": body["display_name"],
                          "namespace": body.get("namespace", ""), "storage_state": "AVAILABLE",
                          "created_at": "2024-01-01T00:00:00Z"}
            self.experiments.append(experiment)
            return 200, experiment
        body = request.json()  # create-run
        if not any(e["experiment_id"] == body.get("experiment_id") for e in self.experiments):
            return _error(404, f"Experiment {body.get('experiment_id')} not found")
        run = {**body, "run_id": str(uuid.uuid4()), "state": "PENDING", "created_at": "2024-01-01T00:00:00Z"}
        self.runs.append(run)
        return 200, {k: v for k, v in run.items() if k != "pipeline_spec"}


def _display_name(query: dict[str, list[str]]) -> str | None:
    raw = query.get("filter", [""])[0]
    if not raw:
        return None
    for predicate in json.loads(raw).get("predicates", []):
        if predicate.get("key") == "display_name":
            return predicate.get("stringValue", predicate.get("string_value"))
    return None


def _error(status: int, message: str) -> tuple[int, dict]:
    return status, {"error": message, "code": GRPC_CODES.get(status, 2), "message": message, "details": []}


def _handler(standin: KfpStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            request = Request(self.command, url.path, parse_qs(url.query), {k.lower(): v for k, v in self.headers.items()},
                              self.rfile.read(length) if length else b"")
            standin.requests.append(request)
            status, payload = standin.answer(request)
            send_json(self, status, payload)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _serve

        def log_message(self, *args: object) -> None:
            pass

    return Handler
