"""The serving image's PID 1 with TorchServe: its process group, the listeners in front of it, and the shutdown.

Serves until a signal (then drains, :func:`serving.gateway.drain.drain`, and gives TorchServe the rest of the
grace period) or until TorchServe or nginx exits on its own: then it exits non-zero, so that Kubernetes restarts
the container instead of keeping a pod that answers nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web

from serving.gateway.app import Gateway
from serving.gateway.drain import BACKEND_STOP_S, EXIT_MARGIN_S, ShutdownTimes, StopSignals, drain
from serving.gateway.grpc_server import GrpcStartError, start_grpc
from serving.kserve_runtime.nginx_front import Front, FrontError, FrontSettings
from serving.torchserve_env import torchserve_environment
from settings import LOG_CONFIG_FILE

logger = logging.getLogger("kserve_runtime")

#: How long processes of TorchServe's group may outlive its launcher after shutdown before they are killed.
LEFTOVER_S = 2.0
#: Seconds between the readiness checks whose changes go to the log (log_readiness).
READY_POLL_S = 1.0


def start_torchserve(model_store: str, ts_config: str) -> subprocess.Popen:
    """``torchserve --foreground`` as a session leader (its group is stopped as one), this environment's launcher
    first."""
    beside = Path(sys.executable).with_name("torchserve")
    launcher = str(beside) if beside.is_file() else "torchserve"
    return subprocess.Popen([launcher, "--foreground", "--ncs", "--model-store", model_store,
                             "--ts-config", ts_config, "--log-config", str(LOG_CONFIG_FILE)],
                            start_new_session=True, env=torchserve_environment(os.environ))


async def serve(gateway: Gateway, server: subprocess.Popen, host: str, port: int, times: ShutdownTimes,
                grpc_port: int | None = None, grpc_required: bool = False,
                front: FrontSettings | None = None) -> int:
    """Serve until a signal or TorchServe's (or nginx's) exit; `front`: nginx listens on `host`:`port` and the
    gateway on loopback at ``front.gateway_port``."""
    loop = asyncio.get_running_loop()
    signals = StopSignals()
    runner = web.AppRunner(gateway.app(), access_log=None, shutdown_timeout=EXIT_MARGIN_S)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1" if front else host, front.gateway_port if front else port,
                      reuse_address=True).start()
    grpc_server = nginx = None
    try:
        if front is not None:
            nginx = Front.start(front, dict(os.environ))
            await nginx.wait_started()
            gateway.front = nginx
        if grpc_port is not None:
            grpc_server = await start_grpc(gateway, host, grpc_port, grpc_required)
    except (GrpcStartError, FrontError) as exc:
        logger.error("%s", exc)
        if nginx is not None:
            await nginx.shut(EXIT_MARGIN_S)
        await runner.cleanup()
        await loop.run_in_executor(None, stop_group, server, BACKEND_STOP_S)
        return 2
    logger.info("%s on %s:%d%s -> TorchServe %s (model %s, auth %s)", "nginx front" if nginx else "gateway",
                host, port, f" (Open Inference gRPC on {grpc_port})" if grpc_server is not None else "",
                gateway.backend.inference, gateway.backend.model, "bearer key" if gateway.api_key else "OFF")
    readiness = asyncio.ensure_future(log_readiness(gateway))
    exited = loop.run_in_executor(None, server.wait)
    watched = {exited}
    if nginx is not None:
        watched.add(loop.run_in_executor(None, nginx.process.wait))
    stopping = asyncio.ensure_future(signals.stop.wait())
    await asyncio.wait({*watched, stopping}, return_when=asyncio.FIRST_COMPLETED)
    readiness.cancel()
    if any(w.done() for w in watched) and not signals.stop.is_set():
        stopping.cancel()
        what, code = ("TorchServe", exited.result()) if exited.done() else ("nginx", nginx.process.returncode)
        logger.error("%s exited (code %s) without being asked to: exiting so the pod is restarted", what, code)
        if grpc_server is not None:
            await grpc_server.stop(grace=EXIT_MARGIN_S)
        if nginx is not None:
            await nginx.shut(EXIT_MARGIN_S)
        await runner.cleanup()
        await loop.run_in_executor(None, stop_group, server, BACKEND_STOP_S)
        return code or 1
    started = signals.at
    await drain(gateway.drain, gateway.front, runner, grpc_server, times, started, {exited}, signals.hurry)
    remaining = started + times.grace - EXIT_MARGIN_S - time.monotonic()
    logger.info("stopping TorchServe (%.0f s left of the grace period)", remaining)
    await loop.run_in_executor(None, stop_group, server, max(remaining, LEFTOVER_S))
    logger.info("stopped %.1f s after the signal", time.monotonic() - started)
    return 0


async def log_readiness(gateway: Gateway, interval_s: float = READY_POLL_S) -> None:
    """One line in the pod's log each time the model's readiness (the readiness probe's answer) changes."""
    ready = False
    while True:
        now = await gateway.model_is_ready()
        if now != ready:
            model = gateway.backend.model
            logger.info("READY: model %s answers" if now else "NOT READY: model %s does not answer", model)
        ready = now
        await asyncio.sleep(interval_s)


def stop_group(server: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM TorchServe's process group (launcher, Java, workers), SIGKILL what is left after the grace period.

    Java may restart a worker that the first SIGTERM stopped before Java itself exits; that late worker never
    got the signal. So once the launcher is gone, what remains of the group gets SIGTERM again and, after
    LEFTOVER_S, SIGKILL, instead of holding the pod for the whole grace period.
    """
    group = server.pid  # started as a session leader
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    launcher_gone = None
    while time.monotonic() < deadline:
        reap()
        if not _signal_group(group, 0):
            return
        if server.poll() is not None:
            if launcher_gone is None:
                launcher_gone = time.monotonic()
                _signal_group(group, signal.SIGTERM)
            elif time.monotonic() - launcher_gone > LEFTOVER_S:
                break
        time.sleep(0.1)
    _signal_group(group, signal.SIGKILL)
    reap()


def _signal_group(group: int, sig: int) -> bool:
    """Send `sig` to the process group; False when no process of it is left."""
    try:
        os.killpg(group, sig)
        return True
    except ProcessLookupError:
        return False


def reap() -> None:
    """As PID 1, collect exited orphans (TorchServe's Java outlives its launcher when the launcher dies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
