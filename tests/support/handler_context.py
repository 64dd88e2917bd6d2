"""The handler driven through TorchServe's own Context and RequestProcessor classes, as pytorch/serve's handler
tests do: no server process."""

from __future__ import annotations

import json
from pathlib import Path

import ts
from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from handler.embedding_handler import EmbeddingHandler


def make_context(model_dir: Path, handler_settings: dict | None = None) -> Context:
    """A Context as a TorchServe 0.12 worker builds it, with the metrics cache its worker gives the handler."""
    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    return Context("embedding", str(model_dir), {"model": {"modelVersion": "1.0"}}, 8, None, "0.12.0",
                   metrics=metrics, model_yaml_config={"handler": handler_settings or {}})


def run_batch(handler: EmbeddingHandler, context: Context, rows: list[dict], headers: list[dict] | None = None):
    context.request_processor = [RequestProcessor(h) for h in (headers or [{} for _ in rows])]
    context.request_ids = {i: f"req-{i}" for i in range(len(rows))}
    context.metrics.set_request_ids(context.request_ids)
    out = handler.handle(rows, context)
    return [json.loads(o) for o in out], [context.get_response_status(i)[0] for i in range(len(rows))]
