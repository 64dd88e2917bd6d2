"""Bounded retries with exponential backoff, for connection failures and 503 only.

Everything else (timeouts, 4xx, other 5xx) fails at once: retrying a timeout multiplies the wait, and
a refused image or token will be refused again.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from .errors import ConnectionFailed, ServerError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3        # attempts after the first
    backoff: float = 0.2    # seconds before the first retry, doubled each time
    max_delay: float = 5.0

    def delay(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (0-based), with up to 10% jitter to spread clients."""
        base = min(self.max_delay, self.backoff * (2 ** attempt))
        return base * (1 + 0.1 * random.random())


def retryable(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionFailed) or (isinstance(exc, ServerError) and exc.status == 503)


def with_retries(attempt: Callable[[], T], policy: RetryPolicy,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``attempt`` until it succeeds, fails with a non-retryable error, or the retries run out."""
    for n in range(policy.retries + 1):
        try:
            return attempt()
        except (ConnectionFailed, ServerError) as exc:
            if n == policy.retries or not retryable(exc):
                raise
            sleep(policy.delay(n))
    raise AssertionError("unreachable")
