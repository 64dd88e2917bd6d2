"""The command-line options both serving runtimes take: where to listen, the shutdown's times, and the key."""

from __future__ import annotations

import argparse
import os

from serving.gateway.app import API_KEY_ENV
from serving.gateway.drain import (SHUTDOWN_DELAY_ENV, SHUTDOWN_DELAY_S, TERMINATION_GRACE_ENV, TERMINATION_GRACE_S,
                                   ShutdownTimes)
from settings import KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """--http-host/port, --grpc-port, --shutdown-delay, --termination-grace, --allow-unauthenticated."""
    parser.add_argument("--http-host", default="0.0.0.0")
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("PORT", KSERVE_GATEWAY_PORT)))
    parser.add_argument("--grpc-port", type=int, default=None,
                        help=f"Open Inference gRPC port (default {KSERVE_GRPC_PORT}, not required to be free; "
                             "an explicit port must be served); 0 or less: no gRPC")
    parser.add_argument("--shutdown-delay", type=float,
                        default=ShutdownTimes.env_default(SHUTDOWN_DELAY_ENV, SHUTDOWN_DELAY_S),
                        help=f"seconds requests are still served after SIGTERM, while the pod leaves the Service "
                             f"(${SHUTDOWN_DELAY_ENV}, default {SHUTDOWN_DELAY_S:g})")
    parser.add_argument("--termination-grace", type=float,
                        default=ShutdownTimes.env_default(TERMINATION_GRACE_ENV, TERMINATION_GRACE_S),
                        help=f"the pod's terminationGracePeriodSeconds: the whole shutdown ends within it "
                             f"(${TERMINATION_GRACE_ENV}, default {TERMINATION_GRACE_S:g})")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help=f"serve without {API_KEY_ENV} (only behind a mesh policy that authenticates callers)")


def api_key(args: argparse.Namespace, prog: str = "kserve_runtime") -> tuple[str | None, str | None]:
    """(the bearer key from the environment, None) or (None, the one-line refusal when none is set and
    --allow-unauthenticated was not given)."""
    key = os.environ.get(API_KEY_ENV, "").strip() or None
    if key is None and not args.allow_unauthenticated:
        return None, (f"{prog}: {API_KEY_ENV} is not set: set it from a Secret, or pass --allow-unauthenticated "
                      "when a mesh policy authenticates callers")
    return key, None


def shutdown_times(args: argparse.Namespace) -> ShutdownTimes:
    """The checked ShutdownTimes of the command line (ValueError, one line)."""
    times = ShutdownTimes(args.shutdown_delay, args.termination_grace)
    times.check()
    return times


def grpc_port(args: argparse.Namespace) -> tuple[int | None, bool]:
    """(the gRPC port to serve, or None for none; whether it must be served: it was asked for explicitly)."""
    port = KSERVE_GRPC_PORT if args.grpc_port is None else args.grpc_port
    return (port if port > 0 else None), args.grpc_port is not None
