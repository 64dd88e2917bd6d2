"""The TorchServe adapter: TorchServe's context and stages wired to the framework-free core.

The core (:mod:`handler.preprocessing`, :mod:`handler.requests`, :mod:`handler.protocols`, :mod:`handler.search`,
:mod:`handler.artifacts`, :mod:`handler.service`) never imports ``ts``; training, the benchmarks, the queue bridge
and the KServe path use it directly. This module and :mod:`handler.ts_metrics` are the only ones that know
TorchServe: its Context, its metrics cache, and the workarounds for its 0.12 frontend. BaseHandler.handle runs
the stages (and records HandlerTime); each stage here does what its name says. Settings come from the
``handler:`` section of model-config.yaml (max_image_pixels, threads, device, runtime).
"""

from __future__ import annotations

import logging
import os
import time
from http import HTTPStatus

import torch
from ts.torch_handler.base_handler import BaseHandler

from handler.artifacts import ArtifactError, quantization, read_metadata
from handler.log_lines import refusal_log_line
from handler.preprocessing import DEFAULT_MAX_PIXELS
from handler.protocols import encode_batch, read_row
from handler.service import DEFAULT_RUNTIME, BatchTimings, EmbeddingService
from handler.ts_metrics import baseline_values, record_baseline, record_metrics

logger = logging.getLogger(__name__)

#: Seconds between re-emissions of the drift-baseline gauges while serving: after a version swap (or with two
#: versions loaded) the gauges follow the version that is answering traffic.
BASELINE_REFRESH_S = 30.0


def pick_device(gpu_id: int | str | None, setting: str = "auto", cuda_available: bool | None = None) -> str:
    """The torch device a worker serves on. ``auto``: the GPU TorchServe assigned (gpu_id) when CUDA is
    available, else the CPU; ``cpu``; ``cuda`` (the assigned GPU, else GPU 0) or ``cuda:N``, refused when
    CUDA is unavailable rather than silently served on the CPU."""
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    setting = (setting or "auto").strip().lower()
    if setting == "auto":
        return f"cuda:{gpu_id}" if gpu_id is not None and available else "cpu"
    if setting == "cpu":
        return "cpu"
    if setting == "cuda" or setting.startswith("cuda:"):
        if not available:
            raise ValueError(f"handler.device={setting} but CUDA is not available on this worker")
        if setting == "cuda":
            return f"cuda:{gpu_id if gpu_id is not None else 0}"
        return setting
    raise ValueError(f"handler.device must be auto, cpu, cuda or cuda:N, got {setting!r}")


def auto_device_for(model_dir: str, device: str) -> str:
    """``device: auto`` on a GPU worker: the CPU for an int8 model (quantized kernels are CPU-only), else `device`.
    Unreadable metadata keeps `device`: loading then reports the problem."""
    try:
        scheme = quantization(read_metadata(model_dir))
    except (ArtifactError, OSError, ValueError, AttributeError):
        return device
    if scheme == "none":
        return device
    logger.info("handler.device auto: %s model, serving on the CPU instead of %s (a GPU serves the float model: "
                "train with --quantize none)", scheme, device)
    return "cpu"


def batch_log_line(requests: int, images: int, timings: BatchTimings, request_ids: dict | None) -> str:
    """The handler's one log line per batch (model_log.log; bench.torchserve reads its timings back)."""
    return (f"batch={requests} rejected={timings.rejected} unknown={timings.unknown} "
            f"preprocess_ms={1e3 * timings.preprocess:.2f} embed_ms={1e3 * timings.embed:.2f} "
            f"search_ms={1e3 * timings.search:.2f} images={images} pid={os.getpid()} "
            f"ids={','.join((request_ids or {}).values())}")


class EmbeddingHandler(BaseHandler):
    """Image bytes -> embedding -> FAISS k-NN answer, one JSON answer per request of the batch."""

    def initialize(self, context) -> None:
        properties = context.system_properties
        settings = (context.model_yaml_config or {}).get("handler", {}) or {}
        threads = int(settings.get("threads", 0))
        if threads > 0:
            torch.set_num_threads(threads)
        device = pick_device(properties.get("gpu_id"), str(settings.get("device", "auto")))
        if device != "cpu" and str(settings.get("device", "auto")).strip().lower() == "auto":
            device = auto_device_for(properties["model_dir"], device)
        if "k" in settings:
            # k belongs to the trained model (metadata.json): the accuracy training reported is the one served.
            logger.warning("model-config.yaml handler.k=%s is ignored: k comes from the model's metadata.json",
                           settings["k"])
        try:
            self.service = EmbeddingService.from_dir(
                properties["model_dir"], device=device,
                max_pixels=int(settings.get("max_image_pixels", DEFAULT_MAX_PIXELS)),
                runtime=str(settings.get("runtime", DEFAULT_RUNTIME)).strip().lower(), threads=threads or None,
            )
        except ArtifactError as exc:
            logger.error("refusing to load model %s: %s", context.model_name, exc)
            raise
        self.context = context
        self.initialized = True
        meta = self.service.metadata
        self._baseline = baseline_values(meta.drift_baseline)
        #: Counters this worker has sent (handler.ts_metrics.batch_metric_lines leaves out their 0 increments).
        self._counters_sent: set[tuple[str, str, str]] = set()
        self._baseline_sent = float("-inf")
        if not self._baseline:
            logger.warning("%s: metadata.json has no drift baseline (artifacts from an older training run): "
                           "no EmbeddingBaseline* metrics", context.model_name)
        self._send_baseline(context)
        self._baseline_sent = float("-inf")  # and again with the first batch, in case the load-time one was lost
        logger.info("loaded %s on %s (%s: %s): gallery %d x %d (%s), k=%d, unknown when %s > %.4f, accuracy %.4f, "
                    "threads %d", context.model_name, device, self.service.runtime, self.service.network_file,
                    self.service.searcher.index.ntotal, self.service.searcher.dim,
                    meta.index.get("type"), self.service.searcher.k, self.service.searcher.score,
                    float("nan") if self.service.searcher.threshold is None else self.service.searcher.threshold,
                    meta.metrics.accuracy, torch.get_num_threads())

    def preprocess(self, data):
        """Rows -> requests (TorchServe, JSON, form and KServe bodies) -> image tensors, as training made them."""
        requests = [read_row(row, self._content_types(idx, row)) for idx, row in enumerate(data)]
        prepared = self.service.prepare([item for request in requests for item in request.items])
        return requests, prepared

    def inference(self, data, *args, **kwargs):
        """One forward pass and one gallery search for the whole batch."""
        requests, prepared = data
        embedding = [request.embedding for request in requests for _ in request.items]
        answers, timings = self.service.predict(prepared, embedding)
        return requests, answers, timings

    def postprocess(self, data):
        """The per-batch log line and metrics, then one JSON answer (and status) per request."""
        requests, answers, timings = data
        line = batch_log_line(len(requests), len(answers), timings, self.context.request_ids) \
            if logger.isEnabledFor(logging.INFO) else None
        if self.context.metrics is not None:
            # The log line and the metrics in one write to the worker's stdout (the frontend splits the lines).
            record_metrics(self.context.metrics, len(answers), timings, self.context.model_name,
                           self._model_version(self.context), emitted=self._counters_sent, log_line=line)
            if time.monotonic() - self._baseline_sent >= BASELINE_REFRESH_S:
                self._send_baseline(self.context)
        elif line is not None:
            logger.info(line)
        # Behind a KServe envelope the rows are the instances of one request, not one row per request:
        # per-request status and headers only apply when each row is its own request.
        per_request = len(requests) == len(self.context.request_ids or {})
        version = (self.context.manifest or {}).get("model", {}).get("modelVersion")
        out = []
        for idx, (status, text) in enumerate(encode_batch(requests, answers, self.context.model_name, version)):
            if status != 200:
                logger.info(refusal_log_line((self.context.request_ids or {}).get(idx), status, text))
            if per_request:
                if status != 200:
                    # The standard phrase, never the message: TorchServe 0.12 frames the phrase by characters
                    # but writes UTF-8 bytes, so client text in it could desynchronise the worker protocol.
                    self.context.set_response_status(status, HTTPStatus(status).phrase, idx)
                self.context.set_response_content_type(idx, "application/json")
                if self._is_grpc(idx):
                    # Ends a gRPC StreamPredictions call after its one answer; without it TorchServe 0.12
                    # fails the call ("Worker died") and restarts the worker. Never on HTTP, where the
                    # header turns the answer into a stream whose head is never sent.
                    self.context.set_response_header(idx, "ts_stream_next", "false")
            out.append(text)
        return out

    def _send_baseline(self, context) -> None:
        if self._baseline and getattr(context, "metrics", None) is not None:
            try:
                record_baseline(context.metrics, context.model_name, self._model_version(context), self._baseline)
            except Exception:  # metrics must never take the model down
                logger.exception("could not emit the drift-baseline metrics")
        self._baseline_sent = time.monotonic()

    @staticmethod
    def _model_version(context) -> str | None:
        """The .mar's version (its manifest's modelVersion)."""
        return (getattr(context, "manifest", None) or {}).get("model", {}).get("modelVersion")

    def _is_grpc(self, idx: int) -> bool:
        """gRPC requests reach the worker without HTTP headers (no Host)."""
        return "Host" not in (self.context.get_all_request_header(idx) or {})

    def _content_types(self, idx: int, row) -> dict[str, str]:
        types: dict[str, str] = {}
        if idx >= len(self.context.request_ids or {}):  # an envelope's extra instance: no headers of its own
            return types
        if self._is_grpc(idx):  # gRPC inputs carry no per-field content types (empty is not "a text field")
            return types
        for name in row:
            header = self.context.get_request_header(idx, name)
            if isinstance(header, dict):
                types[name] = (header.get("content-type", "") or "").lower()
        return types
