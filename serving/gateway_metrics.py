"""The KServe gateway's per-request latency histogram, served together with TorchServe's metrics on one port.

Why the gateway and not TorchServe: TorchServe 0.12's Prometheus backend has a histogram type, but only with
the Java client's default buckets (a metric specification has a name, unit and dimensions, no buckets), and
a handler-side metric sees one batch's handler time, not what a caller waits (queue, batch delay, frontend).
TorchServe's own request metrics are sums (``ts_inference_latency_microseconds``) and per-batch gauges. The
gateway sees every inference request from arrival to answer, so it observes
``embedding_request_duration_seconds`` (seconds, as Prometheus names base units) with buckets around the
25 ms p99 target, labelled with the model name, the model version that answered and the status code.

The cluster's config.properties (pipeline.kserve_deploy.runtime_properties) puts TorchServe's metrics on loopback
and names ``gateway_metrics_address``; the gateway then answers ``/metrics`` there with its histogram followed
by TorchServe's page, so scrape configs, the ServingRuntime's ``prometheus.kserve.io/port`` and the
NetworkPolicy keep one metrics port. A config without that key (written before it existed) serves as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import ClientError, ClientSession, ClientTimeout, web
from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, generate_latest

from settings import GATEWAY_METRICS_KEY, read_properties

logger = logging.getLogger("kserve_runtime.metrics")
# No *_created series: a gauge per label set that no rule reads (this process holds no other metrics).
disable_created_metrics()

REQUEST_SECONDS = "embedding_request_duration_seconds"
REQUEST_SECONDS_HELP = ("Time from a request's arrival at the gateway to its answer "
                        "(queue, batching and handler in TorchServe included)")
LABELS = ("model_name", "model_version", "code")
#: Around the 25 ms p99 target (a lone request waits the 50 ms batch delay at most), up to the 30 s response
#: timeout: histogram_quantile interpolates inside a bucket, so the target itself is a bucket edge.
BUCKETS = (0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Inference paths of the gateway: (model, version or None) from the path.
_INFERENCE = (re.compile(r"^/v1/models/(?P<model>[^/:]+):predict$"),
              re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$"),
              re.compile(r"^/predictions/(?P<model>[^/]+)(?:/(?P<version>[^/]+))?$"))
UPSTREAM_TIMEOUT_S = 5.0


def histogram_series(name: str = REQUEST_SECONDS) -> tuple[str, ...]:
    """The series names a Prometheus histogram named `name` exposes."""
    return (f"{name}_bucket", f"{name}_sum", f"{name}_count")


def inference_target(path: str) -> tuple[str, str | None] | None:
    """(model, version or None) of an inference path of the gateway; None for any other path."""
    for pattern in _INFERENCE:
        match = pattern.match(path)
        if match:
            return match.group("model"), match.groupdict().get("version")
    return None


async def serve_metrics_page(page: Callable[[web.Request], Awaitable[web.Response]], host: str, port: int,
                             what: str = "") -> web.AppRunner:
    """Serve ``page`` at http://host:port/metrics; the runner to clean up. A port that cannot be bound is logged,
    not raised: metrics never take inference down (the scrape failing pages instead)."""
    app = web.Application()
    app.add_routes([web.get("/metrics", page)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError as exc:
        logger.error("cannot serve metrics on %s:%d: %s", host, port, exc)
        return runner
    logger.info("metrics on %s:%d/metrics %s", host, port, what)
    return runner


@dataclass
class GatewayMetrics:
    """The histogram of one served model, and the /metrics site that serves it beside TorchServe's page."""

    model: str
    versions: tuple[str, ...]
    default_version: str
    host: str = ""
    port: int = 0
    torchserve_metrics: str = ""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.seconds = Histogram(REQUEST_SECONDS, REQUEST_SECONDS_HELP, LABELS, buckets=BUCKETS,
                                 registry=self.registry)
        #: Set when nginx fronts the gateway (serving.kserve_runtime.nginx_front): nginx sees every request and
        #: keeps the histogram, whose page this reads at each scrape; the gateway then observes nothing itself.
        self.front: Callable[[], Awaitable[bytes]] | None = None
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    @classmethod
    def from_config(cls, ts_config: Path, model: str) -> "GatewayMetrics | None":
        """From the pod's config.properties; None when it names no gateway_metrics_address."""
        props = read_properties(ts_config)
        address = props.get(GATEWAY_METRICS_KEY, "").strip()
        if not address:
            return None
        listen = urlsplit(address)
        upstream = urlsplit(props.get("metrics_address", "http://127.0.0.1:8082"))
        if listen.port is None or (upstream.hostname, upstream.port) == (listen.hostname, listen.port):
            raise ValueError(f"{ts_config}: {GATEWAY_METRICS_KEY}={address} needs a port other than "
                             f"metrics_address's")
        entries = json.loads(props["model_snapshot"])["models"][model]
        default = next((v for v, e in entries.items() if e.get("defaultVersion")), next(iter(entries)))
        return cls(model, tuple(entries), default, listen.hostname or "0.0.0.0", listen.port,
                   f"{upstream.scheme}://{upstream.hostname}:{upstream.port or 80}/metrics")

    def labels_for(self, path: str) -> tuple[str, str] | None:
        """(model, version) to record a request under; None for other paths and for models or versions not
        served here (their 404s would otherwise add a series per made-up name)."""
        target = inference_target(path)
        if target is None or target[0] != self.model:
            return None
        version = target[1] or self.default_version
        return (self.model, version) if version in self.versions else None

    def observe(self, path: str, status: int, seconds: float) -> None:
        labels = self.labels_for(path)
        if labels is not None:
            self.seconds.labels(*labels, str(status)).observe(seconds)

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.observe(request.path, status, time.perf_counter() - started)

    def time_requests(self, app: web.Application) -> None:
        """Time `app`'s requests (outermost middleware: refusals count too)."""
        app.middlewares.insert(0, self.middleware)

    def install(self, app: web.Application) -> None:
        """Time `app`'s requests unless nginx does, and serve /metrics while it runs."""
        if self.front is None:
            self.time_requests(app)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)

    async def page(self, request: web.Request) -> web.Response:
        """The histogram, then TorchServe's page; 503 while TorchServe's metrics do not answer."""
        assert self._session is not None
        try:
            async with self._session.get(self.torchserve_metrics, params=request.rel_url.query) as upstream:
                body = await upstream.read()
                if upstream.status != 200:
                    raise ClientError(f"HTTP {upstream.status}")
        except (ClientError, asyncio.TimeoutError) as exc:
            return web.Response(status=503, text=f"TorchServe metrics at {self.torchserve_metrics}: {exc}\n")
        if self.front is not None:
            try:
                histogram = await self.front()
            except (ClientError, asyncio.TimeoutError, OSError) as exc:
                return web.Response(status=503, text=f"the nginx front's histogram: {exc}\n")
        else:
            histogram = generate_latest(self.registry)
        return web.Response(body=histogram + body,
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def _start(self, _: web.Application) -> None:
        self._session = ClientSession(timeout=ClientTimeout(total=UPSTREAM_TIMEOUT_S))
        self._runner = await serve_metrics_page(self.page, self.host, self.port,
                                                f"(request histogram + TorchServe {self.torchserve_metrics})")

    async def _stop(self, _: web.Application) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
