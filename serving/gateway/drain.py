"""The graceful drain on SIGTERM, and how it spends the pod's termination grace period.

Kubernetes sends SIGTERM while the endpoint controllers and every node's proxy are still removing the pod from
the Service, so requests keep coming for a moment. So readiness answers 503 at once and every answer from then
on carries ``Connection: close``; requests are still served for the shutdown delay (``SHUTDOWN_DELAY_SECONDS``,
3 s); then new requests get 503 and new gRPC calls UNAVAILABLE, the ones in flight are answered, the listeners
close, and the model server gets the rest of the grace period (``TERMINATION_GRACE_SECONDS``, Kubernetes'
default 30 s) to stop. A second signal skips the delay.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from aiohttp import web

logger = logging.getLogger("kserve_runtime")

#: Environment variable: seconds between SIGTERM and refusing new requests (readiness is 503 meanwhile): the
#: time Kubernetes takes to remove a terminating pod from its Services' endpoints on every node (1-2 s on a
#: small cluster; raise it where the ingress or a large cluster is slower).
SHUTDOWN_DELAY_ENV = "SHUTDOWN_DELAY_SECONDS"
SHUTDOWN_DELAY_S = 3.0
#: Environment variable: the pod's terminationGracePeriodSeconds, which the whole shutdown must fit in.
TERMINATION_GRACE_ENV = "TERMINATION_GRACE_SECONDS"
TERMINATION_GRACE_S = 30.0  # Kubernetes' default
#: What the grace period keeps for stopping the model server once the last request is answered (TorchServe
#: takes 2-3 s).
BACKEND_STOP_S = 8.0
#: Kept back from the grace period so the runtime exits before the kubelet's SIGKILL.
EXIT_MARGIN_S = 1.0
#: With nothing in flight, the listeners close once no request has come for this long (a client that was just
#: answered with Connection: close reconnects at once, and gets a 503 instead of a reset backlog connection).
QUIET_S = 0.5


class Drain:
    """The gateway's shutdown state and its HTTP requests in flight (probes not counted)."""

    def __init__(self) -> None:
        #: SIGTERM came: not ready, and every answer closes its connection.
        self.draining = False
        #: New requests are answered 503.
        self.refusing = False
        self.in_flight = 0
        self.last_arrival = 0.0

    async def settled(self, deadline: float) -> bool:
        """Wait until nothing is in flight and no request came for QUIET_S; False if `deadline` came first."""
        while time.monotonic() < deadline:
            if self.in_flight == 0 and time.monotonic() - self.last_arrival >= QUIET_S:
                return True
            await asyncio.sleep(0.05)
        return False


class StopSignals:
    """SIGTERM and SIGINT on the running event loop: the first sets `stop` (and `at`), a second sets `hurry`."""

    def __init__(self) -> None:
        self.stop, self.hurry = asyncio.Event(), asyncio.Event()
        self.at = 0.0
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)

    def request_stop(self) -> None:
        """What a signal does: stop (drain) the first time, hurry the second."""
        if self.stop.is_set():
            self.hurry.set()
            return
        self.at = time.monotonic()
        self.stop.set()


class FrontProcess(Protocol):
    """A proxy listening in front of the gateway that keeps the drain itself (serving.kserve_runtime.nginx_front)."""

    async def drain_to(self, state: str) -> int | None:
        """Enter `state` ('draining' or 'refusing'); the requests it has in flight, None when it did not answer."""

    async def settled(self, deadline: float, quiet_s: float) -> bool:
        """Until nothing is in flight and no request came for `quiet_s`; False if `deadline` came first."""

    async def shut(self, grace_s: float) -> None:
        """Stop, letting the requests in flight finish for up to `grace_s`."""


@dataclass(frozen=True)
class ShutdownTimes:
    """How the shutdown spends the pod's termination grace period (seconds)."""

    delay: float = SHUTDOWN_DELAY_S
    grace: float = TERMINATION_GRACE_S

    def check(self) -> None:
        """Raise ValueError (one line) unless the delay leaves BACKEND_STOP_S of the grace period."""
        if self.delay < 0:
            raise ValueError(f"the shutdown delay must not be negative (got {self.delay:g} s)")
        if self.grace - self.delay < BACKEND_STOP_S + EXIT_MARGIN_S:
            raise ValueError(f"a shutdown delay of {self.delay:g} s leaves too little of the {self.grace:g} s "
                             f"termination grace period: keep at least {BACKEND_STOP_S + EXIT_MARGIN_S:g} s "
                             "for the requests in flight and the model server's stop")

    @staticmethod
    def env_default(name: str, default: float) -> float | str:
        """The environment's `name` (argparse converts and checks it like a command-line value), else `default`."""
        return os.environ.get(name, "").strip() or default


async def drain(state: Drain, front: FrontProcess | None, runner: web.AppRunner, grpc_server: Any,
                times: ShutdownTimes, started: float, ends_delay: Iterable["asyncio.Future[Any]"],
                hurry: asyncio.Event) -> None:
    """Drain a gateway (its `state`; its `front`, when one listens before it) within the grace period that began
    at `started` (see the module docstring).

    The delay ends early on a second signal (`hurry`) or when one of `ends_delay` completes (the model server
    exited). New requests are then refused with 503 and gRPC calls with UNAVAILABLE (the listeners stay open,
    so a client that connects now is answered instead of reset with the listen backlog), and the requests in
    flight are answered; the listeners close once nothing is in flight and no request came for QUIET_S, or
    when only BACKEND_STOP_S of the grace period is left.
    """
    state.draining = True
    if front is not None:
        await front.drain_to("draining")
    logger.info("SIGTERM: readiness is 503; serving %.0f s more while the pod leaves the Service's endpoints",
                times.delay)
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({hurried, *ends_delay}, timeout=times.delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hurried.cancel()
    state.refusing = True
    deadline = started + times.grace - BACKEND_STOP_S
    in_flight = state.in_flight
    if front is not None:
        in_flight = (await front.drain_to("refusing")) or in_flight
    logger.info("refusing new requests; %d HTTP requests in flight", in_flight)
    settled = await (front.settled(deadline, QUIET_S) if front is not None else state.settled(deadline))
    if not settled:
        logger.warning("HTTP requests still in flight at the end of the drain: they are cancelled")
    if grpc_server is not None:
        # Stopped only now: until here new calls are refused UNAVAILABLE by the servicer (a call that reaches a
        # stopping grpc.aio server can be CANCELLED instead); the calls in flight get the rest of the drain.
        await grpc_server.stop(grace=max(deadline - time.monotonic(), 0.0))
    if front is not None:
        await front.shut(max(deadline - time.monotonic(), EXIT_MARGIN_S))
    await runner.cleanup()
