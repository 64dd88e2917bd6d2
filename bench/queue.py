"""python -m bench queue: requests/s and latency through the queue vs direct REST.

Both modes keep the same number of requests in flight (--concurrency caller threads) against the
same running TorchServe, and both call it with the same client (EmbeddingClient over REST, keep-alive).
The queue mode starts its own bridges (--bridges) on a private queue and deletes that queue
afterwards; the broker must be running (scripts/rabbitmq.sh start). CPU per request is reported for
the calling process and, through the queue, for the bridges (the broker's and TorchServe's are not).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psutil

from cli_common import Parser, UsageError, input_file, positive_int
from settings import REPO

from queue_bridge.backend import ModelBackend, Outcome, TokenSource, default_inference_url, default_model
from queue_bridge.broker import Topology, amqp_url, connect
from queue_bridge.client import QueueClient


@dataclass(frozen=True)
class Figures:
    mode: str
    requests: int
    concurrency: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    caller_cpu_ms: float  # CPU of this process (callers, HTTP or AMQP client) per request
    bridge_cpu_ms: float | None = None  # CPU of the bridge processes per request


def measure(mode: str, call: Callable[[bytes], dict], images: Sequence[bytes], requests: int,
            concurrency: int) -> Figures:
    """Run `requests` calls with `concurrency` threads (after a warm-up of 2 x concurrency calls)."""
    def timed(i: int) -> tuple[float, bool]:
        started = time.perf_counter()
        answer = call(images[i % len(images)])
        return time.perf_counter() - started, "error" in answer

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(timed, range(2 * concurrency)))
        started, cpu = time.perf_counter(), time.process_time()
        results = list(pool.map(timed, range(requests)))
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    latencies = sorted(r[0] for r in results)
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return Figures(mode, requests, concurrency, sum(r[1] for r in results), round(seconds, 2),
                   round(requests / seconds, 1), round(cuts[49] * 1000, 1), round(cuts[98] * 1000, 1),
                   round(cpu / requests * 1000, 2))


def _cpu(processes: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)  # user + system


def _answer(outcome: Outcome) -> dict:
    return outcome.answer if outcome.answer is not None else {"error": outcome.retry}


def start_bridges(n: int, url: str, queue: str, inference_url: str, key_file: Path | None,
                  prefetch: int) -> list[subprocess.Popen]:
    cmd = [sys.executable, "-m", "queue_bridge", "--url", url, "--queue", queue, "serve",
           "--inference-url", inference_url, "--prefetch", str(prefetch)]
    if key_file:
        cmd += ["--key-file", str(key_file)]
    return [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]


def wait_consumers(url: str, queue: str, n: int, timeout: float = 30.0) -> None:
    connection = connect(url, "queue-bench")
    try:
        channel = connection.channel()
        Topology(queue).declare(channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if channel.queue_declare(queue, passive=True).method.consumer_count >= n:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{n} bridges did not start consuming {queue} within {timeout:.0f}s")
    finally:
        connection.close()


def delete_topology(url: str, topology: Topology) -> None:
    connection = connect(url, "queue-bench")
    try:
        channel = connection.channel()
        channel.queue_delete(topology.queue)
        channel.queue_delete(topology.dead_letter_queue)
        channel.exchange_delete(topology.dead_letter_exchange)
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench queue", description=__doc__)
    p.add_argument("--url", help="AMQP URL (default: $EMBEDDING_AMQP_URL, else the local broker)")
    p.add_argument("--inference-url", help="TorchServe inference address (default: config.properties)")
    p.add_argument("--key-file", type=Path, help="TorchServe key_file.json (default: key_file.json of the repo)")
    p.add_argument("--images", type=Path, nargs="+", metavar="IMAGE",
                   help="images to send, in turn (default: samples/digit_*.png)")
    p.add_argument("--requests", type=positive_int, default=400, help="requests per mode")
    p.add_argument("--concurrency", type=positive_int, default=16, help="requests in flight")
    p.add_argument("--bridges", type=positive_int, default=1, help="bridge processes in the queue mode")
    p.add_argument("--prefetch", type=positive_int, default=16, help="requests in flight per bridge")
    args = p.parse_args(argv)
    paths = args.images or sorted((REPO / "samples").glob("digit_*.png"))
    if not paths:
        p.error("no images: pass --images or write samples with python -m serving samples")
    try:
        images = [input_file(path, "--images").read_bytes() for path in paths]
    except UsageError as exc:
        p.error(str(exc))
    url = amqp_url(args.url)
    inference_url = args.inference_url or default_inference_url()
    backend = ModelBackend(inference_url, default_model(), TokenSource(key_file=args.key_file))
    try:
        results = [measure("direct REST", lambda image: _answer(backend(image)), images, args.requests,
                           args.concurrency)]
    finally:
        backend.close()
    topology = Topology(f"embedding.bench.{uuid.uuid4().hex[:8]}")
    bridges = start_bridges(args.bridges, url, topology.queue, inference_url, args.key_file, args.prefetch)
    try:
        wait_consumers(url, topology.queue, args.bridges)
        processes = [psutil.Process(bridge.pid) for bridge in bridges]
        with QueueClient(url, topology.queue) as client:
            before = _cpu(processes)
            figures = measure(f"queue ({args.bridges} bridge{'s' * (args.bridges > 1)})",
                              lambda image: client(image, timeout=60.0), images, args.requests, args.concurrency)
            per_request = (_cpu(processes) - before) / (args.requests + 2 * args.concurrency) * 1000
            results.append(replace(figures, bridge_cpu_ms=round(per_request, 2)))
    finally:
        for bridge in bridges:
            bridge.send_signal(signal.SIGTERM)
        for bridge in bridges:
            bridge.wait(30)
        delete_topology(url, topology)
    print(f"{'mode':<20} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'CPU ms/req':>16}   "
          f"({args.requests} requests, {args.concurrency} in flight, {os.cpu_count()} CPUs)")
    for r in results:
        cpu = f"{r.caller_cpu_ms}" + (f" + {r.bridge_cpu_ms}" if r.bridge_cpu_ms is not None else "")
        print(f"{r.mode:<20} {r.rps:>8} {r.p50_ms:>8} {r.p99_ms:>8} {r.errors:>7} {cpu:>16}")
    print(json.dumps([asdict(r) for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
