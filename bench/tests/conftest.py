"""bench's tests use the project's test fixtures (a tiny trained model, its archive, a real TorchServe).

The project's tests/conftest.py is loaded under another module name and its fixtures are re-exported here, so
`pytest bench/tests` works on its own and tests/ never has to know about bench. The helper modules in
tests/support are importable the way the project's tests import them (`from support.x import y`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """bench's tests get the project's markers (unit / integration by directory, serving by fixture)."""
    _project.pytest_collection_modifyitems([item for item in items if BENCH_TESTS in Path(str(item.fspath)).parents])
