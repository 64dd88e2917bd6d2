"""The .mar's handler core in this process: what :class:`handler.embedding_handler.EmbeddingHandler` does under
TorchServe, for a batch of request rows, without TorchServe's context.

Each stage is the handler's own: rows are read by :func:`handler.protocols.read_row`, images prepared and answered
by :class:`handler.service.EmbeddingService` (one forward pass and one search per batch), and each request's answer
written by :func:`handler.protocols.encode_batch` with the archive's model version, the very function the handler
answers with. Settings come from the archive's model-config.yaml ``handler:`` section, as the handler reads them.
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from handler.preprocessing import DEFAULT_MAX_PIXELS
from handler.metric_names import baseline_values
from handler.protocols import encode_batch, read_row
from handler.service import DEFAULT_RUNTIME, BatchTimings, EmbeddingService

logger = logging.getLogger("python_runtime")

Row = tuple[Mapping[str, Any], Mapping[str, str]]


def serving_device(setting: str) -> str:
    """The torch device of a ``handler.device`` setting here: ``auto`` and ``cpu`` serve on the CPU (this runtime
    has no GPU assignment); ``cuda`` / ``cuda:N`` are refused when CUDA is unavailable."""
    setting = (setting or "auto").strip().lower()
    if setting in ("auto", "cpu"):
        return "cpu"
    if setting == "cuda" or setting.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"handler.device={setting} but CUDA is not available")
        return "cuda:0" if setting == "cuda" else setting
    raise ValueError(f"handler.device must be auto, cpu, cuda or cuda:N, got {setting!r}")


@dataclass
class BatchAnswer:
    """One batch's answers (HTTP status and JSON text per request, in order) and its figures."""

    replies: list[tuple[int, bytes]]
    images: int
    timings: BatchTimings
    seconds: float


class HandlerCore:
    """One model version's verified artifacts, loaded once; answers batches of rows as the handler does."""

    def __init__(self, model_name: str, model_dir: Path, version: str, settings: Mapping[str, Any]) -> None:
        threads = int(settings.get("threads", 0))
        if threads > 0:
            torch.set_num_threads(threads)
        self.model_name = model_name
        #: The archive's version (its manifest's modelVersion), written into every answer as the handler does.
        self.version = version
        started = time.perf_counter()
        self.service = EmbeddingService.from_dir(
            model_dir, device=serving_device(str(settings.get("device", "auto"))),
            max_pixels=int(settings.get("max_image_pixels", DEFAULT_MAX_PIXELS)),
            runtime=str(settings.get("runtime", DEFAULT_RUNTIME)).strip().lower(), threads=threads or None)
        self.load_seconds = time.perf_counter() - started

    def answer(self, rows: Sequence[Row]) -> BatchAnswer:
        """Preprocess, one forward pass and one search, and each request's answer: EmbeddingHandler's
        preprocess, inference and postprocess for a batch in which each row is its own request."""
        started = time.perf_counter()
        requests = [read_row(row, types) for row, types in rows]
        prepared = self.service.prepare([item for request in requests for item in request.items])
        embedding = [request.embedding for request in requests for _ in request.items]
        answers, timings = self.service.predict(prepared, embedding)
        replies = [(status, text.encode())
                   for status, text in encode_batch(requests, answers, self.model_name, self.version)]
        return BatchAnswer(replies, len(answers), timings, time.perf_counter() - started)

    def warm_up(self) -> None:
        """Answer one drawn digit before serving: the first image pays for the image decoders' lazy set-up
        (about 0.2 s), which would otherwise land on the first caller of each worker."""
        from PIL import Image, ImageDraw

        image = Image.new("L", (56, 56), 255)
        ImageDraw.Draw(image).line([(28, 8), (28, 48)], fill=0, width=6)
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        self.answer([({"body": buffer.getvalue()}, {"body": "image/png"})])

    def baseline(self) -> dict[str, float]:
        """The drift-baseline gauges' values (handler.metric_names.baseline_values); empty when none recorded."""
        return baseline_values(self.service.metadata.drift_baseline)
