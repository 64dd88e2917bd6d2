"""One worker process of the python runtime: the model in this process, served over HTTP and gRPC on the runtime's
ports (``SO_REUSEPORT``: the kernel spreads connections over the workers), until SIGTERM, then the graceful drain.

Started by the supervisor (:mod:`serving.python_runtime.supervisor`) in the directory the archive is unpacked in,
so that ``import handler`` finds the archive's own handler package first, as under TorchServe. Each worker loads
and verifies the model before it listens; one that cannot load it says why on one line and exits with
:data:`~serving.python_runtime.plan.EXIT_LOAD_REFUSED`, which the supervisor does not retry.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Awaitable, Callable

from aiohttp import web

from serving.gateway.app import API_KEY_ENV, Gateway, Handler
from serving.gateway.drain import EXIT_MARGIN_S, ShutdownTimes, StopSignals, drain
from serving.gateway.grpc_server import GrpcStartError, start_grpc
from serving.gateway_metrics import GatewayMetrics
from serving.python_runtime.in_process import InProcessBackend, Served
from serving.python_runtime.handler_core import HandlerCore
from serving.python_runtime.metrics import RuntimeMetrics
from serving.python_runtime.plan import EXIT_LOAD_REFUSED, Plan

logger = logging.getLogger("python_runtime")

#: How often a worker checks that its supervisor still runs (a killed supervisor must not leave workers serving).
PARENT_CHECK_S = 1.0


def load(plan: Plan, index: int, metrics: RuntimeMetrics | None) -> dict[str, HandlerCore]:
    """One handler core per served version, artifacts verified; the load times and baselines to the metrics."""
    cores = {}
    for version in plan.versions:
        core = HandlerCore(plan.model, Path(version.model_dir), version.archive_version, version.settings)
        core.warm_up()
        cores[version.version] = core
        if metrics is not None:
            metrics.worker_loaded(f"W-{index}-{plan.model}_{version.version}", core.load_seconds)
            metrics.baseline(version.archive_version, core.baseline())
    return cores


def counted(metrics: RuntimeMetrics) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A middleware counting every answer by status class (TorchServe's Requests2XX / 4XX / 5XX)."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            metrics.response(exc.status)
            raise
        metrics.response(response.status)
        return response
    return middleware


async def watch_parent(signals: StopSignals) -> None:
    """Drain at once (a signal and a second one) when the supervisor is gone."""
    parent = os.getppid()
    while not signals.stop.is_set():
        await asyncio.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            logger.error("the supervisor (pid %d) is gone: stopping", parent)
            signals.request_stop()
            signals.request_stop()


def application(gateway: Gateway, plan: Plan, metrics: RuntimeMetrics | None) -> web.Application:
    app = gateway.app()
    if metrics is not None:
        app.middlewares.insert(0, counted(metrics))
        GatewayMetrics(plan.model, tuple(v.version for v in plan.versions), plan.default_version).time_requests(app)
    return app


async def serve(plan: Plan, cores: dict[str, HandlerCore], metrics: RuntimeMetrics | None) -> int:
    """Listen on the plan's ports until a signal, then drain (serving.gateway.drain)."""
    signals = StopSignals()
    served = Served(plan.model, cores, plan.default_version, plan.max_request_size, plan.response_timeout_s)
    key = os.environ.get(API_KEY_ENV, "").strip() or None
    gateway = Gateway(InProcessBackend(served, plan.max_batch, metrics), key)
    runner = web.AppRunner(application(gateway, plan, metrics), access_log=None, shutdown_timeout=EXIT_MARGIN_S)
    await runner.setup()
    await web.TCPSite(runner, plan.http_host, plan.http_port, reuse_port=True).start()
    grpc_server = None
    if plan.grpc_port is not None:
        try:
            grpc_server = await start_grpc(gateway, plan.http_host, plan.grpc_port, plan.grpc_required, reuse_port=True)
        except GrpcStartError as exc:
            logger.error("%s", exc)
            await runner.cleanup()
            return 2
    # "READY: model <name> answers": the line the runbooks grep for, as the TorchServe image's gateway writes it.
    logger.info("READY: model %s answers: listening on %s:%d%s", plan.model, plan.http_host, plan.http_port,
                f" (Open Inference gRPC on {plan.grpc_port})" if grpc_server is not None else "")
    parent = asyncio.ensure_future(watch_parent(signals))
    await signals.stop.wait()
    times = ShutdownTimes(plan.shutdown_delay_s, plan.termination_grace_s)
    await drain(gateway.drain, None, runner, grpc_server, times, signals.at, (), signals.hurry)
    parent.cancel()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.python_runtime.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--index", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(name)s %(levelname)s [worker {args.index}] %(message)s")
    plan = Plan.read(args.plan)
    metrics = RuntimeMetrics(plan.model) if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else None
    try:
        cores = load(plan, args.index, metrics)
    except Exception as exc:  # tampered artifacts, an unknown profile, handler code this runtime cannot run
        print(f"python_runtime: refusing to load model {plan.model}: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_LOAD_REFUSED
    return asyncio.run(serve(plan, cores, metrics))


if __name__ == "__main__":
    sys.exit(main())
