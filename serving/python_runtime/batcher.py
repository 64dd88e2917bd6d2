"""Dynamic batching that never waits: a batch is whatever queued while the previous one ran.

Requests queue on the event loop; one task takes every queued request of one model version (up to the
archive's batchSize) and answers them in one call on a single worker thread, so the event loop keeps reading
and answering sockets meanwhile. A lone request starts at once: there is no batch delay (TorchServe's
maxBatchDelay is a wait for company that, on a busy server, the previous batch's run already provides).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

logger = logging.getLogger("python_runtime")


@dataclass
class Job:
    """One queued request: its version, its row, and when it arrived and its batch started (perf_counter)."""

    version: str
    row: Any
    arrived: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    future: "asyncio.Future[Any]" = field(default_factory=lambda: asyncio.get_running_loop().create_future())


#: Answers a batch of one version: (version, rows) -> one result per row, in order.
Answerer = Callable[[str, Sequence[Any]], Sequence[Any]]
#: What a job gets when its batch raised: (version, the exception) -> the result.
Failure = Callable[[str, BaseException], Any]


class Batcher:
    """Queues jobs and answers them in batches on one worker thread (see the module docstring)."""

    def __init__(self, answer: Answerer, on_failure: Failure, max_batch: int) -> None:
        self.answer = answer
        self.on_failure = on_failure
        self.max_batch = max(max_batch, 1)
        self.pending: deque[Job] = deque()
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, job: Job) -> Any:
        """Queue `job` and wait for its result."""
        self.pending.append(job)
        self._arrived.set()
        return await job.future

    def _take(self) -> list[Job]:
        """Up to max_batch queued jobs of the first job's version, in arrival order; the others stay queued."""
        version = self.pending[0].version
        batch: list[Job] = []
        kept: deque[Job] = deque()
        while self.pending and len(batch) < self.max_batch:
            job = self.pending.popleft()
            (batch if job.version == version else kept).append(job)
        kept.extend(self.pending)
        self.pending = kept
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.pending:
                self._arrived.clear()
                await self._arrived.wait()
            batch = self._take()
            started = time.perf_counter()
            for job in batch:
                job.started = started
            try:
                results = await loop.run_in_executor(self._executor, self.answer, batch[0].version,
                                                     [job.row for job in batch])
            except Exception as exc:  # a bug, not bad input: fail this batch's requests, keep serving
                logger.exception("batch of %d requests failed", len(batch))
                results = [self.on_failure(batch[0].version, exc)] * len(batch)
            for job, result in zip(batch, results):
                if not job.future.done():
                    job.future.set_result(result)
