"""The gateway's seam: what answers its inference, TorchServe behind it or the model in the gateway's own process.

Both speak TorchServe's inference API, the contract of the .mar's handler: ``POST /predictions/<m>[/<v>]`` with
any body, ``POST /v1/models/<m>:predict`` and ``POST /v2/models/<m>/infer`` with JSON, ``GET /ping``. The
gateway (:mod:`serving.gateway.app`) turns what KServe's and Triton's clients send into such a call
(:class:`InferenceCall`) and the backend's :class:`Reply` back into the protocol's answer; health, readiness and
the model's description come from the backend too.

- :class:`serving.kserve_runtime.torchserve.Upstream`: TorchServe on loopback, reached over HTTP;
- :class:`serving.python_runtime.in_process.InProcessBackend`: the handler core in the gateway's process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol


@dataclass(frozen=True)
class InferenceCall:
    """One request to TorchServe's inference API, as the gateway forwards it (hop-by-hop headers removed)."""

    method: str
    path: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """The inference API's answer."""

    status: int
    body: bytes
    content_type: str = "application/json"


class Backend(Protocol):
    """The served model (one name, its versions, its limits) and the inference API that answers for it."""

    model: str
    versions: tuple[str, ...]
    #: The version that answers paths naming none.
    default_version: str
    max_request_size: int
    response_timeout_s: float
    #: Whether the model server logs each refusal it answers (TorchServe's handler does); else the gateway does.
    logs_refusals: bool

    @property
    def server(self) -> tuple[str, str]:
        """(name, version) of the server, for the Open Inference server metadata."""

    async def open(self) -> None:
        """Called once the gateway's event loop runs."""

    async def close(self) -> None:
        """Called when the gateway stops."""

    async def alive(self) -> bool:
        """The model server answers (liveness)."""

    async def ready(self) -> bool:
        """The model can answer inference now (readiness, before the gateway's own drain state)."""

    async def send(self, call: InferenceCall) -> Reply:
        """The inference API's answer to `call`; a 503 Reply when the model server cannot be reached."""
