"""Run the whole pipeline on this machine with `kfp.local`, each task a subprocess of this Python."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, TextIO

from settings import REPO

from .pipeline import PIPELINE_NAME, mnist_embedding_pipeline

DEPLOY_TASKS = ("deploy-local", "deploy-kserve")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Lines of a task's output (kfp.local indents them, its executor's log prefixes them) that say nothing about the
#: run: faiss's loader probing for AVX512/AVX2 builds.
NOISE = re.compile(r"^\s*(\[KFP Executor [^]]*\]: (Loading faiss|Could not load library with|Successfully loaded faiss)"
                   r"|ModuleNotFoundError\(\"No module named 'faiss\.)")


class TaskFailed(RuntimeError):
    """A task of the run failed; the message is one line: the task and the cause its traceback ended with."""


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
            # Task resources are for the cluster; kfp.local says so once per task.
            warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*",
                                    category=UserWarning)
            yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


class TaskOutput:
    """sys.stdout while kfp.local runs the tasks (it prints each line of their output): passes the lines through,
    without faiss's loader chatter, and keeps the last exception line of a traceback, the cause of a failure."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.cause = ""
        self._partial = ""
        self._traceback_indent: int | None = None

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def _line(self, line: str) -> None:
        if NOISE.match(line):
            return
        self.out.write(line + "\n")
        plain = ANSI.sub("", line).rstrip()
        indent = len(plain) - len(plain.lstrip())
        if plain.lstrip().startswith("Traceback (most recent call last)"):
            self._traceback_indent = indent
        elif self._traceback_indent is not None and plain and indent <= self._traceback_indent:
            self._traceback_indent = None  # frames are indented deeper; this is the exception line
            name, sep, message = plain.strip().partition(": ")
            self.cause = f"{name.rsplit('.', 1)[-1]}{sep}{message}"


def failed_task(message: str) -> str:
    """The innermost failed task named in kfp.local's RuntimeError (colour codes and all)."""
    plain = ANSI.sub("", message)
    found = re.search(r"Inner task failed: '([^']+)'", plain) or re.search(r"Task '([^']+)'", plain)
    return found.group(1) if found else "a task"


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
    output = TaskOutput(sys.stdout)
    with task_environment(), contextlib.redirect_stdout(output):  # type: ignore[type-var]
        try:
            mnist_embedding_pipeline(**params)
        except RuntimeError as exc:
            task = failed_task(str(exc))
            raise TaskFailed(f"task {task} failed: {output.cause}" if output.cause
                             else f"task {task} failed (its output is above)") from None
    new = sorted(set(workdir.glob(f"{PIPELINE_NAME}-*")) - before)
    if not new:
        raise RuntimeError(f"the run wrote nothing under {workdir}")
    return LocalRun(new[-1], read_outputs(new[-1]))
