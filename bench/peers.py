"""Peer servers around the same `EmbeddingService`: LitServe, FastAPI + uvicorn, and the project's own python runtime.

Both take the raw PNG body on ``POST /predictions/embedding`` (what TorchServe gets) and use the
same workers x threads and batching as TorchServe's shipped configuration (model-config.yaml), so on
the 2-core machine each runs 2 model processes x 1 torch thread (OMP_NUM_THREADS=1), each loading
the model.

- LitServe (`bench.litserve_app`): its own batching (``max_batch_size``, ``batch_timeout``),
  ``workers_per_device`` inference processes, ``num_api_servers`` HTTP processes (one per inference
  worker, LitServe's documented default, set explicitly) and ZeroMQ ``fast_queue``.
- FastAPI + uvicorn (`bench.fastapi_app`): ``workers`` uvicorn processes, each on its own
  ``SO_REUSEPORT`` socket (uvicorn's ``--workers`` shares one socket and left one worker with every
  connection at c=16; see that module), each with a small asyncio micro-batcher that gathers
  requests for up to ``max_batch`` items or ``delay`` after the first and runs one
  `EmbeddingService.answer` per batch on a single executor thread (the event loop keeps accepting).
- the python runtime (`python -m serving.python_runtime`): the same .mar as TorchServe's (built here from the
  artifacts), ``workers`` processes each serving HTTP on its own ``SO_REUSEPORT`` socket with the handler core in
  process and a batcher that never waits (up to ``max_batch`` requests; ``delay`` is not used), behind the KServe
  gateway and its bearer key, like TorchServe behind its token.

`PeerTree` measures the CPU of a peer's whole process tree per trial, per process (labelled by
role) and for the whole machine, and `cpu_verdict` says from those figures whether the peer used
both cores under load and, if not, why.

LitServe and FastAPI check no token; the python runtime checks its key (`PeerConfig.key`), as TorchServe does.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from .procs import ProcessTree
from .stats import median, summarize

REPO = Path(__file__).resolve().parent.parent
PATH = "/predictions/embedding"
#: The project's second runtime, measured as a peer of TorchServe's.
PYTHON_RUNTIME = "python"


@dataclass(frozen=True)
class PeerConfig:
    name: str
    workers: int = 2
    threads: int = 1
    max_batch: int = 8
    batch_delay_ms: float = 5.0
    #: The bearer key the server checks (the python runtime's INFERENCE_API_KEY); None: it checks none.
    key: str | None = None

    @property
    def label(self) -> str:
        if self.name == PYTHON_RUNTIME:
            return f"{self.workers}x{self.threads}, batch {self.max_batch}/never waits (the .mar, python runtime)"
        batching = (f"batch {self.max_batch}/{self.batch_delay_ms:g} ms" if self.max_batch > 1 else "no batching")
        how = {"litserve": "LitServe batching", "fastapi": "asyncio micro-batcher"}.get(self.name, "")
        return f"{self.workers}x{self.threads}, {batching} ({how})"

    @property
    def own_sockets(self) -> int:
        """Processes that must each listen on the port before the server counts as ready (0: not checked).

        FastAPI's workers each bind their own socket and one that is not listening yet gets no connections, so
        a load started early would land on the first worker alone. LitServe's API servers share one socket.
        """
        return self.workers if self.name in ("fastapi", PYTHON_RUNTIME) else 0


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
        cmd = [sys.executable, "-m", "bench.fastapi_app", "--host", "127.0.0.1", "--port", str(port),
               "--workers", str(cfg.workers)]
    elif cfg.name == PYTHON_RUNTIME:
        cmd = python_runtime_command(artifacts, port, cfg, log_file.parent)
        env["INFERENCE_API_KEY"] = cfg.key or ""
    elif cfg.name == "litserve":
        cmd = [sys.executable, "-m", "bench.litserve_app", "--artifacts", str(artifacts), "--port", str(port),
               "--workers", str(cfg.workers), "--api-servers", str(cfg.workers), "--threads", str(cfg.threads),
               "--max-batch", str(cfg.max_batch), "--batch-delay-ms", str(cfg.batch_delay_ms)]
    else:
        raise ValueError(f"unknown peer {cfg.name!r}")
    with open(log_file, "ab") as log:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def python_runtime_command(artifacts: Path, port: int, cfg: PeerConfig, workdir: Path) -> list[str]:
    """`python -m serving.python_runtime` serving the .mar of `artifacts` (built into `workdir` as ./archive.sh
    builds it) with the repo's config.properties on private loopback ports, `cfg.workers` workers and no gRPC."""
    from serving.archive import build_mar
    from serving.server import free_ports
    from settings import CONFIG_FILE, read_properties, with_ports, write_properties

    store = workdir / "python-runtime-store"
    mar = build_mar(artifacts, store)
    config = store / "config.properties"
    write_properties(with_ports(read_properties(CONFIG_FILE), *free_ports(5)), config)
    return [sys.executable, "-m", "serving.python_runtime", "--mar", str(mar), "--ts-config", str(config),
            "--http-host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "0", "--workers", str(cfg.workers)]


def listening_processes(root_pid: int, port: int) -> int:
    """Processes in `root_pid`'s tree with a socket listening on `port` (a shared socket counts in each holder)."""
    count = 0
    for proc in ProcessTree(root_pid).processes():
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in proc.net_connections("tcp")):
                count += 1
        except psutil.Error:
            pass
    return count


def wait_ready(proc: subprocess.Popen, url: str, body: bytes, log_file: Path, timeout: float = 120.0,
               own_sockets: int = 0, key: str | None = None) -> float:
    """Seconds until a real prediction succeeds (both frameworks answer health checks before the model is up)
    and, with `own_sockets`, until that many processes of the server listen on the port."""
    started = time.monotonic()
    port = urllib.parse.urlsplit(url).port
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            tail = log_file.read_text(errors="replace")[-600:] if log_file.exists() else ""
            raise RuntimeError(f"peer server exited with {proc.returncode}: {tail}")
        if own_sockets and port and listening_processes(proc.pid, port) < own_sockets:
            time.sleep(0.3)
            continue
        headers = {"Content-Type": "application/octet-stream", **({"Authorization": f"Bearer {key}"} if key else {})}
        request = urllib.request.Request(url, data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"peer server not answering {url} after {timeout:.0f}s")


# CPU per process and for the whole machine, and what it says about a peer under load.

#: A process at or above this CPU (100% = one core) ran flat out for the trial: it was short of CPU, not waiting.
WHOLE_CORE_PCT = 85.0
#: Other work on the machine (not the server, not the load generator) worth naming as a reason.
OTHERS_PCT = 10.0


def label_processes(peer: str, root_pid: int, procs: Iterable[Any]) -> dict[int, str]:
    """pid -> role of each process in a peer's tree, numbered by start time where a role has several processes.

    FastAPI: supervisor, worker (``--worker-index``), resource tracker. The python runtime: supervisor, worker
    (``serving.python_runtime.worker``). LitServe 0.2: main, manager (forked
    before the inference workers), inference worker (spawned), API server (forked after them), resource
    tracker. `procs` are psutil.Process-like objects (pid, cmdline(), create_time()).
    """
    from .fastapi_app import WORKER_FLAG

    info = []
    for proc in procs:
        try:
            info.append((proc.pid, " ".join(proc.cmdline()), proc.create_time()))
        except psutil.Error:
            pass
    root_cmd = next((cmd for pid, cmd, _ in info if pid == root_pid), None)
    first_spawned = min((t for _, cmd, t in info if "multiprocessing.spawn" in cmd), default=float("inf"))

    def role(pid: int, cmd: str, started: float) -> str:
        if pid == root_pid:
            return "supervisor" if peer in ("fastapi", PYTHON_RUNTIME) else "main"
        if "resource_tracker" in cmd:
            return "resource tracker"
        if (peer == "fastapi" and WORKER_FLAG in cmd) or (peer == PYTHON_RUNTIME and "python_runtime.worker" in cmd):
            return "worker"
        if peer == "litserve" and "multiprocessing.spawn" in cmd:
            return "inference worker"
        if peer == "litserve" and cmd == root_cmd:
            return "manager" if started < first_spawned else "API server"
        return "other"

    roles = sorted(((role(pid, cmd, t), t, pid) for pid, cmd, t in info), key=lambda r: (r[0], r[1], r[2]))
    counts: dict[str, int] = {}
    for name, _, _ in roles:
        counts[name] = counts.get(name, 0) + 1
    labels, seen = {}, {}
    for name, _, pid in roles:
        seen[name] = seen.get(name, 0) + 1
        labels[pid] = f"{name} {seen[name]}" if counts[name] > 1 else name
    return labels


def machine_cpu(before: Any, after: Any, seconds: float) -> dict[str, float]:
    """The whole machine's busy CPU between two psutil.cpu_times() (100% = one core), and the hypervisor's steal."""
    def busy(t: Any) -> float:
        return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))

    return {"machine_busy_pct": 100.0 * (busy(after) - busy(before)) / seconds,
            "machine_steal_pct": 100.0 * (getattr(after, "steal", 0.0) - getattr(before, "steal", 0.0)) / seconds}


class PeerTree(ProcessTree):
    """A peer's process tree whose every measured window (one per trial) also keeps each process's CPU by role
    and the whole machine's CPU, in `windows`, in the order the windows were measured."""

    def __init__(self, root_pid: int, peer: str) -> None:
        super().__init__(root_pid)
        self.peer = peer
        self.windows: list[dict[str, Any]] = []
        self._machine_before: Any = None

    def role(self, proc: psutil.Process) -> str:
        """`proc`'s label (for `memory`)."""
        return label_processes(self.peer, self.root_pid, self.processes()).get(proc.pid, "gone")

    def cpu_snapshot(self) -> dict[int, float]:
        self._machine_before = psutil.cpu_times()
        return super().cpu_snapshot()

    def cpu_pct_since(self, before: dict[int, float], seconds: float) -> float:
        machine_after = psutil.cpu_times()
        after = ProcessTree.cpu_snapshot(self)
        if seconds <= 0:
            return float("nan")
        used = {pid: 100.0 * (after[pid] - before.get(pid, 0.0)) / seconds for pid in after}
        labels = label_processes(self.peer, self.root_pid, self.processes())
        window: dict[str, Any] = {"server_cpu_by_process": {labels.get(pid, f"pid {pid}"): pct
                                                            for pid, pct in used.items()}}
        if self._machine_before is not None:
            window.update(machine_cpu(self._machine_before, machine_after, seconds))
        self.windows.append(window)
        return sum(used.values())


def annotate_runs(runs: Sequence[dict[str, Any]], windows: Sequence[dict[str, Any]]) -> bool:
    """Copy `PeerTree.windows` onto the sweep's trials (same order) and summarize them per concurrency row.

    Returns False, and changes nothing, when the windows do not match the trials one to one.
    """
    trials = [trial for row in runs for trial in row.get("trials", [])]
    if len(trials) != len(windows):
        return False
    for trial, window in zip(trials, windows):
        trial.update(window)
    for row in runs:
        rows_trials = row.get("trials", [])
        labels = dict.fromkeys(label for t in rows_trials for label in t.get("server_cpu_by_process", {}))
        row["server_cpu_by_process"] = {label: summarize(t["server_cpu_by_process"].get(label) for t in rows_trials)
                                        for label in labels}
        for key in ("machine_busy_pct", "machine_steal_pct"):
            row[key] = summarize(t.get(key) for t in rows_trials)
    return True


def _uneven_roles(procs: Sequence[tuple[str, float]], skip: str | None = None) -> list[str]:
    """'API server 1 did nearly all of the 2 API servers' work (35%; API server 2 0%)' for each role with several
    processes of which one did at least 10% and the others less than a quarter of that (`skip`: already named)."""
    groups: dict[str, list[tuple[str, float]]] = {}
    for label, pct in procs:
        base, _, number = label.rpartition(" ")
        groups.setdefault(base if number.isdigit() else label, []).append((label, pct))
    out = []
    for base, members in groups.items():
        members = sorted(members, key=lambda kv: -kv[1])
        (top_label, top), rest = members[0], members[1:]
        if rest and top >= 10.0 and all(pct < top / 4 for _, pct in rest) and top_label != skip:
            out.append(f"{top_label} did nearly all of the {len(members)} {base}s' work ({top:.0f}%; "
                       + ", ".join(f"{label} {pct:.0f}%" for label, pct in rest) + ")")
    return out


def cpu_verdict(row: dict[str, Any], threshold: float = 180.0, from_c: int = 16, cores: int = 2) -> dict | None:
    """For a sweep row at c >= `from_c`: did the server use both cores (median CPU >= `threshold`), its CPU by
    process, and if it did not, why, read from the measured CPU. None below `from_c` or without a CPU figure.

    The reasons, as they apply: the machine was full with other work (its busy CPU reached `threshold` while
    other work took at least `OTHERS_PCT`); the work stayed on one process; one process of a role did the work
    of all of them (e.g. one API server had every connection); no process used a whole core (the server's
    processes waited rather than computed: only said when the machine was not full).
    """
    cpu = median(row.get("server_cpu_pct"))
    if row["concurrency"] < from_c or cpu is None:
        return None
    used = round(cpu) >= threshold
    procs = sorted(((label, median(s)) for label, s in (row.get("server_cpu_by_process") or {}).items()
                    if median(s) is not None), key=lambda kv: -kv[1])
    machine = median(row.get("machine_busy_pct"))
    loadgen = median(row.get("loadgen_cpu_pct")) or 0.0
    others = None if machine is None else machine - cpu - loadgen
    busy_elsewhere = others is not None and others >= OTHERS_PCT
    full = busy_elsewhere and round(machine) >= threshold
    why = []
    if not used:
        if busy_elsewhere:
            steal = median(row.get("machine_steal_pct")) or 0.0
            why.append(("the machine was full" if full else "the machine was busy") + f" ({machine:.0f}% of "
                       f"{cores * 100}%): other work took {others:.0f}% (hypervisor steal {steal:.0f}%)")
        if not procs:
            why.append("no per-process CPU in this record")
        else:
            top_label, top = procs[0]
            second_label, second = procs[1] if len(procs) > 1 else ("no other process", 0.0)
            alone = top >= WHOLE_CORE_PCT and second < top / 3
            if alone:
                why.append(f"the work stayed on one process: {top_label} used a whole core ({top:.0f}%), "
                           f"{second_label} {second:.0f}%")
            elif top >= WHOLE_CORE_PCT:
                why.append(f"uneven: {top_label} used a whole core ({top:.0f}%), {second_label} only {second:.0f}%")
            elif not full:
                why.append(f"no process used a whole core (busiest: {top_label} {top:.0f}%): its processes spent "
                           "part of the time waiting (for requests, on each other, on batch timeouts), not computing")
            why += _uneven_roles(procs, skip=top_label if alone else None)
    return {"concurrency": row["concurrency"], "server_cpu_pct": cpu, "used_both_cores": used,
            "by_process": ", ".join(f"{label} {pct:.0f}%" for label, pct in procs if round(pct) >= 1),
            "machine_busy_pct": machine, "others_pct": others, "why": "; ".join(why)}
