"""Peer servers around the same `EmbeddingService`: LitServe, and FastAPI + uvicorn.

Both take the raw PNG body on ``POST /predictions/embedding`` (what TorchServe gets) and use the
same workers x threads and batching as TorchServe's shipped configuration (model-config.yaml).

- LitServe: its own batching (``max_batch_size``, ``batch_timeout``), ``workers_per_device`` inference
  processes, its default number of API-server processes (one per inference worker) and ZeroMQ
  ``fast_queue``.
- FastAPI + uvicorn: ``--workers`` processes, each with a small asyncio micro-batcher that gathers
  requests for up to ``max_batch`` items or ``delay`` after the first and runs one
  `EmbeddingService.answer` per batch on a single executor thread (the event loop keeps accepting).

Neither checks a token: TorchServe's bearer check is the only auth on the loopback.
The LitServe server lives in `bench.litserve_app` (its API class must be importable by LitServe's
worker processes).
"""

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PATH = "/predictions/embedding"


@dataclass(frozen=True)
class PeerConfig:
    name: str
    workers: int = 2
    threads: int = 1
    max_batch: int = 8
    batch_delay_ms: float = 5.0

    @property
    def label(self) -> str:
        batching = (f"batch {self.max_batch}/{self.batch_delay_ms:g} ms" if self.max_batch > 1 else "no batching")
        how = {"litserve": "LitServe batching", "fastapi": "asyncio micro-batcher"}.get(self.name, "")
        return f"{self.workers}x{self.threads}, {batching} ({how})"


def load_service(artifacts: Path, threads: int) -> Any:
    import torch

    torch.set_num_threads(threads)
    from handler.service import EmbeddingService

    return EmbeddingService.from_dir(artifacts)


class MicroBatcher:
    """Gathers concurrent requests into one call of `answer` (max_batch items, or delay after the first)."""

    def __init__(self, answer: Callable[[list], tuple[list, Any]], max_batch: int, delay_s: float) -> None:
        self.answer = answer
        self.max_batch = max_batch
        self.delay_s = delay_s
        self.queue: asyncio.Queue = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1)

    async def submit(self, payload: bytes) -> dict:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((payload, future))
        return await future

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = [await self.queue.get()]
            deadline = loop.time() + self.delay_s
            while len(items) < self.max_batch:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    items.append(await asyncio.wait_for(self.queue.get(), remaining))
                except TimeoutError:
                    break
            try:
                answers, _ = await loop.run_in_executor(self.executor, self.answer, [p for p, _ in items])
            except Exception as exc:  # a failed batch fails its requests, not the server
                answers = [{"error": f"internal error: {exc}", "status": 500}] * len(items)
            for (_, future), answer in zip(items, answers):
                if not future.done():
                    future.set_result(answer)


def create_fastapi_app() -> Any:
    """uvicorn factory (``--factory``); settings come from BENCH_* environment variables."""
    from fastapi import FastAPI, Request, Response

    service = load_service(Path(os.environ["BENCH_ARTIFACTS"]), int(os.environ.get("BENCH_THREADS", "1")))
    max_batch = int(os.environ.get("BENCH_MAX_BATCH", "8"))
    delay_s = float(os.environ.get("BENCH_BATCH_DELAY_MS", "5")) / 1e3

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher = MicroBatcher(service.answer, max_batch, delay_s)
        task = asyncio.create_task(batcher.run())
        app.state.batcher = batcher
        yield
        task.cancel()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.post(PATH)
    async def predict(request: Request) -> Response:
        answer = await request.app.state.batcher.submit(await request.body())
        status = int(answer.get("status", 500)) if "error" in answer else 200
        return Response(json.dumps(answer), status_code=status, media_type="application/json")

    return app


def launch(cfg: PeerConfig, artifacts: Path, port: int, log_file: Path) -> subprocess.Popen:
    """Start a peer server in its own process group (stopped with `procs.stop_group`)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(cfg.threads), MKL_NUM_THREADS=str(cfg.threads),
               BENCH_ARTIFACTS=str(artifacts), BENCH_THREADS=str(cfg.threads), BENCH_MAX_BATCH=str(cfg.max_batch),
               BENCH_BATCH_DELAY_MS=str(cfg.batch_delay_ms))
    if cfg.name == "fastapi":
        cmd = [sys.executable, "-m", "uvicorn", "bench.peers:create_fastapi_app", "--factory", "--host", "127.0.0.1",
               "--port", str(port), "--workers", str(cfg.workers), "--log-level", "warning", "--no-access-log"]
    elif cfg.name == "litserve":
        cmd = [sys.executable, "-m", "bench.litserve_app", "--artifacts", str(artifacts), "--port", str(port),
               "--workers", str(cfg.workers), "--threads", str(cfg.threads), "--max-batch", str(cfg.max_batch),
               "--batch-delay-ms", str(cfg.batch_delay_ms)]
    else:
        raise ValueError(f"unknown peer {cfg.name!r}")
    with open(log_file, "ab") as log:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def wait_ready(proc: subprocess.Popen, url: str, body: bytes, log_file: Path, timeout: float = 120.0) -> float:
    """Seconds until a real prediction succeeds (both frameworks answer health checks before the model is up)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            tail = log_file.read_text(errors="replace")[-600:] if log_file.exists() else ""
            raise RuntimeError(f"peer server exited with {proc.returncode}: {tail}")
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/octet-stream"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"peer server not answering {url} after {timeout:.0f}s")
