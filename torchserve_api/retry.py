"""Bounded retries for connection failures and 503 only, done by the transports' own libraries.

REST: urllib3's ``Retry`` on the requests session (first retry at once, then ``backoff`` seconds, doubling,
up to ``max_delay``; a server's Retry-After is honoured). gRPC: the channel's retry policy in its service config
(retries on UNAVAILABLE, gRPC's randomised exponential backoff). Everything else (timeouts, 4xx, other 5xx)
fails at once: retrying a timeout multiplies the wait, and a refused image or token will be refused again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from urllib3.util.retry import Retry

#: gRPC caps a retry policy's attempts (the first one included) at 5.
GRPC_MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3        # attempts after the first
    backoff: float = 0.2    # seconds before the second retry, doubled each time after
    max_delay: float = 5.0

    def urllib3(self) -> Retry:
        """Connection errors (nothing was sent) and 503 answers; read errors are not retried (the request may
        have been processed). Predictions are POSTs, which are safe to repeat here, so every method retries."""
        return Retry(total=self.retries, connect=self.retries, read=False, other=0, redirect=0,
                     status=self.retries, status_forcelist=(503,), allowed_methods=None, raise_on_status=False,
                     backoff_factor=self.backoff / 2, backoff_max=self.max_delay, backoff_jitter=0.1 * self.backoff)

    def grpc_service_config(self, service: str) -> str:
        """The JSON service config that retries `service`'s calls on UNAVAILABLE (gRPC caps attempts at 5)."""
        if self.retries == 0:
            return json.dumps({"methodConfig": [{"name": [{"service": service}]}]})
        policy = {
            "maxAttempts": min(GRPC_MAX_ATTEMPTS, self.retries + 1),
            "initialBackoff": f"{max(self.backoff, 0.001):.3f}s",
            "maxBackoff": f"{max(self.max_delay, self.backoff, 0.001):.3f}s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
        return json.dumps({"methodConfig": [{"name": [{"service": service}], "retryPolicy": policy}]})
