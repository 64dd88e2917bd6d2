"""Typed failures of the client, each with the CLI exit code and a one-line message.

Exit codes of ``python -m client``:

==== =====================================================================================
0    every image answered (or the lifecycle command succeeded)
1    unexpected answer from the server (not TorchServe/KServe, or a protocol mismatch)
2    usage error: bad arguments, unreadable image file or folder, unreadable key file
3    token refused: missing, or wrong/expired (``AuthError.reason`` says which)
4    model or model version not loaded on the server
5    at least one image refused by the handler (4xx: not an image, too large, ...)
6    timeout waiting for an answer
7    cannot connect (refused, unreachable) after the retries
8    server error (5xx), or still unavailable (503) after the retries
9    lifecycle operation refused (model API disabled, version conflict, default version)
10   ``drift``: live inputs drifted from the served model's baseline
11   ``drift``: the server (or Prometheus) has no drift-baseline metrics for the model
12   ``drift``: too few answered images to judge
==== =====================================================================================
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Base class: ``str(exc)`` is a one-line, user-facing reason."""

    exit_code = 1


class UsageError(ClientError):
    exit_code = 2


class AuthError(ClientError):
    """TorchServe answered 400 ``InvalidKeyException`` (gRPC: PERMISSION_DENIED)."""

    exit_code = 3

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # "missing", "expired" or "refused" (wrong or expired: the server does not say)


class ModelNotFoundError(ClientError):
    exit_code = 4

    def __init__(self, message: str, model: str, version: str | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.version = version


class BadImageError(ClientError):
    """The handler refused this image; ``status`` and ``message`` are the handler's own."""

    exit_code = 5

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def answer(self) -> dict[str, Any]:
        """The handler's own answer for a refused image: ``{"error", "status"}``."""
        return {"error": self.message, "status": self.status}


class RequestTimeout(ClientError):
    exit_code = 6


class ConnectionFailed(ClientError):
    exit_code = 7


class ServerError(ClientError):
    exit_code = 8

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class LifecycleError(ClientError):
    """The management API refused a version operation (405, 403, 409)."""

    exit_code = 9

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DriftDetected(ClientError):
    exit_code = 10


class NoBaselineError(ClientError):
    exit_code = 11


class TooFewRequestsError(ClientError):
    exit_code = 12
