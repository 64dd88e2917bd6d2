"""TorchServe's config.properties as both serving runtimes read it: the model snapshot (which model, which versions,
which archive each) and the request limits."""

from __future__ import annotations

import json
from pathlib import Path

#: TorchServe's own defaults where config.properties names none.
DEFAULT_MAX_REQUEST_SIZE = 6553500
DEFAULT_RESPONSE_TIMEOUT_S = 120.0


class RuntimeConfigError(Exception):
    """The configuration cannot be served; the message (one line) says why."""


def snapshot_models(props: dict[str, str], ts_config: Path) -> dict:
    """model_snapshot's models: {name: {version: entry}}; RuntimeConfigError when it lists none."""
    try:
        models = json.loads(props["model_snapshot"])["models"]
        if not isinstance(models, dict):
            raise ValueError
        return models
    except (KeyError, ValueError, TypeError):
        raise RuntimeConfigError(f"{ts_config}: model_snapshot must list the model to serve") from None


def served_model(models: dict, ts_config: Path, model: str | None) -> tuple[str, dict]:
    """(name, {version: entry}) of the model to serve: `model`, or the only one model_snapshot lists."""
    if model is None:
        if len(models) != 1:
            raise RuntimeConfigError(f"{ts_config}: model_snapshot lists {len(models)} models; pass --model-name")
        model = next(iter(models))
    if model not in models:
        raise RuntimeConfigError(f"{ts_config}: model {model!r} is not in model_snapshot")
    return model, models[model]


def default_version(entries: dict) -> str:
    """The version that answers paths naming none: model_snapshot's defaultVersion, else its first."""
    return next((v for v, e in entries.items() if isinstance(e, dict) and e.get("defaultVersion")),
                next(iter(entries), ""))


def request_limits(props: dict[str, str]) -> tuple[int, float]:
    """(max_request_size in bytes, default_response_timeout in seconds), TorchServe's defaults where unset."""
    return (int(props.get("max_request_size", DEFAULT_MAX_REQUEST_SIZE)),
            float(props.get("default_response_timeout", DEFAULT_RESPONSE_TIMEOUT_S)))
