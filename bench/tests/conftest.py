"""bench's tests use the project's test fixtures (a tiny trained model, its archive, a real TorchServe).

The project's tests/conftest.py is loaded under another module name and its fixtures are re-exported here, so
`pytest bench/tests` works on its own and tests/ never has to know about bench. The helper modules in
tests/support are importable the way the project's tests import them (`from support.x import y`).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PROJECT_TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(PROJECT_TESTS))  # `support`, as tests/conftest.py makes it importable


def _load_project_conftest():
    spec = importlib.util.spec_from_file_location("project_conftest", PROJECT_TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_project = _load_project_conftest()

prepared_sample = _project.prepared_sample
tiny_artifacts = _project.tiny_artifacts
model_store = _project.model_store
torchserve = _project.torchserve

BENCH_TESTS = Path(__file__).resolve().parent


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """bench's tests get the project's markers (unit / integration by directory, serving by fixture); when
    tests/conftest.py is loaded too (the whole suite), its own hook has already marked every item."""
    project_file = str(PROJECT_TESTS / "conftest.py")
    if any(getattr(plugin, "__file__", None) == project_file for plugin in config.pluginmanager.get_plugins()):
        return
    _project.pytest_collection_modifyitems([item for item in items if BENCH_TESTS in Path(str(item.fspath)).parents])
