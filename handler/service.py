"""The model service without TorchServe: decode -> predict -> encode for a batch of requests."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .artifacts import INDEX_FILE, LABELS_FILE, MODEL_FILE, ArtifactError, open_set_settings, verify_artifacts
from .preprocessing import DEFAULT_MAX_PIXELS, PREPROCESSING_VERSION, InvalidImageError, is_blank, preprocess
from .requests import RequestError
from .search import GallerySearcher

logger = logging.getLogger(__name__)


@dataclass
class BatchTimings:
    """Seconds spent in each stage of one batch (fed to TorchServe metrics and logs)."""

    preprocess: float = 0.0
    embed: float = 0.0
    search: float = 0.0
    rejected: int = 0
    unknown: int = 0
    top1: list[float] = field(default_factory=list)


#: Custom metrics the handler emits per batch (on the Prometheus endpoint with model_metrics_auto_detect).
#: EmbeddingAnsweredImages and EmbeddingTop1DistanceSum are counters: rate(sum) / rate(answered) is the exact
#: mean top-1 distance over a window, and rate(unknown) / rate(answered) the unknown-answer ratio.
METRIC_NAMES = ("EmbeddingPreprocessMs", "EmbeddingInferenceMs", "EmbeddingSearchMs", "EmbeddingBatchSize",
                "EmbeddingTop1Distance", "EmbeddingUnknownAnswers", "EmbeddingRejectedInputs",
                "EmbeddingAnsweredImages", "EmbeddingTop1DistanceSum")

#: The drift baseline of the loaded model (metadata.json "drift_baseline"), exposed as gauges so alerts
#: compare live traffic with the model being served; absent for artifacts trained before it existed.
BASELINE_METRICS = {
    "EmbeddingBaselineTop1DistanceMean": ("top1_distance", "mean"),
    "EmbeddingBaselineTop1DistanceP50": ("top1_distance", "p50"),
    "EmbeddingBaselineTop1DistanceP90": ("top1_distance", "p90"),
    "EmbeddingBaselineTop1DistanceP99": ("top1_distance", "p99"),
    "EmbeddingBaselineUnknownRate": ("unknown_rate", None),
}


def record_metrics(metrics: Any, batch_size: int, timings: BatchTimings) -> None:
    """Write one batch's figures to TorchServe's metrics cache (ts.metrics.metric_cache_abstract API)."""
    from ts.metrics.metric_type_enum import MetricTypes

    preprocess_ms, inference_ms, search_ms = (1e3 * timings.preprocess, 1e3 * timings.embed, 1e3 * timings.search)
    metrics.add_time("EmbeddingPreprocessMs", preprocess_ms)
    metrics.add_time("EmbeddingInferenceMs", inference_ms)
    metrics.add_time("EmbeddingSearchMs", search_ms)
    metrics.add_metric("EmbeddingBatchSize", batch_size, "count", metric_type=MetricTypes.GAUGE)
    if timings.top1:
        metrics.add_metric("EmbeddingTop1Distance", float(np.mean(timings.top1)), "distance",
                           metric_type=MetricTypes.GAUGE)
    metrics.add_counter("EmbeddingUnknownAnswers", timings.unknown)
    metrics.add_counter("EmbeddingRejectedInputs", timings.rejected)
    answered = [d for d in timings.top1 if d is not None]
    metrics.add_counter("EmbeddingAnsweredImages", len(answered))
    metrics.add_counter("EmbeddingTop1DistanceSum", float(sum(answered)))


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


def record_baseline(metrics: Any, model_name: str, values: dict[str, float]) -> None:
    """Set the baseline gauges. Explicit ModelName/Level dimensions: outside a batch (at initialize)
    TorchServe's cache would otherwise label them Level=Error without ModelName."""
    from ts.metrics.dimension import Dimension
    from ts.metrics.metric_type_enum import MetricTypes

    for name, value in values.items():
        metrics.add_metric(name, value, "distance" if "Distance" in name else "ratio",
                           dimensions=[Dimension("ModelName", model_name), Dimension("Level", "Model")],
                           metric_type=MetricTypes.GAUGE)


def error_answer(exc: RequestError | InvalidImageError) -> dict[str, Any]:
    return {"error": str(exc), "status": exc.status}


class EmbeddingService:
    """Verified artifacts loaded once; answers a batch of image payloads with one forward and one search."""

    def __init__(self, model: torch.jit.ScriptModule, searcher: GallerySearcher, metadata: dict,
                 device: str = "cpu", max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.model = model
        self.searcher = searcher
        self.metadata = metadata
        self.device = torch.device(device)
        self.max_pixels = max_pixels
        probe = self.embed(np.zeros((1, 1, 28, 28), np.float32))  # warm-up, and a contract check
        if probe.shape[1] != searcher.dim:
            raise ArtifactError(f"model embeds into {probe.shape[1]} dimensions but the index holds {searcher.dim}")

    @classmethod
    def from_dir(cls, model_dir: Path, device: str = "cpu", k: int | None = None,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> "EmbeddingService":
        """Load from a directory only after every artifact's SHA-256 matched metadata.json; the open-set score and
        threshold are the ones metadata.json records (handler.artifacts.open_set_settings)."""
        model_dir = Path(model_dir)
        metadata = verify_artifacts(model_dir)
        version = metadata.get("preprocessing", {}).get("version")
        if version != PREPROCESSING_VERSION:
            raise ArtifactError(f"artifacts were built with preprocessing version {version!r}, "
                                f"this handler implements {PREPROCESSING_VERSION!r}")
        open_set = open_set_settings(metadata)
        model = torch.jit.load(str(model_dir / MODEL_FILE), map_location=device).eval()
        if torch.device(device).type == "cpu":
            # oneDNN kernels for the frozen graph: about 2x faster on CPU (measured: 7.0 -> 3.5 ms for a
            # batch of 8 on one thread), same outputs within 1e-7.
            model = torch.jit.optimize_for_inference(model)
        searcher = GallerySearcher.from_files(
            model_dir / INDEX_FILE, model_dir / LABELS_FILE, k=k or metadata["k"],
            threshold=open_set["threshold"], score=open_set["score"], kth=open_set["kth"],
            prototypes=open_set["prototypes"],
            search_params=metadata["index"].get("search_params"),
        )
        return cls(model, searcher, metadata, device, max_pixels)

    @torch.inference_mode()
    def embed(self, batch: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(batch).to(self.device)
        return self.model(x).float().cpu().numpy()

    def answer(self, payloads: Sequence[bytes | np.ndarray | RequestError]) -> tuple[list[dict[str, Any]], BatchTimings]:
        """One answer per payload (image bytes, or a 2-D uint8 image), in order; bad items get an error answer."""
        timings = BatchTimings()
        answers: list[dict[str, Any] | None] = [None] * len(payloads)
        good, tensors = [], []
        started = time.perf_counter()
        for i, payload in enumerate(payloads):
            try:
                if isinstance(payload, RequestError):
                    raise payload
                tensors.append(preprocess(payload, self.max_pixels))
                good.append(i)
            except (RequestError, InvalidImageError) as exc:
                answers[i] = error_answer(exc)
                timings.rejected += 1
            except Exception:  # a bug, not bad input: fail this request alone, keep the batch
                logger.exception("unexpected error preprocessing request %d", i)
                answers[i] = {"error": "internal error while preprocessing this image", "status": 500}
                timings.rejected += 1
        timings.preprocess = time.perf_counter() - started
        if good:
            started = time.perf_counter()
            embeddings = self.embed(np.stack(tensors))
            timings.embed = time.perf_counter() - started
            started = time.perf_counter()
            results = self.searcher.classify(embeddings)
            timings.search = time.perf_counter() - started
            for i, tensor, result in zip(good, tensors, results):
                if is_blank(tensor):  # nothing to recognise: never a confident answer
                    result = {**result, "unknown": True}
                answers[i] = result
                timings.unknown += result["unknown"]
                timings.top1.append(result["dist"])
        return answers, timings  # type: ignore[return-value]
