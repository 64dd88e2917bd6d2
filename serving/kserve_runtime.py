"""The serving image's PID 1: TorchServe on loopback, and KServe's protocols on the port KServe routes to.

KServe expects one HTTP port that answers the KServe v1 and Open Inference v2 REST paths, health and
model metadata included. TorchServe's frontend already routes ``/v1/models/<m>:predict``,
``/v2/models/<m>/infer`` and ``/predictions/<m>`` to the handler (which reads every format, see
:mod:`handler.protocols`), but has no health, readiness or metadata paths. So this process

- starts ``torchserve --foreground`` with the storage initializer's layout (``/mnt/models``), its
  inference and management APIs on loopback only;
- by default (``--front nginx``) starts nginx on the HTTP port (:mod:`serving.nginx_front`): it sends
  ``/predictions/<m>`` and v1 JSON straight to TorchServe, checks the key, counts the request histogram and
  follows the drain below, and sends every other path to this gateway, which then listens on loopback only;
  ``--front aiohttp`` serves everything from this process as before;
- answers ``/`` (v1 liveness), ``/v2/health/live``, ``/v2/health/ready``, ``/v1/models/<m>``,
  ``/v2/models/<m>[/versions/<v>]`` and ``.../ready`` itself, from TorchServe's ping and its workers' status;
- reads the v1/v2 inference bodies as KServe's model server does (JSON whatever the Content-Type, and the
  v2 binary tensor extension, see :mod:`serving.open_inference`; aiohttp inflates gzip/deflate bodies) and
  hands TorchServe their JSON; binary outputs are written back when the request asks for them.
  ``/predictions/<m>`` passes through unchanged;
- requires ``Authorization: Bearer <key>`` on everything but the two health paths, the key coming from
  the environment (a Kubernetes Secret); without a key it refuses to start unless told
  ``--allow-unauthenticated`` (for a mesh that authenticates in front of it);
- serves Open Inference gRPC (KServe's ``grpc-v2``) on ``--grpc-port`` (8081, KServe's default) in the same
  event loop, with the same key, checks and backend (:mod:`serving.grpc_v2`); ServerLive/ServerReady are open
  like the REST probe paths. If the default port cannot be served (taken, or the generated stubs missing) it
  says so and serves REST alone; an explicit ``--grpc-port`` that cannot be served is an error;
- drains on SIGTERM (:func:`_shutdown`): readiness answers 503 at once and every answer from then on carries
  ``Connection: close``; requests are still served for ``SHUTDOWN_DELAY_SECONDS`` (3 s), while Kubernetes
  removes the pod from the Service's endpoints; then new requests get 503 and new gRPC calls UNAVAILABLE, the
  ones in flight are answered, the listeners close, and TorchServe gets the rest of the pod's termination grace
  period (``TERMINATION_GRACE_SECONDS``, Kubernetes' default 30 s) to stop. A second signal skips the delay;
- exits non-zero as soon as TorchServe exits on its own, so that Kubernetes restarts the container instead of
  keeping a pod that answers nothing.

Only the standard library, aiohttp, prometheus_client (:mod:`serving.gateway_metrics`) and :mod:`settings`
are imported, and grpcio with the generated Open Inference stubs once gRPC starts: the image has no kfp or
training code.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar
from urllib.parse import quote, urlsplit

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from aiohttp.web_protocol import RequestPayloadError

from serving.gateway_metrics import BUCKETS, GatewayMetrics
from serving.nginx_front import Front, FrontError, FrontSettings
from serving.torchserve_env import torchserve_environment
from handler.v2_schema import V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT, V2_INPUTS, V2_OUTPUTS
from settings import KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT, LOG_CONFIG_FILE, read_properties
from serving.open_inference import HEADER_LENGTH, ProtocolError, binary_outputs, json_object, read_v2, write_v2

logger = logging.getLogger("kserve_runtime")

#: Environment variable holding the bearer key callers must present (set from a Kubernetes Secret).
API_KEY_ENV = "INFERENCE_API_KEY"
#: The only paths answered without the key: what the kubelet's probes call.
PROBE_PATHS = ("/v2/health/live", "/v2/health/ready")
DEFAULT_PORT = KSERVE_GATEWAY_PORT
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Environment variable: seconds between SIGTERM and refusing new requests (readiness is 503 meanwhile): the
#: time Kubernetes takes to remove a terminating pod from its Services' endpoints on every node (1-2 s on a
#: small cluster; raise it where the ingress or a large cluster is slower).
SHUTDOWN_DELAY_ENV = "SHUTDOWN_DELAY_SECONDS"
SHUTDOWN_DELAY_S = 3.0
#: Environment variable: the pod's terminationGracePeriodSeconds, which the whole shutdown must fit in.
TERMINATION_GRACE_ENV = "TERMINATION_GRACE_SECONDS"
TERMINATION_GRACE_S = 30.0  # Kubernetes' default
#: What the grace period keeps for stopping TorchServe once the last request is answered (it takes 2-3 s).
TORCHSERVE_STOP_S = 8.0
#: Kept back from the grace period so the gateway exits before the kubelet's SIGKILL.
EXIT_MARGIN_S = 1.0
#: With nothing in flight, the listeners close once no request has come for this long (a client that was just
#: answered with Connection: close reconnects at once, and gets a 503 instead of a reset backlog connection).
QUIET_S = 0.5
#: How long processes of TorchServe's group may outlive its launcher after shutdown before they are killed.
LEFTOVER_S = 2.0
#: Readiness answers are reused this long, so probes and clients don't each ask the management API.
READY_CACHE_S = 1.0
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length", "authorization"}
#: Headers of a v1/v2 request that describe the client's body, not the JSON the gateway hands TorchServe.
BODY_HEADERS = {"content-type", "content-encoding", HEADER_LENGTH.lower()}
#: Bodies from this size on are parsed and written in a worker thread, not on the event loop.
OFF_LOOP_BYTES = 256 * 1024
T = TypeVar("T")
#: The platform the v2 model metadata names.
V2_PLATFORM = "pytorch_torchscript"
#: What may listen on the HTTP port, the default first (see serving.nginx_front for the measurement).
FRONTS = ("nginx", "aiohttp")


class RuntimeConfigError(Exception):
    """The TorchServe configuration cannot be served behind the gateway; the message says why."""


@dataclass(frozen=True)
class Upstream:
    """Where TorchServe listens inside the container, and the model it serves."""

    inference: str
    management: str
    model: str
    versions: tuple[str, ...]
    max_request_size: int
    response_timeout_s: float
    #: The version that answers paths naming none (model_snapshot's defaultVersion, else its first).
    default_version: str = ""

    @classmethod
    def from_config(cls, ts_config: Path, model: str | None = None) -> "Upstream":
        try:
            props = read_properties(ts_config)
        except OSError as exc:
            raise RuntimeConfigError(f"{ts_config}: {exc.strerror or exc}") from None
        addresses = {}
        for key in ("inference_address", "management_address"):
            address = props.get(key, "")
            host = urlsplit(address).hostname
            if host not in LOOPBACK:
                raise RuntimeConfigError(f"{ts_config}: {key}={address or '(unset)'} must be a loopback address: "
                                         "TorchServe is reached only through the gateway")
            addresses[key] = address.rstrip("/")
        try:
            models = json.loads(props["model_snapshot"])["models"]
        except (KeyError, ValueError, TypeError):
            raise RuntimeConfigError(f"{ts_config}: model_snapshot must list the model to serve") from None
        if model is None:
            if len(models) != 1:
                raise RuntimeConfigError(f"{ts_config}: model_snapshot lists {len(models)} models; pass --model-name")
            model = next(iter(models))
        if model not in models:
            raise RuntimeConfigError(f"{ts_config}: model {model!r} is not in model_snapshot")
        entries = models[model]
        default = next((v for v, e in entries.items() if isinstance(e, dict) and e.get("defaultVersion")),
                       next(iter(entries), ""))
        return cls(addresses["inference_address"], addresses["management_address"], model,
                   tuple(entries), int(props.get("max_request_size", 6553500)),  # TorchServe's own default
                   float(props.get("default_response_timeout", 120)), default)


def _json(status: int, body: dict) -> web.Response:
    # Exactly application/json (no charset): KServe's client reads the error message only then.
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


def _tensors(declared: tuple[tuple[str, str, tuple[int, ...]], ...], batch: bool = True) -> list[dict]:
    return [{"name": name, "datatype": datatype, "shape": [-1, *shape] if batch else list(shape)}
            for name, datatype, shape in declared]


class Drain:
    """The gateway's shutdown state and its HTTP requests in flight (probes not counted)."""

    def __init__(self) -> None:
        #: SIGTERM came: not ready, and every answer closes its connection.
        self.draining = False
        #: New requests are answered 503.
        self.refusing = False
        self.in_flight = 0
        self.last_arrival = 0.0

    async def settled(self, deadline: float) -> bool:
        """Wait until nothing is in flight and no request came for QUIET_S; False if `deadline` came first."""
        while time.monotonic() < deadline:
            if self.in_flight == 0 and time.monotonic() - self.last_arrival >= QUIET_S:
                return True
            await asyncio.sleep(0.05)
        return False


class Gateway:
    """KServe v1 / Open Inference v2 REST in front of TorchServe (see the module docstring)."""

    def __init__(self, upstream: Upstream, api_key: str | None, metrics: GatewayMetrics | None = None) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.api_key = api_key.encode() if api_key else None
        self.session: ClientSession | None = None
        self.drain = Drain()
        #: The nginx front when one listens in front of the gateway (serving.nginx_front).
        self.front: Front | None = None
        self._ready: tuple[float, bool] = (0.0, False)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.upstream.max_request_size,
                              middlewares=[self._count_or_refuse, self._auth])
        get, post = web.get, web.post
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
            get("/ping", self.passthrough),
        ])
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        if self.metrics is not None:
            self.metrics.install(app)
        return app

    async def _open(self, _: web.Application) -> None:
        timeout = ClientTimeout(total=self.upstream.response_timeout_s + 5)
        self.session = ClientSession(connector=TCPConnector(limit=256), timeout=timeout, auto_decompress=False)

    async def _close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    @web.middleware
    async def _count_or_refuse(self, request: web.Request,
                               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Count the requests in flight; once the shutdown refuses requests, answer 503 to all but the probes.

        From SIGTERM on, answers say Connection: close (set here, before aiohttp writes the headers): the client
        reconnects, through the Service, to another replica instead of sending its next request on a connection
        that is about to close.
        """
        if request.path in PROBE_PATHS:
            response = await handler(request)
        elif self.drain.refusing:
            self.drain.last_arrival = time.monotonic()
            response = _json(503, {"error": "this replica is shutting down; retry"})
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
    async def _auth(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if self.api_key is not None and request.path not in PROBE_PATHS:
            scheme, _, key = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key):
                return _json(401, {"error": "missing or wrong bearer key: send Authorization: Bearer <key>"})
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return _json(413, {"error": f"request body larger than {self.upstream.max_request_size} bytes"})
        except web.HTTPException as exc:
            return _json(exc.status, {"error": exc.reason})
        except RequestPayloadError as exc:  # e.g. a gzip body that does not inflate (aiohttp inflates bodies)
            return _json(400, {"error": "the request body could not be read: "
                                        + " ".join(str(exc).partition("message:")[2].split())})

    # --- health and metadata -------------------------------------------------------------------------

    async def _upstream_alive(self) -> bool:
        assert self.session is not None
        try:
            async with self.session.get(f"{self.upstream.inference}/ping", timeout=ClientTimeout(total=3)) as r:
                return r.status == 200
        except (ClientError, asyncio.TimeoutError):
            return False

    async def _model_ready(self) -> bool:
        if self.drain.draining:
            return False
        checked, ready = self._ready
        if time.monotonic() - checked < READY_CACHE_S:
            return ready
        assert self.session is not None
        url = f"{self.upstream.management}/models/{quote(self.upstream.model)}"
        try:
            async with self.session.get(url, timeout=ClientTimeout(total=3)) as response:
                models = await response.json(content_type=None) if response.status == 200 else []
            ready = any(worker.get("status") == "READY"
                        for model in models for worker in model.get("workers", []))
        except (ClientError, asyncio.TimeoutError, ValueError, AttributeError, TypeError):
            ready = False
        self._ready = (time.monotonic(), ready)
        return ready

    async def live(self, _: web.Request) -> web.Response:
        alive = await self._upstream_alive()
        return _json(200 if alive else 503, {"live": alive})

    async def v1_live(self, _: web.Request) -> web.Response:
        """KServe v1 liveness (``GET /``, what its InferenceRESTClient asks), behind the key like the rest."""
        alive = await self._upstream_alive()
        return _json(200 if alive else 503, {"status": "alive" if alive else "not alive"})

    async def ready(self, _: web.Request) -> web.Response:
        ready = await self._model_ready()
        return _json(200 if ready else 503, {"ready": ready})

    def server_metadata_dict(self) -> dict:
        return {"name": "torchserve", "version": _torchserve_version(), "extensions": []}

    async def server_metadata(self, _: web.Request) -> web.Response:
        return _json(200, self.server_metadata_dict())

    async def list_models(self, _: web.Request) -> web.Response:
        return _json(200, {"models": [self.upstream.model]})

    def unknown_model(self, model: str, version: str | None = None) -> str | None:
        """Why `model` (`version`) is not served here, or None when it is."""
        if model != self.upstream.model or (version is not None and version not in self.upstream.versions):
            what = model if version is None else f"{model} version {version}"
            return f"model {what} is not served here"
        return None

    def _known(self, model: str, version: str | None = None) -> web.Response | None:
        missing = self.unknown_model(model, version)
        return None if missing is None else _json(404, {"error": missing})

    async def model_ready(self, request: web.Request) -> web.Response:
        """KServe v1 `GET /v1/models/<m>` and v2 `GET /v2/models/<m>[/versions/<v>]/ready`."""
        model = request.match_info.get("model") or request.match_info["spec"]
        missing = self._known(model, request.match_info.get("version"))
        if missing:
            return missing
        ready = await self._model_ready()
        return _json(200 if ready else 503, {"name": model, "ready": ready})

    async def v2_metadata(self, request: web.Request) -> web.Response:
        model, version = request.match_info["model"], request.match_info.get("version")
        missing = self._known(model, version)
        if missing:
            return missing
        return _json(200, self.model_metadata(model))

    def model_metadata(self, model: str) -> dict:
        """The v2 model metadata, REST's and gRPC's: one declaration of the typed outputs (handler.v2_schema)."""
        return {
            "name": model,
            "versions": list(self.upstream.versions),
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
            return _json(404, {"error": f"unknown v1 verb {verb!r}: use /v1/models/{model}:predict"})
        try:
            body = await request.read()
            await _off_loop(len(body), json_object, body, "KServe v1")
        except ProtocolError as exc:
            return _json(exc.status, {"error": str(exc)})
        return await self._forward(request, f"/v1/models/{quote(model)}:predict", body, "application/json")

    # The gRPC side (serving.grpc_v2) asks these.
    upstream_alive = _upstream_alive
    model_is_ready = _model_ready

    @staticmethod
    async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
        return await _off_loop(size, fn, *args)

    @staticmethod
    def v2_path(model: str, version: str | None) -> str:
        """TorchServe's path for a v2 inference of `model` (`version`), the REST route's and gRPC's."""
        return f"/predictions/{quote(model)}/{quote(version)}" if version else f"/v2/models/{quote(model)}/infer"

    async def infer_upstream(self, model: str, version: str | None, body: bytes) -> tuple[int, bytes]:
        """POST a v2 JSON body to TorchServe as the REST v2 route does: (HTTP status, answer body)."""
        assert self.session is not None
        path = self.v2_path(model, version)
        try:
            async with self.session.post(f"{self.upstream.inference}{path}", data=body,
                                         headers={"Content-Type": "application/json"}) as upstream:
                return upstream.status, await upstream.read()
        except (ClientError, asyncio.TimeoutError) as exc:
            logger.warning("TorchServe did not answer gRPC ModelInfer (POST %s): %s", path, exc)
            return 503, json.dumps({"error": "the model server is not answering; retry shortly"}).encode()

    async def v2_infer(self, request: web.Request) -> web.StreamResponse:
        model, version = request.match_info["model"], request.match_info.get("version")
        path = self.v2_path(model, version)
        try:
            raw = await request.read()
            body, converted = await _off_loop(len(raw), read_v2, raw, request.headers.get(HEADER_LENGTH))
        except ProtocolError as exc:
            return _json(exc.status, {"error": str(exc)})
        default, chosen = binary_outputs(body)
        forwarded = await _off_loop(len(raw), lambda: json.dumps(body).encode()) if converted else raw
        response = await self._forward(request, path, forwarded, "application/json")
        if response.status != 200 or not (default or any(chosen.values())):
            return response
        try:
            answer = await _off_loop(len(response.body), json.loads, response.body)
        except (TypeError, ValueError):
            return response
        payload, json_length = await _off_loop(len(response.body), write_v2, answer, default, chosen)
        if json_length is None:
            return web.Response(status=200, body=payload, content_type="application/json")
        return web.Response(status=200, body=payload, content_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(json_length)})

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        return await self._forward(request, request.rel_url.raw_path)

    async def _forward(self, request: web.Request, path: str, body: bytes | None = None,
                       content_type: str | None = None) -> web.Response:
        """Send the request on to TorchServe; `body` and `content_type` replace the client's when given."""
        assert self.session is not None
        if body is None:
            body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        if content_type is not None:
            headers = {k: v for k, v in headers.items() if k.lower() not in BODY_HEADERS}
            headers["Content-Type"] = content_type
        elif request.content_type == "application/x-www-form-urlencoded" and not body.isascii():
            # `curl --data-binary @digit.png` labels image bytes as a form; a urlencoded form is ASCII, and
            # TorchServe's form decoder answers 500 to anything else. Pass such a body on as what it is.
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            headers["Content-Type"] = "application/octet-stream"
        try:
            async with self.session.request(request.method, f"{self.upstream.inference}{path}",
                                            params=request.rel_url.query, data=body, headers=headers) as upstream:
                payload = await upstream.read()
                return web.Response(status=upstream.status, body=payload,
                                    content_type=upstream.content_type or "application/json")
        except (ClientError, asyncio.TimeoutError) as exc:
            logger.warning("TorchServe did not answer %s %s: %s", request.method, path, exc)
            return _json(503, {"error": "the model server is not answering; retry shortly"})


async def _off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, in a worker thread when `size` bytes make it long enough to stall the event loop (probes
    and other requests wait while a multi-megabyte body is parsed)."""
    if size < OFF_LOOP_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _torchserve_version() -> str:
    try:
        from importlib.metadata import version

        return version("torchserve")
    except Exception:
        return "unknown"


class GrpcStartError(Exception):
    """The gRPC server could not be started (one-line reason)."""


async def _start_grpc(gateway: Gateway, host: str, port: int, required: bool) -> Any:
    """The started grpc.aio server, or None when it cannot start and `required` is false (REST is served alone)."""
    try:
        from serving import grpc_v2

        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        grpc_server, _ = grpc_v2.server(gateway, address, gateway.upstream.max_request_size)
        await grpc_server.start()
        return grpc_server
    except Exception as exc:  # missing stubs (StubError), a taken port (RuntimeError), ...
        reason = f"Open Inference gRPC cannot be served on port {port}: {exc}"
        if required:
            raise GrpcStartError(reason) from None
        logger.error("%s; serving REST only", reason)
        return None


@dataclass(frozen=True)
class ShutdownTimes:
    """How the shutdown spends the pod's termination grace period (seconds)."""

    delay: float = SHUTDOWN_DELAY_S
    grace: float = TERMINATION_GRACE_S

    def check(self) -> None:
        """Raise ValueError (one line) unless the delay leaves TORCHSERVE_STOP_S of the grace period."""
        if self.delay < 0:
            raise ValueError(f"the shutdown delay must not be negative (got {self.delay:g} s)")
        if self.grace - self.delay < TORCHSERVE_STOP_S + EXIT_MARGIN_S:
            raise ValueError(f"a shutdown delay of {self.delay:g} s leaves too little of the {self.grace:g} s "
                             f"termination grace period: keep at least {TORCHSERVE_STOP_S + EXIT_MARGIN_S:g} s "
                             "for the requests in flight and TorchServe's stop")


async def _serve(gateway: Gateway, server: subprocess.Popen, host: str, port: int, times: ShutdownTimes,
                 grpc_port: int | None = None, grpc_required: bool = False,
                 front: FrontSettings | None = None) -> int:
    """Serve until a signal or TorchServe's (or nginx's) exit; `front`: nginx listens on `host`:`port` and the
    gateway on loopback at ``front.gateway_port``."""
    loop = asyncio.get_running_loop()
    stop, hurry = asyncio.Event(), asyncio.Event()
    signalled_at: list[float] = []

    def on_signal() -> None:
        if stop.is_set():
            hurry.set()
            return
        signalled_at.append(time.monotonic())
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    runner = web.AppRunner(gateway.app(), access_log=None, shutdown_timeout=EXIT_MARGIN_S)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1" if front else host, front.gateway_port if front else port,
                      reuse_address=True).start()
    grpc_server = nginx = None
    try:
        if front is not None:
            nginx = Front.start(front, dict(os.environ))
            await nginx.wait_started()
            gateway.front = nginx
        if grpc_port is not None:
            grpc_server = await _start_grpc(gateway, host, grpc_port, grpc_required)
    except (GrpcStartError, FrontError) as exc:
        logger.error("%s", exc)
        if nginx is not None:
            await _stop_front(nginx, EXIT_MARGIN_S)
        await runner.cleanup()
        await loop.run_in_executor(None, _stop_group, server, TORCHSERVE_STOP_S)
        return 2
    logger.info("%s on %s:%d%s -> TorchServe %s (model %s, auth %s)", "nginx front" if nginx else "gateway",
                host, port, f" (Open Inference gRPC on {grpc_port})" if grpc_server is not None else "",
                gateway.upstream.inference, gateway.upstream.model, "bearer key" if gateway.api_key else "OFF")
    exited = loop.run_in_executor(None, server.wait)
    watched = {exited}
    if nginx is not None:
        watched.add(loop.run_in_executor(None, nginx.process.wait))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({*watched, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if any(w.done() for w in watched) and not stop.is_set():
        stopping.cancel()
        what, code = ("TorchServe", exited.result()) if exited.done() else ("nginx", nginx.process.returncode)
        logger.error("%s exited (code %s) without being asked to: exiting so the pod is restarted", what, code)
        if grpc_server is not None:
            await grpc_server.stop(grace=EXIT_MARGIN_S)
        if nginx is not None:
            await _stop_front(nginx, EXIT_MARGIN_S)
        await runner.cleanup()
        await loop.run_in_executor(None, _stop_group, server, TORCHSERVE_STOP_S)
        return code or 1
    started = signalled_at[0]
    await _shutdown(gateway, runner, grpc_server, times, started, exited, hurry)
    remaining = started + times.grace - EXIT_MARGIN_S - time.monotonic()
    logger.info("stopping TorchServe (%.0f s left of the grace period)", remaining)
    await loop.run_in_executor(None, _stop_group, server, max(remaining, LEFTOVER_S))
    logger.info("stopped %.1f s after the signal", time.monotonic() - started)
    return 0


async def _shutdown(gateway: Gateway, runner: web.AppRunner, grpc_server: Any, times: ShutdownTimes,
                    started: float, exited: "asyncio.Future[int]", hurry: asyncio.Event) -> None:
    """Drain the gateway within the grace period that began at `started` (see the module docstring).

    Kubernetes sends SIGTERM while the endpoint controllers and every node's proxy are still removing the pod
    from the Service, so requests keep coming for a moment: they are answered during the delay (a second
    signal, or TorchServe exiting, ends it early). Then new requests are refused with 503 and gRPC calls with
    UNAVAILABLE (the listeners stay open, so a client that connects now is answered instead of reset with the
    listen backlog), and the requests in flight are answered; the listeners close once nothing is in flight and
    no request came for QUIET_S, or when only TORCHSERVE_STOP_S of the grace period is left.
    """
    drain, nginx = gateway.drain, gateway.front
    drain.draining = True
    if nginx is not None:
        await _set_drain(nginx, "draining")
    logger.info("SIGTERM: readiness is 503; serving %.0f s more while the pod leaves the Service's endpoints",
                times.delay)
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({hurried, exited}, timeout=times.delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hurried.cancel()
    drain.refusing = True
    deadline = started + times.grace - TORCHSERVE_STOP_S
    in_flight = drain.in_flight
    if nginx is not None:
        in_flight = (await _set_drain(nginx, "refusing")) or in_flight
    logger.info("refusing new requests; %d HTTP requests in flight", in_flight)
    settled = await (nginx.settled(deadline, QUIET_S) if nginx is not None else drain.settled(deadline))
    if not settled:
        logger.warning("HTTP requests still in flight at the end of the drain: they are cancelled")
    if grpc_server is not None:
        # Stopped only now: until here new calls are refused UNAVAILABLE by the servicer (a call that reaches a
        # stopping grpc.aio server can be CANCELLED instead); the calls in flight get the rest of the drain.
        await grpc_server.stop(grace=max(deadline - time.monotonic(), 0.0))
    if nginx is not None:
        await _stop_front(nginx, max(deadline - time.monotonic(), EXIT_MARGIN_S))
    await runner.cleanup()


async def _set_drain(nginx: Front, drain: str) -> int | None:
    """Tell nginx the drain state; the requests it has in flight, or None when it did not answer."""
    try:
        return (await nginx.set_drain(drain)).in_flight
    except (ClientError, asyncio.TimeoutError, OSError) as exc:
        logger.warning("nginx front did not take the drain state %s: %s", drain, exc)
        return None


async def _stop_front(nginx: Front, grace_s: float) -> None:
    await nginx.close()
    await asyncio.get_running_loop().run_in_executor(None, nginx.stop, grace_s)


def _stop_group(server: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM TorchServe's process group (launcher, Java, workers), SIGKILL what is left after the grace period.

    Java may restart a worker that the first SIGTERM stopped before Java itself exits; that late worker never
    got the signal. So once the launcher is gone, what remains of the group gets SIGTERM again and, after
    LEFTOVER_S, SIGKILL, instead of holding the pod for the whole grace period.
    """
    group = server.pid  # started as a session leader
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    launcher_gone = None
    while time.monotonic() < deadline:
        _reap()
        if not _signal_group(group, 0):
            return
        if server.poll() is not None:
            if launcher_gone is None:
                launcher_gone = time.monotonic()
                _signal_group(group, signal.SIGTERM)
            elif time.monotonic() - launcher_gone > LEFTOVER_S:
                break
        time.sleep(0.1)
    _signal_group(group, signal.SIGKILL)
    _reap()


def _signal_group(group: int, sig: int) -> bool:
    """Send `sig` to the process group; False when no process of it is left."""
    try:
        os.killpg(group, sig)
        return True
    except ProcessLookupError:
        return False


def _reap() -> None:
    """As PID 1, collect exited orphans (TorchServe's Java outlives its launcher when the launcher dies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _env_seconds(name: str, default: float) -> float | str:
    """The environment's `name` (argparse converts and checks it like a command-line value), else `default`."""
    return os.environ.get(name, "").strip() or default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m serving.kserve_runtime", description=__doc__.split("\n")[0])
    parser.add_argument("--model-store", default="/mnt/models/model-store")
    parser.add_argument("--ts-config", default="/mnt/models/config/config.properties")
    parser.add_argument("--model-name", default=None, help="default: the one model in model_snapshot")
    parser.add_argument("--http-host", default="0.0.0.0")
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("PORT", DEFAULT_PORT)))
    parser.add_argument("--grpc-port", type=int, default=None,
                        help=f"Open Inference gRPC port (default {KSERVE_GRPC_PORT}, not required to be free; "
                             "an explicit port must be served); 0 or less: no gRPC")
    parser.add_argument("--shutdown-delay", type=float,
                        default=_env_seconds(SHUTDOWN_DELAY_ENV, SHUTDOWN_DELAY_S),
                        help=f"seconds requests are still served after SIGTERM, while the pod leaves the Service "
                             f"(${SHUTDOWN_DELAY_ENV}, default {SHUTDOWN_DELAY_S:g})")
    parser.add_argument("--termination-grace", type=float,
                        default=_env_seconds(TERMINATION_GRACE_ENV, TERMINATION_GRACE_S),
                        help=f"the pod's terminationGracePeriodSeconds: the whole shutdown ends within it "
                             f"(${TERMINATION_GRACE_ENV}, default {TERMINATION_GRACE_S:g})")
    parser.add_argument("--front", choices=FRONTS, default=FRONTS[0],
                        help="what listens on --http-port: nginx (inference straight to TorchServe, the rest to "
                             "the gateway; needs Debian's nginx and libnginx-mod-http-lua) or the aiohttp gateway "
                             "alone (every request through Python); default %(default)s")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help=f"serve without {API_KEY_ENV} (only behind a mesh policy that authenticates callers)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    api_key = os.environ.get(API_KEY_ENV, "").strip() or None
    if api_key is None and not args.allow_unauthenticated:
        print(f"kserve_runtime: {API_KEY_ENV} is not set: set it from a Secret, or pass --allow-unauthenticated "
              "when a mesh policy authenticates callers", file=sys.stderr)
        return 2
    try:
        upstream = Upstream.from_config(Path(args.ts_config), args.model_name)
        metrics = GatewayMetrics.from_config(Path(args.ts_config), upstream.model)
    except (RuntimeConfigError, ValueError) as exc:
        print(f"kserve_runtime: {exc}", file=sys.stderr)
        return 2
    times = ShutdownTimes(args.shutdown_delay, args.termination_grace)
    try:
        times.check()
    except ValueError as exc:
        print(f"kserve_runtime: {exc}", file=sys.stderr)
        return 2
    if not Path(args.model_store).is_dir():
        print(f"kserve_runtime: model store {args.model_store} is not a directory", file=sys.stderr)
        return 2
    beside = Path(sys.executable).with_name("torchserve")  # the launcher of this Python's environment
    launcher = str(beside) if beside.is_file() else "torchserve"
    server = subprocess.Popen([launcher, "--foreground", "--ncs", "--model-store", args.model_store,
                               "--ts-config", args.ts_config, "--log-config", str(LOG_CONFIG_FILE)],
                              start_new_session=True,
                              env=torchserve_environment(os.environ))
    grpc_port = KSERVE_GRPC_PORT if args.grpc_port is None else args.grpc_port
    gateway = Gateway(upstream, api_key, metrics)
    front = None
    if args.front == "nginx":
        front = front_settings(upstream, args, api_key is not None, times)
        if metrics is not None:
            metrics.front = lambda: gateway.front.state()
    return asyncio.run(_serve(gateway, server, args.http_host, args.http_port, times,
                              grpc_port if grpc_port > 0 else None, args.grpc_port is not None, front))


def front_settings(upstream: Upstream, args: argparse.Namespace, require_key: bool,
                   times: ShutdownTimes) -> FrontSettings:
    """The nginx front for `upstream`, the gateway moved to a free loopback port."""
    import socket

    with socket.socket() as probe:  # a free port for the gateway; nginx reaches it on loopback only
        probe.bind(("127.0.0.1", 0))
        gateway_port = probe.getsockname()[1]
    runtime = Path(os.environ.get("TMPDIR") or "/tmp") / f"nginx-front-{os.getpid()}"
    return FrontSettings(args.http_host, args.http_port, upstream.inference, gateway_port, upstream.model,
                         upstream.versions, upstream.default_version, upstream.max_request_size, upstream.response_timeout_s, require_key,
                         BUCKETS, max(times.grace - times.delay - TORCHSERVE_STOP_S, 1.0), runtime)


if __name__ == "__main__":
    sys.exit(main())
