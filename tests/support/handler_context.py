"""The handler driven through TorchServe's own Context and RequestProcessor classes, as pytorch/serve's handler
tests do: no server process."""

from __future__ import annotations

import json
from pathlib import Path

from ts.context import Context, RequestProcessor

from handler.embedding_handler import EmbeddingHandler


def make_context(model_dir: Path, handler_settings: dict | None = None, content_types: list[dict] | None = None):
    context = Context("embedding", str(model_dir), {"model": {"modelVersion": "1.0"}}, 8, None, "0.12.0",
                      model_yaml_config={"handler": handler_settings or {}})
    return context


def run_batch(handler: EmbeddingHandler, context: Context, rows: list[dict], headers: list[dict] | None = None):
    context.request_processor = [RequestProcessor(h) for h in (headers or [{} for _ in rows])]
    context.request_ids = {i: f"req-{i}" for i in range(len(rows))}
    out = handler.handle(rows, context)
    return [json.loads(o) for o in out], [context.get_response_status(i)[0] for i in range(len(rows))]
