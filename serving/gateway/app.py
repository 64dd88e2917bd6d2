"""KServe v1 and Open Inference v2 REST, health, readiness and metadata in front of a :class:`Backend`.

The aiohttp application both runtimes serve on the port KServe routes to. It

- answers ``/`` (v1 liveness), ``/v2/health/live``, ``/v2/health/ready``, ``/v1/models/<m>``,
  ``/v2/models/<m>[/versions/<v>]`` and ``.../ready`` itself, from the backend's health and the drain state;
- reads the v1/v2 inference bodies as KServe's model server does (JSON whatever the Content-Type, and the
  v2 binary tensor extension, see :mod:`serving.open_inference`; aiohttp inflates gzip/deflate bodies) and
  hands the backend their JSON; binary outputs are written back when the request asks for them.
  ``/predictions/<m>[/<v>]`` and ``/ping`` go to the backend unchanged;
- requires ``Authorization: Bearer <key>`` on everything but the two health paths (:data:`PROBE_PATHS`);
- counts the requests in flight and, once the shutdown refuses requests, answers 503 (:mod:`serving.gateway.drain`).

Open Inference gRPC (:mod:`serving.grpc_v2`) is answered by the same object: it calls :meth:`Gateway.infer_upstream`,
:meth:`Gateway.model_is_ready` and the metadata methods below.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Awaitable, Callable, TypeVar
from urllib.parse import quote

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from handler.log_lines import refusal_log_line
from handler.v2_schema import V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT, V2_INPUTS, V2_OUTPUTS
from serving.forms import FormError, checked, refusal
from serving.gateway.auth import API_KEY_HEADER, REST_REFUSAL, key_matches, presented_key
from serving.gateway.backend import Backend, InferenceCall, Reply
from serving.gateway.drain import Drain, FrontProcess
from serving.gateway_metrics import GatewayMetrics
from serving.open_inference import HEADER_LENGTH, ProtocolError, binary_outputs, json_object, read_v2, write_v2

#: Environment variable holding the bearer key callers must present (set from a Kubernetes Secret).
API_KEY_ENV = "INFERENCE_API_KEY"
#: The only paths answered without the key: what the kubelet's probes call.
PROBE_PATHS = ("/v2/health/live", "/v2/health/ready")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length", "authorization", API_KEY_HEADER.lower()}
#: Headers of a v1/v2 request that describe the client's body, not the JSON the gateway hands the backend.
BODY_HEADERS = {"content-type", "content-encoding", HEADER_LENGTH.lower()}
#: Bodies from this size on are parsed and written in a worker thread, not on the event loop.
OFF_LOOP_BYTES = 256 * 1024
T = TypeVar("T")
#: The platform the v2 model metadata names.
V2_PLATFORM = "pytorch_torchscript"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Set on a response that is the backend's answer (the backend may log its own refusals).
FORWARDED = "forwarded"
logger = logging.getLogger("gateway")


def json_response(status: int, body: dict) -> web.Response:
    # Exactly application/json (no charset): KServe's client reads the error message only then.
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


def _tensors(declared: tuple[tuple[str, str, tuple[int, ...]], ...], batch: bool = True) -> list[dict]:
    return [{"name": name, "datatype": datatype, "shape": [-1, *shape] if batch else list(shape)}
            for name, datatype, shape in declared]


async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, in a worker thread when `size` bytes make it long enough to stall the event loop (probes
    and other requests wait while a multi-megabyte body is parsed)."""
    if size < OFF_LOOP_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def v2_path(model: str, version: str | None) -> str:
    """TorchServe's path for a v2 inference of `model` (`version`), the REST route's and gRPC's."""
    return f"/predictions/{quote(model)}/{quote(version)}" if version else f"/v2/models/{quote(model)}/infer"


class Gateway:
    """KServe v1 / Open Inference v2 REST in front of `backend` (see the module docstring)."""

    def __init__(self, backend: Backend, api_key: str | None, metrics: GatewayMetrics | None = None) -> None:
        self.backend = backend
        self.metrics = metrics
        self.api_key = api_key.encode() if api_key else None
        self.drain = Drain()
        #: The nginx front when one listens in front of the gateway (serving.kserve_runtime.nginx_front).
        self.front: FrontProcess | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.backend.max_request_size,
                              middlewares=[self._count_or_refuse, self._auth])
        get, post, put = web.get, web.post, web.put
        app.add_routes([
            get("/", self.v1_live),
            get("/v2/health/live", self.live),
            get("/v2/health/ready", self.ready),
            get("/v2", self.server_metadata),
            get("/v1/models", self.list_models),
            get("/v1/models/{spec}", self.model_ready),
            post("/v1/models/{spec}", self.v1_predict),
            get("/v2/models/{model}", self.v2_metadata),
            get("/v2/models/{model}/versions/{version}", self.v2_metadata),
            get("/v2/models/{model}/ready", self.model_ready),
            get("/v2/models/{model}/versions/{version}/ready", self.model_ready),
            post("/v2/models/{model}/infer", self.v2_infer),
            post("/v2/models/{model}/versions/{version}/infer", self.v2_infer),
            post("/predictions/{model}", self.passthrough),
            post("/predictions/{model}/{version}", self.passthrough),
            put("/predictions/{model}", self.passthrough),  # `curl -T image.png`, as TorchServe's docs send it
            put("/predictions/{model}/{version}", self.passthrough),
            get("/ping", self.passthrough),
        ])
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        if self.metrics is not None:
            self.metrics.install(app)
        return app

    async def _open(self, _: web.Application) -> None:
        await self.backend.open()

    async def _close(self, _: web.Application) -> None:
        await self.backend.close()

    @web.middleware
    async def _count_or_refuse(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Count the requests in flight; once the shutdown refuses requests, answer 503 to all but the probes.

        From SIGTERM on, answers say Connection: close (set here, before aiohttp writes the headers): the client
        reconnects, through the Service, to another replica instead of sending its next request on a connection
        that is about to close.
        """
        if request.path in PROBE_PATHS:
            response = await handler(request)
        elif self.drain.refusing:
            self.drain.last_arrival = time.monotonic()
            response = json_response(503, {"error": "this replica is shutting down; retry"})
        else:
            self.drain.last_arrival = time.monotonic()
            self.drain.in_flight += 1
            try:
                response = await handler(request)
            finally:
                self.drain.in_flight -= 1
                self.drain.last_arrival = time.monotonic()
        if self.drain.draining:
            response.force_close()
        return response

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await self._answer(request, handler)
        if response.status >= 400 and not (response.get(FORWARDED) and self.backend.logs_refusals):
            body = response.body if isinstance(response, web.Response) and isinstance(response.body, bytes) else b""
            logger.info("%s", refusal_log_line(f"{request.method} {ascii(request.path)[1:-1][:120]}",
                                               response.status, body))
        return response

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.api_key is not None and request.path not in PROBE_PATHS:
            if not key_matches(presented_key(lambda name: request.headers.getall(name, [])), self.api_key):
                return json_response(401, {"error": REST_REFUSAL})
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return json_response(413, {"error": f"request body larger than {self.backend.max_request_size} bytes"})
        except web.HTTPException as exc:
            return json_response(exc.status, {"error": exc.reason})
        except RequestPayloadError as exc:  # e.g. a gzip body that does not inflate (aiohttp inflates bodies)
            return json_response(400, {"error": "the request body could not be read: "
                                                + " ".join(str(exc).partition("message:")[2].split())})

    # --- health and metadata (REST's and gRPC's) --------------------------------------------------------

    async def upstream_alive(self) -> bool:
        return await self.backend.alive()

    async def model_is_ready(self) -> bool:
        return not self.drain.draining and await self.backend.ready()

    async def live(self, _: web.Request) -> web.Response:
        alive = await self.upstream_alive()
        return json_response(200 if alive else 503, {"live": alive})

    async def v1_live(self, _: web.Request) -> web.Response:
        """KServe v1 liveness (``GET /``, what its InferenceRESTClient asks), behind the key like the rest."""
        alive = await self.upstream_alive()
        return json_response(200 if alive else 503, {"status": "alive" if alive else "not alive"})

    async def ready(self, _: web.Request) -> web.Response:
        ready = await self.model_is_ready()
        return json_response(200 if ready else 503, {"ready": ready})

    def server_metadata_dict(self) -> dict:
        name, version = self.backend.server
        return {"name": name, "version": version, "extensions": []}

    async def server_metadata(self, _: web.Request) -> web.Response:
        return json_response(200, self.server_metadata_dict())

    async def list_models(self, _: web.Request) -> web.Response:
        return json_response(200, {"models": [self.backend.model]})

    def unknown_model(self, model: str, version: str | None = None) -> str | None:
        """Why `model` (`version`) is not served here, or None when it is."""
        if model != self.backend.model or (version is not None and version not in self.backend.versions):
            what = model if version is None else f"{model} version {version}"
            return f"model {what} is not served here"
        return None

    def _known(self, model: str, version: str | None = None) -> web.Response | None:
        missing = self.unknown_model(model, version)
        return None if missing is None else json_response(404, {"error": missing})

    async def model_ready(self, request: web.Request) -> web.Response:
        """KServe v1 `GET /v1/models/<m>` and v2 `GET /v2/models/<m>[/versions/<v>]/ready`."""
        model = request.match_info.get("model") or request.match_info["spec"]
        missing = self._known(model, request.match_info.get("version"))
        if missing:
            return missing
        ready = await self.model_is_ready()
        return json_response(200 if ready else 503, {"name": model, "ready": ready})

    async def v2_metadata(self, request: web.Request) -> web.Response:
        model, version = request.match_info["model"], request.match_info.get("version")
        missing = self._known(model, version)
        if missing:
            return missing
        return json_response(200, self.model_metadata(model))

    def model_metadata(self, model: str) -> dict:
        """The v2 model metadata, REST's and gRPC's: one declaration of the typed outputs (handler.v2_schema)."""
        return {
            "name": model,
            "versions": list(self.backend.versions),
            "platform": V2_PLATFORM,
            # Any input name is accepted; these are the datatypes and shapes an input may have.
            "inputs": _tensors(V2_INPUTS, batch=False),
            # One row per image; embedding and neighbour_ids only with the embedding option, error only
            # when an image failed. The request parameter output_format=json gives JSON text per input instead.
            "outputs": _tensors((*V2_OUTPUTS, *V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT)),
        }

    # --- inference -------------------------------------------------------------------------------------

    async def v1_predict(self, request: web.Request) -> web.StreamResponse:
        model, _, verb = request.match_info["spec"].partition(":")
        if verb != "predict":
            return json_response(404, {"error": f"unknown v1 verb {verb!r}: use /v1/models/{model}:predict"})
        try:
            body = await request.read()
            await off_loop(len(body), json_object, body, "KServe v1")
        except ProtocolError as exc:
            return json_response(exc.status, {"error": str(exc)})
        return await self._forward(request, f"/v1/models/{quote(model)}:predict", body, "application/json")

    @staticmethod
    async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
        return await off_loop(size, fn, *args)

    async def infer_upstream(self, model: str, version: str | None, body: bytes) -> tuple[int, bytes]:
        """A v2 JSON body to the backend as the REST v2 route sends it: (HTTP status, answer body)."""
        reply = await self.backend.send(InferenceCall("POST", v2_path(model, version), body,
                                                      {"Content-Type": "application/json"}))
        return reply.status, reply.body

    async def v2_infer(self, request: web.Request) -> web.StreamResponse:
        model, version = request.match_info["model"], request.match_info.get("version")
        try:
            raw = await request.read()
            body, converted = await off_loop(len(raw), read_v2, raw, request.headers.get(HEADER_LENGTH))
        except ProtocolError as exc:
            return json_response(exc.status, {"error": str(exc)})
        default, chosen = binary_outputs(body)
        forwarded = await off_loop(len(raw), lambda: json.dumps(body).encode()) if converted else raw
        response = await self._forward(request, v2_path(model, version), forwarded, "application/json")
        if response.status != 200 or not (default or any(chosen.values())):
            return response
        try:
            answer = await off_loop(len(response.body), json.loads, response.body)
        except (TypeError, ValueError):
            return response
        payload, json_length = await off_loop(len(response.body), write_v2, answer, default, chosen)
        if json_length is None:
            return web.Response(status=200, body=payload, content_type="application/json")
        return web.Response(status=200, body=payload, content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(json_length)})

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        return await self._forward(request, request.rel_url.raw_path)

    async def _forward(self, request: web.Request, path: str, body: bytes | None = None,
                       content_type: str | None = None) -> web.Response:
        """Send the request on to the backend; `body` and `content_type` replace the client's when given."""
        if body is None:
            body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if content_type is not None:
            headers = {k: v for k, v in headers.items() if k.lower() not in BODY_HEADERS}
            headers["Content-Type"] = content_type
        else:
            try:  # image bytes sent as a form (curl --data-binary), or a form that does not decode: serving.forms
                relabel = checked(request.headers.get("Content-Type", ""), body)
            except FormError as exc:
                return web.Response(status=400, body=refusal(exc), content_type="application/json")
            if relabel is not None:
                headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
                headers["Content-Type"] = relabel
        reply: Reply = await self.backend.send(InferenceCall(request.method, path, body, headers,
                                                             request.rel_url.query))
        response = web.Response(status=reply.status, body=reply.body, content_type=reply.content_type)
        response[FORWARDED] = True
        return response
