"""TorchServe entry point: wires TorchServe's context to :class:`handler.service.EmbeddingService`.

Settings come from the ``handler:`` section of model-config.yaml (k, max_image_pixels, threads).
"""

from __future__ import annotations

import json
import logging
import os
from http import HTTPStatus

import torch
from ts.torch_handler.base_handler import BaseHandler

from handler.artifacts import ArtifactError
from handler.preprocessing import DEFAULT_MAX_PIXELS
from handler.requests import RequestError, decode_request
from handler.service import EmbeddingService, record_metrics

logger = logging.getLogger(__name__)


class EmbeddingHandler(BaseHandler):
    """Image bytes -> embedding -> FAISS k-NN answer, one JSON answer per request of the batch."""

    def initialize(self, context) -> None:
        properties = context.system_properties
        settings = (context.model_yaml_config or {}).get("handler", {}) or {}
        threads = int(settings.get("threads", 0))
        if threads > 0:
            torch.set_num_threads(threads)
        gpu_id = properties.get("gpu_id")
        device = f"cuda:{gpu_id}" if gpu_id is not None and torch.cuda.is_available() else "cpu"
        try:
            self.service = EmbeddingService.from_dir(
                properties["model_dir"], device=device, k=settings.get("k"),
                max_pixels=int(settings.get("max_image_pixels", DEFAULT_MAX_PIXELS)),
            )
        except ArtifactError as exc:
            logger.error("refusing to load model %s: %s", context.model_name, exc)
            raise
        self.context = context
        self.initialized = True
        meta = self.service.metadata
        logger.info("loaded %s on %s: gallery %d x %d (%s), k=%d, threshold %.4f, accuracy %.4f, threads %d",
                    context.model_name, device, self.service.searcher.index.ntotal, self.service.searcher.dim,
                    meta["index"]["type"], self.service.searcher.k, meta["threshold"],
                    meta["metrics"]["accuracy"], torch.get_num_threads())

    def preprocess(self, data):
        payloads = []
        for idx, row in enumerate(data):
            try:
                payloads.append(decode_request(row, self._content_types(idx, row)))
            except RequestError as exc:
                payloads.append(exc)
        return payloads

    def inference(self, data, *args, **kwargs):
        return self.service.answer(data)

    def postprocess(self, data):
        answers, _ = data
        # Behind a KServe envelope the rows are the instances of one request, not one row per request:
        # per-request status and headers only apply when each row is its own request.
        per_request = len(answers) == len(self.context.request_ids or {})
        version = (self.context.manifest or {}).get("model", {}).get("modelVersion")
        out = []
        for idx, answer in enumerate(answers):
            if "error" not in answer and version:
                answer = {**answer, "model_version": version}
            if per_request:
                if "error" in answer:
                    # The standard phrase, never the message: TorchServe 0.12 frames the phrase by characters
                    # but writes UTF-8 bytes, so client text in it could desynchronise the worker protocol.
                    self.context.set_response_status(answer["status"], HTTPStatus(answer["status"]).phrase, idx)
                self.context.set_response_content_type(idx, "application/json")
                if self._is_grpc(idx):
                    # Ends a gRPC StreamPredictions call after its one answer; without it TorchServe 0.12
                    # fails the call ("Worker died") and restarts the worker. Never on HTTP, where the
                    # header turns the answer into a stream whose head is never sent.
                    self.context.set_response_header(idx, "ts_stream_next", "false")
            out.append(json.dumps(answer))
        return out

    def handle(self, data, context):
        self.context = context
        answers, timings = self.inference(self.preprocess(data))
        ids = ",".join((context.request_ids or {}).values())
        logger.info("batch=%d rejected=%d unknown=%d preprocess_ms=%.2f embed_ms=%.2f search_ms=%.2f pid=%d ids=%s",
                    len(data), timings.rejected, timings.unknown, 1e3 * timings.preprocess,
                    1e3 * timings.embed, 1e3 * timings.search, os.getpid(), ids)
        if context.metrics is not None:
            record_metrics(context.metrics, len(data), timings)
        return self.postprocess((answers, timings))

    def _is_grpc(self, idx: int) -> bool:
        """gRPC requests reach the worker without HTTP headers (no Host)."""
        return "Host" not in (self.context.get_all_request_header(idx) or {})

    def _content_types(self, idx: int, row) -> dict[str, str]:
        types: dict[str, str] = {}
        if idx >= len(self.context.request_ids or {}):  # an envelope's extra instance: no headers of its own
            return types
        for name in row:
            header = self.context.get_request_header(idx, name)
            if isinstance(header, dict):
                types[name] = (header.get("content-type", "") or "").lower()
        return types
