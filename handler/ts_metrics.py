"""The handler's metrics for TorchServe's frontend: the adapter's side of the timings and drift baseline the core
computes.

A TorchServe 0.12 worker hands metrics to its frontend as ``[METRICS]...`` lines on stdout; its metrics cache API
(``ts.metrics``) writes one log record, so one flushed write, per metric. The per-batch metrics are written here as
the same lines in one record per batch (:func:`record_metrics`); the drift-baseline gauges, sent every 30 s,
still go through the cache API. Names and labels: :mod:`handler.metric_names`."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes
from ts.metrics.unit import Units

# The names, labels and baseline figures live where no `ts` import is needed (the python runtime reads them);
# they are re-exported here for the code that has always imported them from this module.
from .metric_names import BASELINE_METRICS, DIMENSIONS, METRIC_NAMES, NO_VERSION, baseline_values  # noqa: F401
from .service import BatchTimings

logger = logging.getLogger(__name__)
#: The unit names TorchServe's metrics write for the short ones its API takes ("ms" -> "Milliseconds").
UNIT_NAMES: dict[str | None, str] = Units().units


def dimensions(model_name: str, model_version: str | None) -> list[Dimension]:
    """The DIMENSIONS of a model's metrics. Explicit: outside a batch (at initialize) TorchServe's cache would
    otherwise label a metric Level=Error without ModelName."""
    values = (model_name, "Model", model_version or NO_VERSION)
    return [Dimension(name, value) for name, value in zip(DIMENSIONS, values, strict=True)]


def metric_line(name: str, unit: str, value: int | float, dims: str, metric_type: MetricTypes, hostname: str,
                timestamp: int, request_ids: str | None) -> str:
    """One metric as TorchServe 0.12's worker writes it to stdout (``CachingMetric.emit_metrics``), the line its
    frontend parses into the metric (and registers, with model_metrics_auto_detect, at the name's first line)."""
    line = (f"[METRICS]{name}.{UNIT_NAMES.get(unit, unit)}:{value}|#{dims}|#type:{metric_type.name}"
            f"|#hostname:{hostname},{timestamp}")
    return f"{line},{request_ids}" if request_ids else line


def request_ids_of(metrics: Any) -> str | None:
    """The request ids TorchServe's metrics cache appends to a batch-level metric (all of the batch's, joined)."""
    ids = getattr(metrics, "request_ids", None)
    return ",".join(ids.values()) if isinstance(ids, dict) else ids


def batch_metric_lines(batch_size: int, timings: BatchTimings, model_name: str, model_version: str | None,
                       request_ids: str | None, hostname: str, timestamp: int,
                       emitted: set[tuple[str, str, str]] | None = None) -> list[str]:
    """The METRIC_NAMES lines of one batch, each exactly as TorchServe's metrics cache API writes it (add_time in
    ms, add_metric gauges, add_counter counters).

    With `emitted` (the counters this worker already sent, by (name, model, version); updated here), a counter
    whose increment is 0 is left out once it has been sent: adding 0 changes no counter, and the first line of
    each has registered it. The *Ms gauges are milliseconds (TorchServe's add_time unit, like its
    PredictionTime); the per-request latency histogram in seconds comes from the KServe gateway
    (serving.gateway_metrics)."""
    version = model_version or NO_VERSION
    dims = ",".join(f"{name}:{value}" for name, value in zip(DIMENSIONS, (model_name, "Model", version), strict=True))
    answered = [d for d in timings.top1 if d is not None]
    total = float(sum(answered))
    gauges: list[tuple[str, str, int | float]] = [
        ("EmbeddingPreprocessMs", "ms", 1e3 * timings.preprocess),
        ("EmbeddingInferenceMs", "ms", 1e3 * timings.embed),
        ("EmbeddingSearchMs", "ms", 1e3 * timings.search),
        ("EmbeddingBatchSize", "count", batch_size),
    ]
    if answered:  # images without any neighbour (an approximate index's empty answer) have no distance
        # The batch's mean, as the counters give it (sum / answered); numpy's mean (pairwise sums) could differ
        # from it in the last bit and costs more than the rest of the lines.
        gauges.append(("EmbeddingTop1Distance", "distance", total / len(answered)))
    counters: list[tuple[str, int | float]] = [
        ("EmbeddingUnknownAnswers", timings.unknown), ("EmbeddingRejectedInputs", timings.rejected),
        ("EmbeddingAnsweredImages", len(answered)), ("EmbeddingTop1DistanceSum", total),
    ]
    lines = [metric_line(name, unit, value, dims, MetricTypes.GAUGE, hostname, timestamp, request_ids)
             for name, unit, value in gauges]
    for name, value in counters:
        if emitted is not None:
            key = (name, model_name, version)
            if not value and key in emitted:
                continue
            emitted.add(key)
        lines.append(metric_line(name, "count", value, dims, MetricTypes.COUNTER, hostname, timestamp, request_ids))
    return lines


def record_metrics(metrics: Any, batch_size: int, timings: BatchTimings, model_name: str,
                   model_version: str | None, emitted: set[tuple[str, str, str]] | None = None,
                   log_line: str | None = None) -> None:
    """Write one batch's figures where TorchServe's metrics cache (``metrics``, ts.metrics.metric_cache_abstract)
    would: the lines of :func:`batch_metric_lines`, with the cache's request ids, in ONE log record, i.e. one
    write to the worker's stdout per batch instead of one per metric (the frontend reads that stream line by
    line). ``log_line``, the handler's per-batch log line, rides in the same write when given."""
    lines = batch_metric_lines(batch_size, timings, model_name, model_version, request_ids_of(metrics),
                               socket.gethostname(), int(time.time()), emitted)
    logger.info("\n".join([log_line, *lines] if log_line else lines))


def record_baseline(metrics: Any, model_name: str, model_version: str | None, values: dict[str, float]) -> None:
    """Set the baseline gauges, labelled like the batch metrics (see dimensions)."""
    for name, value in values.items():
        metrics.add_metric(name, value, "distance" if "Distance" in name else "ratio",
                           dimensions=dimensions(model_name, model_version), metric_type=MetricTypes.GAUGE)
