"""Run the whole pipeline on this machine with `kfp.local`, each task a subprocess of this Python."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from settings import REPO

from .pipeline import PIPELINE_NAME, mnist_embedding_pipeline

DEPLOY_TASKS = ("deploy-local", "deploy-kserve")


@dataclass(frozen=True)
class OutputArtifact:
    uri: str
    metadata: dict[str, Any]

    @property
    def path(self) -> Path:
        return Path(self.uri)


@dataclass(frozen=True)
class LocalRun:
    """Where one run wrote its outputs: task -> output name -> OutputArtifact or parameter value."""

    run_dir: Path
    outputs: dict[str, dict[str, Any]]

    @property
    def accuracy(self) -> float:
        return float(self.outputs["evaluate"]["Output"])

    @property
    def deployed_by(self) -> str | None:
        return next((task for task in DEPLOY_TASKS if task in self.outputs), None)


@contextlib.contextmanager
def task_environment() -> Iterator[None]:
    """What kfp.local's subprocess tasks need from this process: the repository on their PYTHONPATH.

    Tasks run as `python -m kfp.dsl.executor_main` with this process's environment and working
    directory, so they find the project only through PYTHONPATH.
    """
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), before)))
    try:
        with warnings.catch_warnings():
            # The cluster image's name lacks "python"; locally the tasks run in this interpreter anyway.
            warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
            yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def read_outputs(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Outputs of every task that ran, from the executor_output.json each task wrote."""
    outputs: dict[str, dict[str, Any]] = {}
    for path in sorted(run_dir.glob("*/executor_output.json")):
        data = json.loads(path.read_text())
        task = outputs.setdefault(path.parent.name, dict(data.get("parameterValues", {})))
        for name, entry in data.get("artifacts", {}).items():
            artifact = entry["artifacts"][0]
            task[name] = OutputArtifact(artifact["uri"], artifact.get("metadata", {}))
    return outputs


def run_local(params: dict[str, Any], workdir: Path) -> LocalRun:
    """Run the pipeline with validated `params`; artifacts land in `workdir/<pipeline>-<time>/<task>/`."""
    from kfp import local

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    before = set(workdir.glob(f"{PIPELINE_NAME}-*"))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workdir))
    with task_environment():
        mnist_embedding_pipeline(**params)
    new = sorted(set(workdir.glob(f"{PIPELINE_NAME}-*")) - before)
    if not new:
        raise RuntimeError(f"the run wrote nothing under {workdir}")
    return LocalRun(new[-1], read_outputs(new[-1]))
