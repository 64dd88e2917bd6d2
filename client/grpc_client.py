"""TorchServe's gRPC inference API (port 7070 by default): Ping and Predictions.

Differences from REST, measured on TorchServe 0.12, that this module absorbs:

- A refused image is not a gRPC error: TorchServe ignores the handler's per-request status on gRPC
  and answers OK with the handler's ``{"error", "status"}`` JSON, turned here into BadImageError.
- An unknown model or version is INTERNAL (not NOT_FOUND), with the Java exception's name in the
  details (``ModelNotFoundException`` / ``ModelVersionNotFoundException``).
- A missing, wrong or expired token is PERMISSION_DENIED.
- StreamPredictions is not offered: against a handler that answers once per request (this one),
  TorchServe 0.12's frontend fails the call with INTERNAL "Worker died." and restarts the worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2

from handler.requests import EMBEDDING_OPTION
from settings import CONFIG_FILE
from torchserve_api.management import wrong_port
from torchserve_api.retry import RetryPolicy
from torchserve_api.transport import auth_error, is_loopback

from . import protos
from .answers import Result, as_answer, predict_each
from .errors import BadImageError, ClientError, ConnectionFailed, ModelNotFoundError, RequestTimeout, ServerError
from .tokens import Token

#: Above TorchServe's max_request_size (8 MiB), so the server, not the client, decides what is too large.
MAX_MESSAGE = 64 * 1024 * 1024


def target_of(url: str) -> str:
    """``grpc://host:port``, ``http://host:port`` or ``host:port`` -> ``host:port``."""
    for prefix in ("grpc://", "http://", "https://"):
        url = url.removeprefix(prefix)
    return url.rstrip("/")


class GrpcTransport:
    def __init__(self, target: str, model: str, version: str | None, token: Token, timeout: float = 30.0,
                 retry: RetryPolicy | None = None, config: Path = CONFIG_FILE) -> None:
        self.stubs = protos.load()
        self.config = config
        self.target = target_of(target)
        self.model = model
        self.version = version
        self.token = token
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        service = self.stubs.inference_pb2.DESCRIPTOR.services_by_name["InferenceAPIsService"].full_name
        options = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE),
                   ("grpc.enable_retries", 1), ("grpc.service_config", self.retry.grpc_service_config(service))]
        if is_loopback(self.target):
            options.append(("grpc.enable_http_proxy", 0))
        self.channel = grpc.insecure_channel(self.target, options=options)
        self.stub = self.stubs.inference_pb2_grpc.InferenceAPIsServiceStub(self.channel)

    def _error(self, exc: grpc.RpcError) -> ClientError:
        code, details = exc.code(), (exc.details() or "")
        first = details.strip().splitlines()[0] if details.strip() else code.name
        if code == grpc.StatusCode.PERMISSION_DENIED or code == grpc.StatusCode.UNAUTHENTICATED:
            return auth_error(self.token, self.target)
        if code == grpc.StatusCode.NOT_FOUND or "ModelNotFoundException" in details \
                or "ModelVersionNotFoundException" in details:
            what = f"model {self.model!r}" + (f" version {self.version!r}" if self.version else "")
            return ModelNotFoundError(f"{what} is not loaded on {self.target} ({first})", self.model, self.version)
        if code == grpc.StatusCode.UNIMPLEMENTED and "InferenceAPIsService" in details:
            return wrong_port(self.target, "TorchServe's gRPC management port", "gRPC inference", self.config)
        if code == grpc.StatusCode.UNAVAILABLE and "http1" in details.lower():
            return wrong_port(self.target, "an HTTP (REST) port", "gRPC inference", self.config)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return RequestTimeout(f"no answer from {self.target} within {self.timeout:g}s")
        if code == grpc.StatusCode.UNAVAILABLE:
            lowered = details.lower()
            if "refused" in lowered:
                return ConnectionFailed(f"cannot connect to {self.target}: connection refused")
            if "connect" in lowered or "unreachable" in lowered or "dns" in lowered:
                return ConnectionFailed(f"cannot connect to {self.target}: {first}")
            return ServerError(f"{self.target} unavailable: {first}", 503)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return BadImageError(f"request too large for {self.target}: {first}", 413)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return BadImageError(first, 400)
        return ServerError(f"{self.target} answered {code.name}: {first}", 500)

    def _call(self, method: Any, request: Any) -> Any:
        """One call; the channel's retry policy repeats it on UNAVAILABLE."""
        try:
            return method(request, timeout=self.timeout, metadata=self.token.metadata())
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def predict(self, image: bytes, embedding: bool = False) -> dict[str, Any]:
        """Input ``{"data": image}``; with ``embedding`` also the option's field ``b"true"``."""
        fields = {"data": image, **({EMBEDDING_OPTION: b"true"} if embedding else {})}
        request = self.stubs.inference_pb2.PredictionsRequest(model_name=self.model, model_version=self.version or "",
                                                             input=fields)
        return as_answer(self._call(self.stub.Predictions, request).prediction, embedding)

    def predict_batch(self, images: list[bytes], embedding: bool = False) -> list[Result]:
        """One call per image (TorchServe's gRPC input map carries one image); a refused image fails alone."""
        return predict_each(lambda image: self.predict(image, embedding), images)

    def ping(self) -> str:
        health = self._call(self.stub.Ping, empty_pb2.Empty()).health
        try:
            return json.loads(health).get("status", health)
        except (ValueError, AttributeError):
            return health

    def close(self) -> None:
        self.channel.close()
