"""python -m pipeline run-local: check what the run needs, run every task here with kfp.local (pipeline.local_run),
and say what came out: the outputs, the quality gate's figures, and the served answer for a sample digit."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from owned_paths import mark

from . import preflight

SAMPLE_DIGIT = 7


class RunLocalError(Exception):
    """One-line reason the local run could not start or finish."""


def run(workdir: Path, serve_workdir: str, values: dict[str, Any]) -> None:
    """Run the pipeline with validated `values` under `workdir`, after the preflight; `serve_workdir` as given
    (''; the run's TorchServe then works in workdir/serve). RunLocalError (one line) when it cannot."""
    from handler.artifacts import read_metadata

    from .local_run import run_local
    from .quality import judge

    workdir = workdir.resolve()
    values["serve_workdir"] = str(Path(values["serve_workdir"] or workdir / "serve").resolve())
    if values["serve_config"]:
        values["serve_config"] = str(Path(values["serve_config"]).resolve())
    try:
        preflight.check_run(values)
    except preflight.PreflightError as exc:
        raise RunLocalError(str(exc)) from None
    _make_marked(workdir, preflight.RUNS_KIND)
    if serve_workdir:
        _make_marked(Path(values["serve_workdir"]), preflight.SERVE_KIND)
    try:
        result = run_local(values, workdir)
    except RuntimeError as exc:  # TaskFailed: the task and the cause its traceback ended with
        sys.stdout.flush()
        raise RunLocalError(f"local run failed: {exc}") from None
    print(f"\nrun outputs: {result.run_dir}")
    for task, outputs in result.outputs.items():
        for name, value in outputs.items():
            print(f"  {task}.{name}: {_describe(value)}")
    gate = judge(read_metadata(result.outputs["evaluate"]["evaluated"].path), values).summary
    if result.deployed_by:
        print(f"quality gate passed ({gate}): {result.deployed_by}")
    else:
        reason = "deploy_target=none" if values["deploy_target"] == "none" else "quality gate not passed"
        print(f"not deployed: {reason} ({gate})")
    if result.deployed_by == "deploy-local":
        print(f"served answer for digit {SAMPLE_DIGIT}: {json.dumps(ask_local(values, workdir))}")


def _make_marked(folder: Path, kind: str) -> None:
    """Create `folder` (checked by preflight.check_outputs) and mark it as run-local's, so later runs may write there."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        mark(folder, kind, "python -m pipeline run-local")
    except OSError as exc:
        raise RunLocalError(f"cannot write {folder}: {exc.strerror}") from None


def _describe(value: Any) -> str:
    """A path for artifacts written to disk; metadata for those that are metadata only (metrics)."""
    from .local_run import OutputArtifact

    if isinstance(value, OutputArtifact):
        return value.uri if value.path.exists() else json.dumps(value.metadata)
    return json.dumps(value)


def ask_local(values: dict[str, Any], workdir: Path) -> dict:
    """Send one sample digit to the TorchServe the run just started."""
    from client.api import EmbeddingClient
    from client.errors import BadImageError
    from serving.samples import write_samples

    from .local_serving import local_instance

    instance = local_instance(values["model_name"], values["serve_workdir"], values["serve_config"])
    image = write_samples(workdir / "samples")[SAMPLE_DIGIT]
    with EmbeddingClient(instance.endpoints.inference, model=instance.model_name,
                         token=instance.keys().get("inference")) as client:
        try:
            return client.predict(image)
        except BadImageError as exc:
            return exc.answer()
