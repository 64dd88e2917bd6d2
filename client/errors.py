"""Typed failures of the client, each with the CLI exit code and a one-line message.

Exit codes of ``python -m client``:

==== =====================================================================================
0    every image answered (or the lifecycle command succeeded)
1    unexpected answer from the server (not TorchServe/KServe, or a protocol mismatch)
2    usage error: bad arguments, unreadable image file or folder, unreadable key file
3    token refused: missing, or wrong/expired (``AuthError.reason`` says which)
4    model or model version not loaded on the server
5    at least one image failed: unreadable, or refused by the server (4xx: not an image, too large, ...)
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

from torchserve_api.errors import (AuthError, BadImageError, ClientError, ConnectionFailed, LifecycleError,
                                   ModelNotFoundError, RequestTimeout, ServerError, UsageError)

__all__ = ["ClientError", "UsageError", "AuthError", "ModelNotFoundError", "BadImageError", "RequestTimeout",
           "ConnectionFailed", "ServerError", "LifecycleError", "DriftDetected", "NoBaselineError",
           "TooFewRequestsError"]


class DriftDetected(ClientError):
    exit_code = 10


class NoBaselineError(ClientError):
    exit_code = 11


class TooFewRequestsError(ClientError):
    exit_code = 12
