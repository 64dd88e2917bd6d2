"""TorchServe's inference API answered in this process: the python runtime's :class:`~serving.gateway.backend.Backend`.

The gateway hands it what it would send TorchServe (``/predictions/<m>[/<v>]``, ``/v1/models/<m>:predict``,
``/v2/models/<m>/infer``, ``/ping``); each inference becomes the handler's row (:mod:`serving.python_runtime.
request_rows`), waits for a batch (:mod:`serving.python_runtime.batcher`) and is answered by the handler core
(:mod:`serving.python_runtime.handler_core`). What TorchServe's frontend answers itself (an unknown model or version,
``/ping``, a batch that failed) is answered here with TorchServe's bodies.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import unquote

from serving.gateway.backend import InferenceCall, Reply
from serving.python_runtime.batcher import Batcher, Job
from serving.python_runtime.handler_core import HandlerCore
from serving.python_runtime.metrics import RuntimeMetrics
from serving.forms import FormError, refusal
from serving.python_runtime.request_rows import request_row

logger = logging.getLogger("python_runtime")

SERVER_NAME = "mnist-embedding-python-runtime"
#: TorchServe's answer to GET /ping while it is up.
PING = b'{\n  "status": "Healthy"\n}\n'
_INFERENCE = (re.compile(r"^/predictions/(?P<model>[^/]+)(?:/(?P<version>[^/]+))?$"),
              re.compile(r"^/v1/models/(?P<model>[^/]+):predict$"),
              re.compile(r"^/v2/models/(?P<model>[^/]+)/infer$"))
#: Characters Gson (TorchServe's JSON writer) escapes in strings.
_GSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "=": "\\u003d", "'": "\\u0027"}


def torchserve_error(code: int, kind: str, message: str) -> bytes:
    """An error body as TorchServe's frontend writes it (Gson, pretty-printed, a newline after it)."""
    text = json.dumps({"code": code, "type": kind, "message": message}, indent=2, ensure_ascii=False)
    for char, escape in _GSON_ESCAPES.items():  # never in the keys or the JSON punctuation: only in the values
        text = text.replace(char, escape)
    return (text + "\n").encode()


def inference_target(path: str) -> tuple[str, str | None] | None:
    """(model, version or None) of an inference path of TorchServe's API, decoded as TorchServe decodes it."""
    for pattern in _INFERENCE:
        match = pattern.match(path.split("?", 1)[0])
        if match:
            version = match.groupdict().get("version")
            return unquote(match.group("model")), unquote(version) if version else None
    return None


@dataclass
class Served:
    """The model this process serves: its name, and one handler core per served version."""

    model: str
    cores: dict[str, HandlerCore]
    default_version: str
    max_request_size: int
    response_timeout_s: float


class InProcessBackend:
    """The handler core behind the gateway, in the gateway's process (see the module docstring)."""

    #: The core does not log; the gateway logs each refusal (handler.log_lines).
    logs_refusals = False

    def __init__(self, served: Served, max_batch: int, metrics: RuntimeMetrics | None = None) -> None:
        self.served = served
        self.model = served.model
        self.versions = tuple(served.cores)
        self.default_version = served.default_version
        self.max_request_size = served.max_request_size
        self.response_timeout_s = served.response_timeout_s
        self.metrics = metrics
        self.max_batch = max_batch
        self.batcher: Batcher | None = None

    @property
    def server(self) -> tuple[str, str]:
        try:
            from importlib.metadata import version

            return SERVER_NAME, version("mnist-embedding")
        except Exception:
            return SERVER_NAME, "unknown"

    async def open(self) -> None:
        self.batcher = Batcher(self._answer, self._failed, self.max_batch)
        self.batcher.start()

    async def close(self) -> None:
        if self.batcher is not None:
            await self.batcher.stop()

    async def alive(self) -> bool:
        return True

    async def ready(self) -> bool:
        return self.batcher is not None

    async def send(self, call: InferenceCall) -> Reply:
        if call.path == "/ping":
            return Reply(200, PING)
        target = inference_target(call.path)
        if target is None:
            return Reply(404, torchserve_error(404, "ResourceNotFoundException",
                                               "Requested resource is not found, please refer to API document."))
        model, version = target
        missing = self._missing(model, version)
        if missing is not None:
            return missing
        try:
            row = request_row(call)
        except FormError as exc:
            return Reply(400, refusal(exc))
        assert self.batcher is not None
        job = Job(version or self.default_version, row)
        status, body = await self.batcher.submit(job)
        if self.metrics is not None:
            done = time.perf_counter()
            self.metrics.inference(version, done - job.arrived, job.started - job.arrived)
        return Reply(status, body)

    def _missing(self, model: str, version: str | None) -> Reply | None:
        """TorchServe's 404 for a model or version not served here; None when it is."""
        if model != self.model:
            return Reply(404, torchserve_error(404, "ModelNotFoundException", f"Model not found: {model}"))
        if version is not None and version not in self.served.cores:
            return Reply(404, torchserve_error(404, "ModelVersionNotFoundException",
                                               f"Model version: {version} does not exist for model: {model}"))
        return None

    def _answer(self, version: str, rows: Sequence[Any]) -> list[tuple[int, bytes]]:
        """A batch on the worker thread: the handler core's answers, and the batch's metrics."""
        core = self.served.cores[version]
        answer = core.answer(rows)
        if self.metrics is not None:
            self.metrics.batch(core.version, answer.images, answer.timings, answer.seconds)
        return answer.replies

    @staticmethod
    def _failed(version: str, exc: BaseException) -> tuple[int, bytes]:
        """What TorchServe answers each request of a batch whose handler raised."""
        return 503, torchserve_error(503, "InternalServerException", "Prediction failed")
