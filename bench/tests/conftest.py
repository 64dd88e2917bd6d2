"""bench's own test helpers. The project's fixtures (a tiny trained model, its archive, a real TorchServe) and
markers come from the repository's root conftest.py, shared with tests/, so the whole suite builds them once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def raw_fields(value: Any, path: str = "") -> list[str]:
    """Where `value` still holds raw records or the values behind a median (none may be left in a summary)."""
    from bench.output import RAW_RECORDS, SUMMARY_VALUES

    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (list, dict)) and (key in RAW_RECORDS or ("median" in value and key == SUMMARY_VALUES)):
                found.append(f"{path}.{key}")
            found += raw_fields(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += raw_fields(item, f"{path}[{i}]")
    return found


@pytest.fixture
def written() -> Callable[..., dict[str, Any]]:
    """`written(out, name, render)`: checks what a benchmark wrote into `out` and returns its full record.

    raw/NAME.json holds the full record, NAME.summary.json the compact one, with no raw records left, and the
    summary alone renders NAME.md as the full record did (`render`: the benchmark's report function).
    """
    from bench.output import raw_path, summary_path

    def check(out: Path, name: str, render: Callable[[dict[str, Any]], str] | None = None) -> dict[str, Any]:
        full = json.loads(raw_path(out, name).read_text())
        summary = json.loads(summary_path(out, name).read_text())
        assert raw_fields(summary) == []
        assert not (out / f"{name}.json").exists()
        if render is not None:
            assert render(summary) == render(full) == (out / f"{name}.md").read_text()
        return full

    return check

