"""The handler's metrics in TorchServe's metrics cache (``ts.metrics``): the adapter's side of the timings and
drift baseline the core computes."""

from __future__ import annotations

from typing import Any

import numpy as np
from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes

from .service import BatchTimings

#: Custom metrics the handler emits per batch (on the Prometheus endpoint with model_metrics_auto_detect).
#: EmbeddingAnsweredImages and EmbeddingTop1DistanceSum are counters: rate(sum) / rate(answered) is the exact
#: mean top-1 distance over a window, and rate(unknown) / rate(answered) the unknown-answer ratio.
METRIC_NAMES = ("EmbeddingPreprocessMs", "EmbeddingInferenceMs", "EmbeddingSearchMs", "EmbeddingBatchSize",
                "EmbeddingTop1Distance", "EmbeddingUnknownAnswers", "EmbeddingRejectedInputs",
                "EmbeddingAnsweredImages", "EmbeddingTop1DistanceSum")

#: Dimensions of every handler metric, in this order (TorchServe's frontend adds Hostname). ModelVersion is the
#: .mar's version, so the figures of two versions (a canary beside the stable one) stay apart.
DIMENSIONS = ("ModelName", "Level", "ModelVersion")
#: ModelVersion of a .mar whose manifest names none.
NO_VERSION = "unversioned"

#: The drift baseline of the loaded model (metadata.json "drift_baseline"), exposed as gauges so alerts
#: compare live traffic with the model being served; absent for artifacts trained before it existed.
BASELINE_METRICS = {
    "EmbeddingBaselineTop1DistanceMean": ("top1_distance", "mean"),
    "EmbeddingBaselineTop1DistanceP50": ("top1_distance", "p50"),
    "EmbeddingBaselineTop1DistanceP90": ("top1_distance", "p90"),
    "EmbeddingBaselineTop1DistanceP99": ("top1_distance", "p99"),
    "EmbeddingBaselineUnknownRate": ("unknown_rate", None),
}


def dimensions(model_name: str, model_version: str | None) -> list[Dimension]:
    """The DIMENSIONS of a model's metrics. Explicit: outside a batch (at initialize) TorchServe's cache would
    otherwise label a metric Level=Error without ModelName."""
    values = (model_name, "Model", model_version or NO_VERSION)
    return [Dimension(name, value) for name, value in zip(DIMENSIONS, values, strict=True)]


def record_metrics(metrics: Any, batch_size: int, timings: BatchTimings, model_name: str,
                   model_version: str | None) -> None:
    """Write one batch's figures to TorchServe's metrics cache (ts.metrics.metric_cache_abstract API).

    The *Ms gauges are milliseconds (TorchServe's add_time unit, like its PredictionTime); the per-request
    latency histogram in seconds comes from the KServe gateway (serving.gateway_metrics)."""
    dims = dimensions(model_name, model_version)
    preprocess_ms, inference_ms, search_ms = (1e3 * timings.preprocess, 1e3 * timings.embed, 1e3 * timings.search)
    metrics.add_time("EmbeddingPreprocessMs", preprocess_ms, dimensions=list(dims))
    metrics.add_time("EmbeddingInferenceMs", inference_ms, dimensions=list(dims))
    metrics.add_time("EmbeddingSearchMs", search_ms, dimensions=list(dims))
    metrics.add_metric("EmbeddingBatchSize", batch_size, "count", dimensions=list(dims),
                       metric_type=MetricTypes.GAUGE)
    if timings.top1:
        metrics.add_metric("EmbeddingTop1Distance", float(np.mean(timings.top1)), "distance", dimensions=list(dims),
                           metric_type=MetricTypes.GAUGE)
    metrics.add_counter("EmbeddingUnknownAnswers", timings.unknown, dimensions=list(dims))
    metrics.add_counter("EmbeddingRejectedInputs", timings.rejected, dimensions=list(dims))
    answered = [d for d in timings.top1 if d is not None]
    metrics.add_counter("EmbeddingAnsweredImages", len(answered), dimensions=list(dims))
    metrics.add_counter("EmbeddingTop1DistanceSum", float(sum(answered)), dimensions=list(dims))


def baseline_values(metadata: dict) -> dict[str, float]:
    """{metric name: value} from metadata.json's drift baseline; empty when the artifacts have none (or a
    malformed one)."""
    baseline = metadata.get("drift_baseline")
    if not isinstance(baseline, dict):
        return {}
    values = {}
    for name, (key, sub) in BASELINE_METRICS.items():
        value = baseline.get(key)
        if sub is not None:
            value = value.get(sub) if isinstance(value, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
            values[name] = float(value)
    return values if len(values) == len(BASELINE_METRICS) else {}  # all or nothing: alerts need every figure


def record_baseline(metrics: Any, model_name: str, model_version: str | None, values: dict[str, float]) -> None:
    """Set the baseline gauges, labelled like the batch metrics (see dimensions)."""
    for name, value in values.items():
        metrics.add_metric(name, value, "distance" if "Distance" in name else "ratio",
                           dimensions=dimensions(model_name, model_version), metric_type=MetricTypes.GAUGE)
