"""Typed failures of a TorchServe API call, each with a one-line message and the client CLI's exit code.

The exit codes are ``python -m client``'s (its module docstring lists them); `serving` only reads the message.
A refused argument is a :class:`ClientUsageError`: a ClientError to library callers and the project's one
``cli_common.UsageError`` (exit status 2) to every command line. :class:`ServerError` is TorchServe's 5xx answer,
not a failure to start a server (that is ``serving.server``'s own error).
"""

from __future__ import annotations

from typing import Any

import cli_common


class ClientError(Exception):
    """Base class: ``str(exc)`` is a one-line, user-facing reason."""

    exit_code = 1


class ClientUsageError(ClientError, cli_common.UsageError):
    """An argument a call cannot use (an address, key file, archive, worker range): exit status 2."""

    exit_code = cli_common.EXIT_USAGE


#: The name the modules not yet moved to ClientUsageError import (torchserve_api.transport, .management, .tokens,
#: client.errors and the client modules that raise it); it goes when they do.
UsageError = ClientUsageError


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
    """TorchServe (or KServe) answered 5xx, or was still unavailable (503) after the retries."""

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
