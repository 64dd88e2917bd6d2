"""The python runtime's metrics under TorchServe's names, so that the shipped Prometheus rules and alerts read them
unchanged (deploy/prometheus/rules): the frontend's request counters and latency sums, the handler's per-batch
figures (handler.metric_names' names and labels), the workers' load times and the drift baseline.

Every worker process writes its values with prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set
by the supervisor before the worker starts); the supervisor serves their sum on the metrics port
(:mod:`serving.python_runtime.metrics_page`). Gauges that TorchServe holds at the last batch's value take the
most recent value of any worker, as TorchServe's do across its workers.
"""

from __future__ import annotations

import socket
from typing import Mapping

from prometheus_client import Counter, Gauge

from handler.service import BatchTimings
from handler.metric_names import BASELINE_METRICS, DIMENSIONS, METRIC_NAMES

#: The model version label of TorchServe's request counters for paths that name no version.
DEFAULT_VERSION_LABEL = "default"
HOST_LABELS = ("Level", "Hostname")
TS_LABELS = ("model_name", "model_version", "hostname")
HANDLER_LABELS = (*DIMENSIONS, "Hostname")
#: The handler's per-batch counters (the rest of METRIC_NAMES are gauges of the last batch).
HANDLER_COUNTERS = ("EmbeddingUnknownAnswers", "EmbeddingRejectedInputs", "EmbeddingAnsweredImages",
                    "EmbeddingTop1DistanceSum")


def _counter(name: str, labels: tuple[str, ...]) -> Counter:
    return Counter(name, f"{name} (TorchServe's name, served by the python runtime)", labels)


def _gauge(name: str, labels: tuple[str, ...]) -> Gauge:
    return Gauge(name, f"{name} (TorchServe's name, served by the python runtime)", labels,
                 multiprocess_mode="mostrecent")


class RuntimeMetrics:
    """The metrics one worker process updates."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.host = socket.gethostname()
        self.requests = _counter("ts_inference_requests_total", TS_LABELS)
        self.latency_us = _counter("ts_inference_latency_microseconds", TS_LABELS)
        self.queue_us = _counter("ts_queue_latency_microseconds", TS_LABELS)
        self.responses = {code: _counter(f"Requests{code}XX", HOST_LABELS) for code in (2, 4, 5)}
        self.prediction_ms = _gauge("PredictionTime", ("ModelName", "Level", "Hostname"))
        self.worker_load_ms = _gauge("WorkerLoadTime", ("WorkerName", "Level", "Hostname"))
        self.handler = {name: (_counter if name in HANDLER_COUNTERS else _gauge)(name, HANDLER_LABELS)
                        for name in METRIC_NAMES}
        self.baseline_gauges = {name: _gauge(name, HANDLER_LABELS) for name in BASELINE_METRICS}

    def response(self, status: int) -> None:
        """One answer of the inference port (health and metadata included, as TorchServe counts its own)."""
        counter = self.responses.get(status // 100)
        if counter is not None:
            counter.labels("Host", self.host).inc()

    def inference(self, version: str | None, latency_s: float, queue_s: float) -> None:
        """One request that reached the model: TorchServe's request count and latency sums."""
        labels = (self.model, version or DEFAULT_VERSION_LABEL, self.host)
        self.requests.labels(*labels).inc()
        self.latency_us.labels(*labels).inc(latency_s * 1e6)
        self.queue_us.labels(*labels).inc(queue_s * 1e6)

    def batch(self, version: str, images: int, timings: BatchTimings, seconds: float) -> None:
        """One batch's handler figures, as handler.ts_metrics.batch_metric_lines computes them."""
        self.prediction_ms.labels(self.model, "Model", self.host).set(seconds * 1e3)
        for name, value in batch_values(images, timings).items():
            metric = self.handler[name].labels(self.model, "Model", version, self.host)
            if name in HANDLER_COUNTERS:
                metric.inc(value)
            else:
                metric.set(value)

    def worker_loaded(self, worker: str, seconds: float) -> None:
        self.worker_load_ms.labels(worker, "Host", self.host).set(round(seconds * 1e3))

    def baseline(self, version: str, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.baseline_gauges[name].labels(self.model, "Model", version, self.host).set(value)


def batch_values(images: int, timings: BatchTimings) -> dict[str, float]:
    """{handler metric name: this batch's value}: gauges of the batch, and counter increments."""
    answered = [d for d in timings.top1 if d is not None]
    total = float(sum(answered))
    values = {"EmbeddingPreprocessMs": 1e3 * timings.preprocess, "EmbeddingInferenceMs": 1e3 * timings.embed,
              "EmbeddingSearchMs": 1e3 * timings.search, "EmbeddingBatchSize": float(images),
              "EmbeddingUnknownAnswers": float(timings.unknown), "EmbeddingRejectedInputs": float(timings.rejected),
              "EmbeddingAnsweredImages": float(len(answered)), "EmbeddingTop1DistanceSum": total}
    if answered:
        values["EmbeddingTop1Distance"] = total / len(answered)
    return values
