"""The import layers, top to bottom: a module imports its own package and the layers below it, never one above.

    pipeline
    queue_bridge
    client
    serving
    handler, training      (one layer: training builds on handler's preprocessing and search)
    torchserve_api         (TorchServe's management API, key file and errors, shared by client and serving)
    settings, cli_common, owned_paths, grpc_codegen   (standard library and PyYAML only)

Every import is read from the source (ast), the lazy ones inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from settings import REPO

LAYERS: tuple[tuple[str, ...], ...] = (
    ("pipeline",),
    ("queue_bridge",),
    ("client",),
    ("serving",),
    ("handler", "training"),
    ("torchserve_api",),
    ("settings", "cli_common", "owned_paths", "grpc_codegen"),
)
LEVEL = {name: depth for depth, names in enumerate(LAYERS) for name in names}


def module_files(name: str) -> list[Path]:
    """The source files of a top-level package or module of the repository."""
    package = REPO / name
    return sorted(package.rglob("*.py")) if package.is_dir() else [REPO / f"{name}.py"]


def imported_roots(source: str, own: str) -> set[str]:
    """Top-level names a module's source imports; relative imports count as its own package `own`."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add(own if node.level else (node.module or "").split(".")[0])
    return roots


def upward_imports(name: str, source: str) -> set[str]:
    """The layered packages above `name`'s layer that `source` imports."""
    return {root for root in imported_roots(source, name) if root in LEVEL and LEVEL[root] < LEVEL[name]}


@pytest.mark.parametrize("name", sorted(LEVEL))
def test_no_layer_imports_one_above_it(name):
    files = module_files(name)
    assert files and all(path.is_file() for path in files), f"{name}: no source found"
    offences = [f"{path.relative_to(REPO)} imports {', '.join(sorted(roots))}"
                for path in files if (roots := upward_imports(name, path.read_text()))]
    assert offences == []


def test_the_check_sees_lazy_relative_and_upward_imports():
    source = "from . import a\ndef f():\n    from client.api import EmbeddingClient\n    import pipeline.cli\n"
    assert imported_roots(source, "serving") == {"serving", "client", "pipeline"}
    assert upward_imports("serving", source) == {"client", "pipeline"}
    assert upward_imports("training", "import handler.search\nfrom settings import REPO") == set()
    assert upward_imports("handler", "from training.steps import prepare_data") == set()
    assert upward_imports("torchserve_api", "from serving.server import stop") == {"serving"}
    assert upward_imports("queue_bridge", "from pipeline import cli") == {"pipeline"}
