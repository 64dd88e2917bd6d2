"""gRPC load: a pool of Python processes, each an asyncio closed loop over TorchServe's Predictions RPC.

The stubs come from the project's `client` package (generated from the installed TorchServe jar).
Processes are started once per server and reused for every trial; each process measures its own CPU
with psutil over the trial window and reports per-request latencies, so the generator's cost shows
up in the report next to the server's.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any, Self

import numpy as np

from .stats import percentiles_ms

START_MARGIN_S = 0.3


class GrpcUnavailable(RuntimeError):
    """The gRPC stubs cannot be loaded (the `client` package is missing or failed)."""


def load_stubs() -> Any:
    """`client.protos.load()`: inference_pb2 / inference_pb2_grpc for the installed TorchServe."""
    try:
        from client.protos import load
    except ImportError as exc:
        raise GrpcUnavailable(f"the client package's gRPC stubs are not importable: {exc}") from None
    try:
        return load()
    except Exception as exc:  # StubError or a protobuf/grpc import problem: report, do not crash the run
        raise GrpcUnavailable(f"client.protos.load() failed: {exc}") from None


async def _closed_loop(stub: Any, requests: list, metadata: tuple | None, concurrency: int, start_at: float,
                       duration: float) -> tuple[list[float], dict[str, int]]:
    import grpc

    latencies: list[float] = []
    errors: dict[str, int] = {}
    deadline = start_at + duration

    async def one(offset: int) -> None:
        i = offset
        while True:
            now = time.time()
            if now >= deadline:
                return
            started = time.perf_counter()
            try:
                await stub.Predictions(requests[i % len(requests)], metadata=metadata, timeout=10)
                if time.time() <= deadline:
                    latencies.append(time.perf_counter() - started)
            except grpc.aio.AioRpcError as exc:
                errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
            i += concurrency

    await asyncio.sleep(max(0.0, start_at - time.time()))
    await asyncio.gather(*(one(k) for k in range(concurrency)))
    return latencies, errors


def _worker(port: int, token: str | None, model: str, bodies: Sequence[bytes], conn: Connection) -> None:
    import grpc
    import psutil

    stubs = load_stubs()
    me = psutil.Process()

    async def serve() -> None:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        requests = [stubs.inference_pb2.PredictionsRequest(model_name=model, input={"data": b}) for b in bodies]
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        await stub.Predictions(requests[0], metadata=metadata, timeout=30)
        conn.send(("ready", os.getpid()))
        loop = asyncio.get_running_loop()
        while True:
            command = await loop.run_in_executor(None, conn.recv)
            if command is None:
                break
            concurrency, start_at, duration = command
            await asyncio.sleep(max(0.0, start_at - time.time()))
            cpu0 = sum(me.cpu_times()[:2])
            latencies, errors = await _closed_loop(stub, requests, metadata, concurrency, start_at, duration)
            cpu = sum(me.cpu_times()[:2]) - cpu0
            conn.send(("result", {"latencies": latencies, "errors": errors, "cpu_s": cpu}))
        await channel.close()

    try:
        asyncio.run(serve())
    except Exception as exc:  # surfaced to the parent as a failed start or trial
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class GrpcLoad:
    """`processes` load processes against one TorchServe; `run(c, s)` is one closed-loop trial."""

    def __init__(self, port: int, token: str | None, model: str, bodies: Sequence[bytes], processes: int = 2,
                 timeout: float = 60.0) -> None:
        load_stubs()  # fail early, in the parent, with the stub error
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for _ in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(port, token, model, list(bodies), child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            if not conn.poll(timeout):
                self.close()
                raise GrpcUnavailable("gRPC load process did not become ready")
            kind, payload = conn.recv()
            if kind != "ready":
                self.close()
                raise GrpcUnavailable(f"gRPC load process failed: {payload}")

    def run(self, concurrency: int, duration_s: float) -> dict[str, Any]:
        shares = [concurrency // len(self.conns) + (1 if i < concurrency % len(self.conns) else 0)
                  for i in range(len(self.conns))]
        start_at = time.time() + START_MARGIN_S
        active = [(conn, share) for conn, share in zip(self.conns, shares) if share > 0]
        for conn, share in active:
            conn.send((share, start_at, duration_s))
        latencies: list[float] = []
        errors: dict[str, int] = {}
        cpu = 0.0
        for conn, _ in active:
            if not conn.poll(duration_s + 60):
                raise RuntimeError("gRPC load process did not report")
            kind, payload = conn.recv()
            if kind != "result":
                raise RuntimeError(f"gRPC load process failed: {payload}")
            latencies += payload["latencies"]
            cpu += payload["cpu_s"]
            for code, count in payload["errors"].items():
                errors[code] = errors.get(code, 0) + count
        pct = percentiles_ms(latencies)
        return {
            "requests": len(latencies),
            "seconds": duration_s,
            "throughput": len(latencies) / duration_s,
            "errors": int(sum(errors.values())),
            "error_kinds": errors,
            "mean_ms": float(np.mean(latencies) * 1e3) if latencies else None,
            "p50_ms": pct["p50"],
            "p90_ms": pct["p90"],
            "p99_ms": pct["p99"],
            "max_ms": float(max(latencies) * 1e3) if latencies else None,
            "loadgen_cpu_pct": 100.0 * cpu / duration_s,
            "loadgen_processes": len(active),
        }

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
