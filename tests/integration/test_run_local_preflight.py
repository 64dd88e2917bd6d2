"""`python -m pipeline run-local` fails before training when it could not finish (a taken port, no Java, no config,
no data folder), on one line naming the fix; and a task that fails ends the run with its cause on the last line,
without the tasks' third-party noise (faiss's loader lines, colour codes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.server import private_instance
from settings import REPO

#: A failing preflight costs the CLI's imports only (kfp, torch); training one epoch takes minutes under load.
FAST_S = 60


def _run_local(cwd: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipeline", "run-local", "--workdir", str(cwd / "runs"),
                           "--epochs", "1", "--embedding-dim", "8", "--width", "4", *args],
                          cwd=cwd, env=environ, capture_output=True, text=True, timeout=600)
    return proc, time.monotonic() - started


def _one_line_before_training(proc: subprocess.CompletedProcess, seconds: float, cwd: Path) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("pipeline: error: ") and "Traceback" not in proc.stderr
    assert "Executing task" not in proc.stdout and not list(cwd.glob("runs/mnist-embedding-*")), proc.stdout[-2000:]
    assert seconds < FAST_S, f"{seconds:.0f} s"
    return lines[0]


@pytest.fixture
def serve(tmp_path) -> tuple[Path, Path]:
    """A serve workdir and its config on free loopback ports: (workdir, config)."""
    instance = private_instance(tmp_path / "serve")
    return instance.workdir, instance.config


def test_a_taken_port_fails_before_training(tmp_path, serve):
    workdir, config = serve
    from serving.server import Instance

    port = Instance(workdir, config).endpoints.ports()["management"]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        proc, seconds = _run_local(tmp_path, "--serve-workdir", str(workdir), "--serve-config", str(config))
    line = _one_line_before_training(proc, seconds, tmp_path)
    assert f"port {port} (management) by python" in line and f"pid {os.getpid()}" in line, line
    assert "--serve-config" in line


@pytest.mark.parametrize("case", ["no java", "no config", "no data folder"])
def test_what_deploy_needs_is_checked_before_training(tmp_path, serve, case):
    workdir, config = serve
    args = ["--serve-workdir", str(workdir), "--serve-config", str(config)]
    env = {}
    if case == "no java":
        env["PATH"] = str(tmp_path / "empty-path")
        expected = "java not found"
    elif case == "no config":
        args[-1] = str(tmp_path / "missing.properties")
        expected = "missing.properties: cannot read it"
    else:
        args += ["--data-source", f"folder:{tmp_path / 'my-digits'}"]
        expected = "my-digits is not a folder"
    proc, seconds = _run_local(tmp_path, *args, **env)
    assert expected in _one_line_before_training(proc, seconds, tmp_path)


def test_a_failed_task_ends_with_its_cause_on_the_last_line(tmp_path):
    """A data folder whose IDX files are not IDX files passes the preflight; the load-data task fails."""
    data = tmp_path / "idx"
    data.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (data / name).write_bytes(b"not an IDX file")
    proc, _ = _run_local(tmp_path, "--deploy-target", "none", "--data-source", f"idx:{data}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("pipeline: error: local run failed: task load-data failed: DataError: "), last
    assert "train-images-idx3-ubyte: bad magic" in last and "\x1b[" not in last
    assert "Traceback" in proc.stdout  # the task's own output is still there, above
    assert "faiss" not in proc.stdout + proc.stderr
    assert "have no effect in the current local runner" not in proc.stderr


def test_the_python_runtime_needs_no_java_nor_the_management_port(serve, monkeypatch):
    """serving_runtime=python serves without Java and without TorchServe's management API: neither a missing
    java nor a taken management port stops it, while TorchServe's check names it as the way out."""
    from pipeline import params as P
    from pipeline import preflight
    from serving.server import Instance

    workdir, config = serve
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)
    port = Instance(workdir, config).endpoints.ports()["management"]
    common = {"deploy_target": "local", "serve_workdir": str(workdir), "serve_config": str(config)}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        preflight.check_run(P.validate({**common, "serving_runtime": "python"}))
        with pytest.raises(preflight.PreflightError, match="java not found.*--serving-runtime python"):
            preflight.check_run(P.validate(common))
