"""The handler's metric names, their labels and the drift-baseline figures, without TorchServe: TorchServe's adapter
(:mod:`handler.ts_metrics`) and the python runtime (:mod:`serving.python_runtime.metrics`) write the same series
under these names, so that the shipped Prometheus rules and alerts read either runtime unchanged."""

from __future__ import annotations

import numpy as np

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


def baseline_values(baseline: dict | None) -> dict[str, float]:
    """{metric name: value} from metadata.json's drift baseline (ModelMetadata.drift_baseline); empty when the
    artifacts have none (or a malformed one)."""
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
