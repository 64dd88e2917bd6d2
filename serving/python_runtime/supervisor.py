"""The python runtime's PID 1: one worker process per core, the metrics port, and the shutdown.

- starts the workers (:mod:`serving.python_runtime.worker`) in their own sessions, in the directory of the
  archive's code, with the multiprocess metrics directory in their environment;
- serves the workers' summed metrics (:mod:`serving.python_runtime.metrics_page`) on the metrics address;
- restarts a worker that dies (as TorchServe restarts its workers), unless it refused the model
  (:data:`~serving.python_runtime.plan.EXIT_LOAD_REFUSED`: tampered artifacts do not heal) or keeps dying;
  then it stops the others and exits non-zero, so that Kubernetes restarts the container;
- on SIGTERM or SIGINT passes the signal to every worker (each drains, :mod:`serving.gateway.drain`) and waits for
  them within the termination grace period; a second signal is passed on too (it skips the delay).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from serving.gateway.drain import EXIT_MARGIN_S, StopSignals
from serving.python_runtime.metrics_page import MetricsPage
from serving.python_runtime.plan import EXIT_LOAD_REFUSED, Plan

logger = logging.getLogger("python_runtime")

REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.1
#: A worker that died this many times within RESTART_WINDOW_S is not started again.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


@dataclass
class Worker:
    index: int
    process: subprocess.Popen
    restarts: list[float] = field(default_factory=list)


@dataclass
class Supervisor:
    """The workers of one plan (see the module docstring)."""

    plan: Plan
    plan_file: Path
    count: int
    metrics_dir: Path
    workers: list[Worker] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(self.metrics_dir))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        return env

    def spawn(self, index: int) -> subprocess.Popen:
        # The archive's directory is the worker's first import path (-m puts the working directory first).
        return subprocess.Popen([sys.executable, "-m", "serving.python_runtime.worker", "--plan", str(self.plan_file),
                                 "--index", str(index)], cwd=self.plan.code_dir, env=self.environment(),
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def start(self) -> None:
        self.workers = [Worker(index, self.spawn(index)) for index in range(self.count)]

    def exited(self) -> int | None:
        """Restart workers that died; the exit code to end with when one cannot be restarted, else None."""
        for worker in self.workers:
            code = worker.process.poll()
            if code is None:
                continue
            if code == EXIT_LOAD_REFUSED:
                logger.error("worker %d refused the model (see above): stopping", worker.index)
                return 2
            now = time.monotonic()
            worker.restarts = [t for t in worker.restarts if now - t < RESTART_WINDOW_S] + [now]
            if len(worker.restarts) > MAX_RESTARTS:
                logger.error("worker %d died %d times in %.0f s (code %s): stopping", worker.index,
                             len(worker.restarts), RESTART_WINDOW_S, code)
                return 1
            logger.warning("worker %d exited (code %s) without being asked to: starting it again", worker.index, code)
            worker.process = self.spawn(worker.index)
        return None

    def signal_all(self, sig: int) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(sig)

    async def wait_all(self, deadline: float) -> None:
        """Until every worker exited; SIGKILL those left at `deadline`."""
        while any(w.process.poll() is None for w in self.workers) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        for worker in self.workers:
            if worker.process.poll() is None:
                logger.warning("worker %d still running at the end of the grace period: killed", worker.index)
                worker.process.kill()
                worker.process.wait()


async def supervise(supervisor: Supervisor, metrics: MetricsPage | None) -> int:
    """Run the workers until a signal or one that cannot be restarted (see the module docstring)."""
    signals = StopSignals()
    if metrics is not None:
        await metrics.start()
    supervisor.start()
    plan = supervisor.plan
    logger.info("python runtime on %s:%d: %d workers serving %s (versions %s)", plan.http_host, plan.http_port,
                supervisor.count, plan.model, ", ".join(v.version for v in plan.versions))
    code = None
    while code is None and not signals.stop.is_set():
        await asyncio.sleep(POLL_S)
        code = supervisor.exited()
    if code is not None:
        supervisor.signal_all(signal.SIGTERM)
        supervisor.signal_all(signal.SIGTERM)  # the second skips the delay: nothing routes here any more
        await supervisor.wait_all(time.monotonic() + plan.termination_grace_s - EXIT_MARGIN_S)
    else:
        supervisor.signal_all(signal.SIGTERM)
        hurried = asyncio.ensure_future(_pass_on_hurry(signals, supervisor))
        await supervisor.wait_all(signals.at + plan.termination_grace_s - EXIT_MARGIN_S)
        hurried.cancel()
        logger.info("stopped %.1f s after the signal", time.monotonic() - signals.at)
    if metrics is not None:
        await metrics.stop()
    return code or 0


async def _pass_on_hurry(signals: StopSignals, supervisor: Supervisor) -> None:
    await signals.hurry.wait()
    supervisor.signal_all(signal.SIGTERM)
