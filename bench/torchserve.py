"""TorchServe under load: one .mar and one server per configuration, REST (wrk) and gRPC sweeps.

Each configuration gets a model-config.yaml generated from the repo's (only workers, batching and
torch threads change), its own .mar built by `serving.archive.build_mar`, and its own TorchServe
(`serving.server.start`) on free loopback ports with the repo's config.properties otherwise
unchanged: token authorization on, Prometheus metrics on.

Latency split per request (means over each trial's window):
- queue: ``ts_queue_latency_microseconds`` / ``ts_inference_requests_total``: the frontend's job queue,
  which includes waiting for the batch to fill (TorchServe stamps a job when its batch goes to a
  worker, so a lone request shows about ``maxBatchDelay`` here),
- handler: preprocess / embed / search of the batch the request rode in, request-weighted, from the
  handler's per-batch figures (the values behind its ``Embedding*Ms`` metrics),
- worker other: TorchServe's inference latency minus queue minus handler (frontend <-> worker IPC,
  TorchServe's Python wrapper, the handler's logging and metrics, waiting for a CPU),
- frontend: the client's mean latency minus TorchServe's inference latency (HTTP/gRPC parsing,
  auth, response writing, loopback).
The ``Embedding*Ms`` metrics are Prometheus gauges (last batch only), so the per-batch values are
read from the handler's log line for the same batch, which carries the batch size as well.
TorchServe 0.12 leaves its latency counters untouched for gRPC requests: for gRPC only the handler
stages and "outside handler" (client mean minus handler) are known.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self

import psutil
import yaml

from client.metrics_text import sum_by_name
from serving.archive import build_mar
from settings import MODEL_CONFIG_FILE
from serving.server import Instance, private_instance, start, stop
from training.index import INDEX_TYPES, resolve_index_type

from .procs import ProcessTree

BATCH_LINE = re.compile(r"batch=(\d+) rejected=\d+ unknown=\d+ preprocess_ms=([\d.]+) embed_ms=([\d.]+) "
                        r"search_ms=([\d.]+)")
#: Counter families (prometheus_client names counters without their _total suffix).
COUNTERS = ("ts_inference_requests", "ts_inference_latency_microseconds", "ts_queue_latency_microseconds")


@dataclass(frozen=True)
class TSConfig:
    """Workers x torch threads, batching, and the gallery index of the .mar ("" = the served artifacts as built).

    `properties` are config.properties overrides (key, value) on top of the repo's file, for frontend settings.
    """

    name: str
    workers: int
    threads: int
    batch_size: int
    max_batch_delay_ms: int
    index: str = ""
    shipped: bool = False
    properties: tuple[tuple[str, str], ...] = ()
    #: Behind serving.front, as `python -m serving start` runs it (the others are TorchServe bare, as the peers).
    front: bool = False

    @property
    def label(self) -> str:
        batching = f"batch {self.batch_size}/{self.max_batch_delay_ms} ms" if self.batch_size > 1 else "no batching"
        extra = f", {self.index} index" if self.index else ""
        extra += "".join(f", {k}={v}" for k, v in self.properties)
        extra += ", behind the local front" if self.front else ""
        return f"{self.workers}x{self.threads}, {batching}{extra}"


def shipped_config(path: Path = MODEL_CONFIG_FILE) -> TSConfig:
    """The configuration the repo's model-config.yaml ships (what ./archive.sh packs)."""
    cfg = yaml.safe_load(Path(path).read_text())
    threads = int((cfg.get("handler") or {}).get("threads", 1)) or 1
    return TSConfig("shipped", int(cfg.get("minWorkers", 1)), threads, int(cfg.get("batchSize", 1)),
                    int(cfg.get("maxBatchDelay", 100)), shipped=True)


def configurations(quick: bool) -> list[TSConfig]:
    """The shipped defaults and the variations around them that the report compares."""
    shipped = shipped_config()
    if quick:
        return [shipped]
    return [
        shipped,
        TSConfig("no-batching", 2, 1, 1, 0),
        TSConfig("2x1-b4-2ms", 2, 1, 4, 2),
        TSConfig("2x1-b16-10ms", 2, 1, 16, 10),
        TSConfig("1x2-b8-5ms", 1, 2, 8, 5),
        *(TSConfig(f"shipped-{kind}", shipped.workers, shipped.threads, shipped.batch_size, shipped.max_batch_delay_ms,
                   kind) for kind in INDEX_TYPES if kind != resolve_index_type("auto", 60_000)),
    ]


#: Frontend settings the latency study compares (TorchServe's defaults are one Netty thread pool per core).
NETTY_ONE = (("number_of_netty_threads", "1"), ("netty_client_threads", "1"))


def latency_candidates() -> list[TSConfig]:
    """Batch delay / size and worker-count variations around the shipped layout (`python -m bench latency`).

    `shipped-copy` is the shipped settings in a second server: an A/A control that shows the run's noise.
    """
    shipped = shipped_config()
    return [
        TSConfig("shipped-copy", shipped.workers, shipped.threads, shipped.batch_size, shipped.max_batch_delay_ms),
        TSConfig("2x1-b8-0ms", 2, 1, 8, 0),
        TSConfig("2x1-b8-1ms", 2, 1, 8, 1),
        TSConfig("2x1-b8-2ms", 2, 1, 8, 2),
        TSConfig("2x1-b4-0ms", 2, 1, 4, 0),
        TSConfig("2x1-b4-1ms", 2, 1, 4, 1),
        TSConfig("3x1-no-batching", 3, 1, 1, 0),
        TSConfig("3x1-b8-1ms", 3, 1, 8, 1),
        TSConfig("3x1-b8-2ms", 3, 1, 8, 2),
        TSConfig("3x1-b4-1ms", 3, 1, 4, 1),
        TSConfig("shipped-netty1", shipped.workers, shipped.threads, shipped.batch_size, shipped.max_batch_delay_ms,
                 properties=NETTY_ONE),
        TSConfig("shipped-front", shipped.workers, shipped.threads, shipped.batch_size, shipped.max_batch_delay_ms,
                 front=True),
    ]


def all_configurations() -> list[TSConfig]:
    """Every named configuration (`--configs` picks from these): the report's set, then the latency candidates."""
    known = configurations(quick=False)
    return known + [c for c in latency_candidates() if c.name not in {k.name for k in known}]


def write_model_config(cfg: TSConfig, path: Path) -> Path:
    """The repo's model-config.yaml with this configuration's workers, batching and threads."""
    if cfg.shipped:
        shutil.copy2(MODEL_CONFIG_FILE, path)
        return path
    data = yaml.safe_load(MODEL_CONFIG_FILE.read_text())
    data.update({"minWorkers": cfg.workers, "maxWorkers": cfg.workers, "batchSize": cfg.batch_size,
                 "maxBatchDelay": cfg.max_batch_delay_ms})
    data.setdefault("handler", {})["threads"] = cfg.threads
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def scrape(metrics_url: str) -> dict[str, float]:
    """Prometheus text format -> {metric name: value summed over label sets}."""
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum_by_name(text)


class TorchServeProbe:
    """Per-trial latency split from TorchServe's counters and the handler's per-batch log line."""

    def __init__(self, instance: Instance) -> None:
        self.metrics_url = instance.endpoints.metrics
        self.model_log = instance.workdir / "logs" / "model_log.log"

    def _log_size(self) -> int:
        try:
            return self.model_log.stat().st_size
        except OSError:
            return 0

    def begin(self) -> tuple[dict[str, float], int]:
        return scrape(self.metrics_url), self._log_size()

    def end(self, state: tuple[dict[str, float], int], trial: dict[str, Any]) -> dict[str, float | None]:
        before, offset = state
        time.sleep(0.2)  # the frontend logs and counts a response just after sending it
        after = scrape(self.metrics_url)
        with open(self.model_log, "rb") as fh:
            fh.seek(offset)
            tail = fh.read().decode(errors="replace")
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
        requests = delta["ts_inference_requests"]
        batches = [tuple(float(g) for g in m.groups()) for m in BATCH_LINE.finditer(tail)]
        items = sum(b[0] for b in batches)
        if requests <= 0 or not items:
            return {}
        stage = {name: sum(b[0] * b[i] for b in batches) / items
                 for i, name in ((1, "preprocess"), (2, "embed"), (3, "search"))}
        handler = sum(stage.values())
        split: dict[str, float | None] = {**stage, "outside_handler": trial["mean_ms"] - handler,
                                          "mean_batch": items / len(batches)}
        if delta["ts_inference_latency_microseconds"] <= 0:
            # TorchServe 0.12 counts gRPC requests but adds nothing to its latency counters for them.
            return {**split, "queue": None, "worker_other": None, "frontend": None, "torchserve_inference": None}
        inference = delta["ts_inference_latency_microseconds"] / requests / 1e3
        queue = delta["ts_queue_latency_microseconds"] / requests / 1e3
        return {**split, "queue": queue, "worker_other": inference - queue - handler,
                "frontend": trial["mean_ms"] - inference, "torchserve_inference": inference}


def worker_role(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    if "org.pytorch.serve" in cmd:
        return "frontend (java)"
    if "model_service_worker" in cmd:
        return "worker"
    return proc.name()


class TorchServeRun:
    """Build the configuration's .mar, start TorchServe, and stop it on exit (even on failure)."""

    def __init__(self, cfg: TSConfig, artifacts: Path, root: Path) -> None:
        self.cfg = cfg
        self.artifacts = artifacts
        self.workdir = Path(tempfile.mkdtemp(prefix=f"ts-{cfg.name}-", dir=root))
        self.store = self.workdir / "model_store"
        self.instance = private_instance(self.workdir / "server", **dict(cfg.properties))
        self.start_to_ready_s: float | None = None
        self.mar_bytes: int | None = None

    def build(self) -> None:
        model_config = write_model_config(self.cfg, self.workdir / "model-config.yaml")
        mar = build_mar(self.artifacts, self.store, model_config=model_config)
        self.mar_bytes = mar.stat().st_size

    def start(self) -> float:
        # TorchServe itself, as the peers are measured bare, unless the configuration measures the local front
        self.start_to_ready_s = start(self.instance, self.store, threads=self.cfg.threads, front=self.cfg.front)
        return self.start_to_ready_s

    def stop(self) -> None:
        stop(self.instance)

    def __enter__(self) -> Self:
        self.build()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def tree(self) -> ProcessTree:
        pid = self.instance.pid()
        if pid is None:
            raise RuntimeError(f"TorchServe for {self.cfg.name} is not running")
        return ProcessTree(pid)

    @property
    def rest_base(self) -> str:
        return self.instance.endpoints.inference

    @property
    def predict_path(self) -> str:
        return f"/predictions/{self.instance.model_name}"

    def token(self) -> str:
        return self.instance.keys()["inference"]

    def memory(self) -> list[dict]:
        return self.tree.memory(worker_role)

    def describe(self) -> dict[str, Any]:
        return {**asdict(self.cfg), "label": self.cfg.label}
