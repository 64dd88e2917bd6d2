"""The serving image's PID 1: TorchServe on loopback, and KServe's protocols on the port KServe routes to.

``python -m serving.kserve_runtime``. KServe expects one HTTP port that answers the KServe v1 and Open Inference v2
REST paths, health and model metadata included; TorchServe has no health, readiness or metadata paths. So this
command

- starts ``torchserve --foreground`` with the storage initializer's layout (``/mnt/models``), its inference and
  management APIs on loopback only (:mod:`serving.kserve_runtime.supervisor`);
- by default (``--front nginx``) starts nginx on the HTTP port (:mod:`serving.kserve_runtime.nginx_front`): it
  sends ``/predictions/<m>`` and v1 JSON straight to TorchServe, checks the key, counts the request histogram and
  follows the drain, and sends every other path to the gateway (:mod:`serving.gateway.app`), which then listens on
  loopback only; ``--front aiohttp`` serves everything from the gateway;
- requires ``Authorization: Bearer <key>`` on everything but the two health paths, the key coming from the
  environment (a Kubernetes Secret); without a key it refuses to start unless told ``--allow-unauthenticated``
  (for a mesh that authenticates in front of it);
- serves Open Inference gRPC (KServe's ``grpc-v2``) on ``--grpc-port`` (8081, KServe's default) in the same event
  loop, with the same key, checks and backend (:mod:`serving.gateway.grpc_server`). If the default port cannot be
  served (taken, or the generated stubs missing) it says so and serves REST alone; an explicit ``--grpc-port``
  that cannot be served is an error;
- drains on SIGTERM (:mod:`serving.gateway.drain`) and exits non-zero as soon as TorchServe exits on its own.

Only the standard library, aiohttp, prometheus_client (:mod:`serving.gateway_metrics`) and :mod:`settings` are
imported, and grpcio with the generated Open Inference stubs once gRPC starts: the image has no kfp or training
code.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from pathlib import Path

from serving.gateway.app import Gateway
from serving.gateway.drain import BACKEND_STOP_S, ShutdownTimes
from serving.gateway.options import add_serving_arguments, api_key, grpc_port, shutdown_times
from serving.gateway_metrics import BUCKETS, GatewayMetrics
from serving.kserve_runtime.nginx_front import FrontSettings
from serving.kserve_runtime.supervisor import serve, start_torchserve
from serving.kserve_runtime.torchserve import Upstream
from serving.ts_config import RuntimeConfigError

PROG = "python -m serving.kserve_runtime"
#: What may listen on the HTTP port, the default first (see serving.kserve_runtime.nginx_front for the measurement).
FRONTS = ("nginx", "aiohttp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--model-store", default="/mnt/models/model-store")
    parser.add_argument("--ts-config", default="/mnt/models/config/config.properties")
    parser.add_argument("--model-name", default=None, help="default: the one model in model_snapshot")
    add_serving_arguments(parser)
    parser.add_argument("--front", choices=FRONTS, default=FRONTS[0],
                        help="what listens on --http-port: nginx (inference straight to TorchServe, the rest to "
                             "the gateway; needs Debian's nginx and libnginx-mod-http-lua) or the aiohttp gateway "
                             "alone (every request through Python); default %(default)s")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    key, refusal = api_key(args)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    try:
        upstream = Upstream.from_config(Path(args.ts_config), args.model_name)
        metrics = GatewayMetrics.from_config(Path(args.ts_config), upstream.model)
        times = shutdown_times(args)
    except (RuntimeConfigError, ValueError) as exc:
        print(f"kserve_runtime: {exc}", file=sys.stderr)
        return 2
    if not Path(args.model_store).is_dir():
        print(f"kserve_runtime: model store {args.model_store} is not a directory", file=sys.stderr)
        return 2
    server = start_torchserve(args.model_store, args.ts_config)
    gateway = Gateway(upstream, key, metrics)
    front = None
    if args.front == "nginx":
        front = front_settings(upstream, args, key is not None, times)
        if metrics is not None:
            metrics.front = lambda: gateway.front.histogram_page()
    return asyncio.run(serve(gateway, server, args.http_host, args.http_port, times, *grpc_port(args), front))


def front_settings(upstream: Upstream, args: argparse.Namespace, require_key: bool,
                   times: ShutdownTimes) -> FrontSettings:
    """The nginx front for `upstream`, the gateway moved to a free loopback port."""
    with socket.socket() as probe:  # a free port for the gateway; nginx reaches it on loopback only
        probe.bind(("127.0.0.1", 0))
        gateway_port = probe.getsockname()[1]
    runtime = Path(os.environ.get("TMPDIR") or "/tmp") / f"nginx-front-{os.getpid()}"
    return FrontSettings(args.http_host, args.http_port, upstream.inference, gateway_port, upstream.model,
                         upstream.versions, upstream.default_version, upstream.max_request_size,
                         upstream.response_timeout_s, require_key, BUCKETS,
                         max(times.grace - times.delay - BACKEND_STOP_S, 1.0), runtime)
