"""TorchServe behind the gateway: where it listens inside the container, the model it serves, and how the
gateway reaches it (the :class:`~serving.gateway.backend.Backend` of the TorchServe runtime).

TorchServe's frontend routes ``/v1/models/<m>:predict``, ``/v2/models/<m>/infer`` and ``/predictions/<m>`` to the
handler (which reads every format, see :mod:`handler.protocols`) but has no health, readiness or metadata paths:
liveness is its ``/ping``, readiness a READY worker in its management API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path
from urllib.parse import quote, urlsplit

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector

from serving.gateway.backend import InferenceCall, Reply
from serving.ts_config import (RuntimeConfigError, default_version, request_limits, served_model,
                               snapshot_models)
from settings import read_properties

logger = logging.getLogger("kserve_runtime")

LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Readiness answers are reused this long, so probes and clients don't each ask the management API.
READY_CACHE_S = 1.0
UNAVAILABLE = json.dumps({"error": "the model server is not answering; retry shortly"}).encode()


@dataclass
class Upstream:
    """Where TorchServe listens inside the container, the model it serves, and the HTTP client that reaches it."""

    inference: str
    management: str
    model: str
    versions: tuple[str, ...]
    max_request_size: int
    response_timeout_s: float
    #: The version that answers paths naming none (model_snapshot's defaultVersion, else its first).
    default_version: str = ""
    session: ClientSession | None = field(default=None, repr=False, compare=False)
    _ready: tuple[float, bool] = field(default=(0.0, False), repr=False, compare=False)
    #: The handler logs each request it refuses (handler.log_lines).
    logs_refusals: ClassVar[bool] = True

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
        model, entries = served_model(snapshot_models(props, ts_config), ts_config, model)
        return cls(addresses["inference_address"], addresses["management_address"], model, tuple(entries),
                   *request_limits(props), default_version(entries))

    @property
    def server(self) -> tuple[str, str]:
        try:
            from importlib.metadata import version

            return "torchserve", version("torchserve")
        except Exception:
            return "torchserve", "unknown"

    async def open(self) -> None:
        timeout = ClientTimeout(total=self.response_timeout_s + 5)
        self.session = ClientSession(connector=TCPConnector(limit=256), timeout=timeout, auto_decompress=False)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def alive(self) -> bool:
        assert self.session is not None
        try:
            async with self.session.get(f"{self.inference}/ping", timeout=ClientTimeout(total=3)) as r:
                return r.status == 200
        except (ClientError, asyncio.TimeoutError):
            return False

    async def ready(self) -> bool:
        """A worker of the model reports READY in the management API (cached READY_CACHE_S)."""
        checked, ready = self._ready
        if time.monotonic() - checked < READY_CACHE_S:
            return ready
        assert self.session is not None
        url = f"{self.management}/models/{quote(self.model)}"
        try:
            async with self.session.get(url, timeout=ClientTimeout(total=3)) as response:
                models = await response.json(content_type=None) if response.status == 200 else []
            ready = any(worker.get("status") == "READY"
                        for model in models for worker in model.get("workers", []))
        except (ClientError, asyncio.TimeoutError, ValueError, AttributeError, TypeError):
            ready = False
        self._ready = (time.monotonic(), ready)
        return ready

    async def send(self, call: InferenceCall) -> Reply:
        assert self.session is not None
        try:
            async with self.session.request(call.method, f"{self.inference}{call.path}", params=call.query,
                                            data=call.body, headers=dict(call.headers)) as upstream:
                payload = await upstream.read()
                return Reply(upstream.status, payload, upstream.content_type or "application/json")
        except (ClientError, asyncio.TimeoutError) as exc:
            logger.warning("TorchServe did not answer %s %s: %s", call.method, call.path, exc)
            return Reply(503, UNAVAILABLE)
