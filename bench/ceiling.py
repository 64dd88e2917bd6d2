"""The in-process ceiling: `EmbeddingService.answer` on PNG bytes with no server in the way.

Same model, index and preprocessing as the served .mar, same thread budget as the server: either
2 processes x 1 torch thread (what the shipped 2 workers x 1 thread get) or 1 process x 2 threads.
Each process answers consecutive batches of request images for a fixed time; images/s is the sum
over processes of images answered / time spent answering.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .stats import mid, summarize

Log = Callable[[str], None]
START_MARGIN_S = 0.3


def _worker(artifacts: Path, threads: int, images: Sequence[bytes], conn: Connection) -> None:
    import faiss
    import torch

    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    from handler.service import EmbeddingService

    service = EmbeddingService.from_dir(artifacts)
    service.answer(list(images[:8]))
    conn.send("ready")
    while (command := conn.recv()) is not None:
        batch, start_at, duration = command
        time.sleep(max(0.0, start_at - time.time()))
        done, position, batch_seconds = 0, 0, []
        began = time.perf_counter()
        while time.perf_counter() - began < duration:
            payloads = [images[(position + i) % len(images)] for i in range(batch)]
            position += batch
            started = time.perf_counter()
            service.answer(payloads)
            batch_seconds.append(time.perf_counter() - started)
            done += batch
        conn.send({"images": done, "seconds": time.perf_counter() - began, "batch_seconds": batch_seconds})


def measure(artifacts: Path, images: Sequence[bytes], processes: int, threads: int, batches: Sequence[int],
            trials: int, duration_s: float, log: Log = print) -> list[dict[str, Any]]:
    """Rows of images/s (and batch latency) per batch size for one process x thread layout."""
    ctx = mp.get_context("spawn")
    conns, procs = [], []
    try:
        for _ in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(artifacts, threads, list(images), child), daemon=True)
            proc.start()
            conns.append(parent)
            procs.append(proc)
        for conn in conns:
            if not conn.poll(300) or conn.recv() != "ready":
                raise RuntimeError("ceiling worker failed to load the service")
        rows = []
        for batch in batches:
            rates, batch_ms = [], []
            for _ in range(trials):
                start_at = time.time() + START_MARGIN_S
                for conn in conns:
                    conn.send((batch, start_at, duration_s))
                results = [conn.recv() for conn in conns]
                rates.append(sum(r["images"] / r["seconds"] for r in results))
                times = sorted(t for r in results for t in r["batch_seconds"])
                batch_ms.append(1e3 * times[len(times) // 2])
            row: dict[str, Any] = {"layout": f"{processes}x{threads}", "processes": processes, "threads": threads, "batch": batch,
                   "images_per_s": summarize(rates), "batch_ms_p50": summarize(batch_ms)}
            rows.append(row)
            log(f"  ceiling {processes}x{threads} batch {batch:<4d} {mid(row['images_per_s']):8.1f} images/s  "
                f"batch p50 {mid(row['batch_ms_p50']):.2f} ms")
        return rows
    finally:
        for conn in conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
