"""The servers that serve the .mar: TorchServe (the default) and the python runtime, and where each is named.

``serving start --runtime``, the pipeline's ``serving_runtime`` parameter, the project's ClusterServingRuntimes
(deploy/kserve/) and the images scripts/build-images.sh builds all read this table; docs/decisions.md says when to
choose which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from settings import REPO


@dataclass(frozen=True)
class ServingRuntime:
    """A server for the .mar: its name, the project's ClusterServingRuntime for it (its name and file) and the
    image that one runs (scripts/build-images.sh's name for it)."""

    name: str
    cluster_runtime: str
    manifest: Path
    image: str


#: TorchServe first (the default), then the python runtime (serving.python_runtime: the same archive, answers,
#: ports and key without Java).
SERVING_RUNTIMES = {
    "torchserve": ServingRuntime("torchserve", "mnist-embedding-torchserve",
                                 REPO / "deploy" / "kserve" / "servingruntime.yaml", "serving"),
    "python": ServingRuntime("python", "mnist-embedding-python",
                             REPO / "deploy" / "kserve" / "servingruntime-python.yaml", "serving-python"),
}
DEFAULT_SERVING_RUNTIME = "torchserve"
