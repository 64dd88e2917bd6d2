"""A small KServe-protocol server for tests: v1 and Open Inference v2 REST over the real model service.

It follows the public protocol specs (KServe "V1 Inference Protocol" and the Open Inference / "V2
Inference Protocol"), not any one client, and answers with :class:`handler.service.EmbeddingService`
loaded from real artifacts, so the client's encodings meet real answers:

- v1: ``GET /v1/models/<m>`` -> ``{"name", "ready"}``; ``POST /v1/models/<m>:predict`` with
  ``{"instances": [{"data": "<base64>"}, ...]}`` -> ``{"predictions": [answer, ...]}``.
- v2: ``GET /v2/health/live|ready``, ``GET /v2/models/<m>[/versions/<v>][/ready]``,
  ``POST /v2/models/<m>[/versions/<v>]/infer`` with BYTES input tensors of base64 images -> one BYTES
  output per input (same name and shape) holding each answer as JSON text.
- Errors as the specs say: ``{"error": "<message>"}`` with 400 (malformed request) or 404 (unknown
  model or version). A refused image is that image's answer (the handler's ``{"error", "status"}``),
  as TorchServe's KServe envelopes return it.

Loopback only, port 0; stdlib ``http.server``.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from handler.requests import RequestError, decode_request
from handler.service import EmbeddingService
from support.http import send_json

V1_PREDICT = re.compile(r"^/v1/models/([^/:]+):predict$")
V1_MODEL = re.compile(r"^/v1/models/([^/:]+)$")
V2_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
V2_MODEL = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready)?$")


class ProtocolError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class KServeStandin:
    """``with KServeStandin(service) as url:`` serves one model (and version) until the block ends."""

    def __init__(self, service: EmbeddingService, model: str = "embedding", version: str = "1.0") -> None:
        self.service = service
        self.model = model
        self.version = version
        self.requests: list[tuple[str, str]] = []  # (method, path) seen, for tests
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())  # loopback, any free port
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> str:
        self._thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _check_model(self, model: str, version: str | None) -> None:
        if model != self.model:
            raise ProtocolError(f"Model with name {model} does not exist.", 404)
        if version is not None and version != self.version:
            raise ProtocolError(f"Model {model} has no version {version}.", 404)

    def _answers(self, payloads: list[str]) -> list[dict[str, Any]]:
        """The handler's own decoding (base64, data URIs) and service, one answer per payload."""
        rows: list[bytes | RequestError] = []
        for payload in payloads:
            try:
                rows.append(decode_request({"body": {"data": payload}}))
            except RequestError as exc:
                rows.append(exc)
        with self._lock:  # one forward at a time, as one TorchServe worker would run it
            answers, _ = self.service.answer(rows)
        return answers

    def v1_predict(self, model: str, body: Any) -> dict[str, Any]:
        self._check_model(model, None)
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or not instances:
            raise ProtocolError('request must be {"instances": [...]} with at least one instance')
        payloads = []
        for i, instance in enumerate(instances):
            data = instance.get("data") if isinstance(instance, dict) else instance
            if not isinstance(data, str):
                raise ProtocolError(f'instance {i} must be {{"data": "<base64 image>"}}')
            payloads.append(data)
        return {"predictions": self._answers(payloads)}

    def v2_infer(self, model: str, version: str | None, body: Any) -> dict[str, Any]:
        self._check_model(model, version)
        inputs = body.get("inputs") if isinstance(body, dict) else None
        if not isinstance(inputs, list) or not inputs:
            raise ProtocolError("request must have a non-empty inputs list")
        payloads: list[str] = []
        layout: list[tuple[str, list[int], int]] = []
        for tensor in inputs:
            if not isinstance(tensor, dict) or not {"name", "shape", "datatype", "data"} <= tensor.keys():
                raise ProtocolError("each input needs name, shape, datatype and data")
            if tensor["datatype"] != "BYTES":
                raise ProtocolError(f"input {tensor['name']!r}: datatype {tensor['datatype']} unsupported, use BYTES")
            data, shape = tensor["data"], tensor["shape"]
            count = 1
            for dim in shape:
                count *= int(dim)
            if not isinstance(data, list) or len(data) != count or not all(isinstance(d, str) for d in data):
                raise ProtocolError(f"input {tensor['name']!r}: data must be {count} base64 strings for shape {shape}")
            payloads.extend(data)
            layout.append((tensor["name"], list(shape), count))
        answers = iter(self._answers(payloads))
        outputs = [{"name": name, "shape": shape, "datatype": "BYTES",
                    "data": [json.dumps(next(answers)) for _ in range(count)]} for name, shape, count in layout]
        answer: dict[str, Any] = {"model_name": self.model, "model_version": version or self.version,
                                  "outputs": outputs}
        if isinstance(body.get("id"), str):
            answer["id"] = body["id"]
        return answer

    def v2_metadata(self, model: str, version: str | None) -> dict[str, Any]:
        self._check_model(model, version)
        return {"name": self.model, "versions": [self.version], "platform": "pytorch_torchscript",
                "inputs": [{"name": "image-<i>", "datatype": "BYTES", "shape": [1]}],
                "outputs": [{"name": "image-<i>", "datatype": "BYTES", "shape": [1]}]}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                send_json(self, status, body)

            def _route(self, method: str) -> None:
                standin.requests.append((method, self.path))
                try:
                    body = None
                    if method == "POST":
                        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                        try:
                            body = json.loads(raw)
                        except ValueError:
                            raise ProtocolError("body is not JSON") from None
                    self._send(200, self._dispatch(method, body))
                except ProtocolError as exc:
                    self._send(exc.status, {"error": str(exc)})

            def _dispatch(self, method: str, body: Any) -> Any:
                path = self.path.split("?", 1)[0]
                if method == "POST" and (m := V1_PREDICT.match(path)):
                    return standin.v1_predict(m.group(1), body)
                if method == "POST" and (m := V2_INFER.match(path)):
                    return standin.v2_infer(m.group(1), m.group(2), body)
                if method == "GET" and (m := V1_MODEL.match(path)):
                    standin._check_model(m.group(1), None)
                    return {"name": standin.model, "ready": True}
                if method == "GET" and path in ("/v2/health/live", "/v2/health/ready"):
                    return {"live": True} if path.endswith("live") else {"ready": True}
                if method == "GET" and (m := V2_MODEL.match(path)):
                    if m.group(3):
                        standin._check_model(m.group(1), m.group(2))
                        return {"name": standin.model, "ready": True}
                    return standin.v2_metadata(m.group(1), m.group(2))
                raise ProtocolError(f"no route for {method} {path}", 404)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

        return Handler
