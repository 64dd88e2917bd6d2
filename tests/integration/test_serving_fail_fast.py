"""`python -m serving start` on an archive TorchServe cannot load: a one-line reason within seconds, nothing left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from support.torchserve import torchserve_processes

from serving.server import private_instance
from settings import REPO

START_TIMEOUT = 120
#: The most seconds from TorchServe's "Failed to load model" line to the command's exit.
AFTER_FAILURE = 10


def failure_logged_at(ts_log: Path) -> datetime:
    """Local time of TorchServe's first "Failed to load model" record (log4j: 2026-11-26T23:49:46,845)."""
    line = next(line for line in ts_log.read_text(errors="replace").splitlines() if "Failed to load model:" in line)
    return datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S,%f")


@pytest.mark.serving
def test_start_of_a_truncated_archive_fails_fast_with_one_line(model_store, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    archive = (model_store / "embedding.mar").read_bytes()
    (store / "embedding.mar").write_bytes(archive[: len(archive) // 2])
    instance = private_instance(tmp_path / "ts")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "serving", "--config", str(instance.config), "--workdir",
                             str(instance.workdir), "start", "--model-store", str(store), "--timeout",
                             str(START_TIMEOUT)], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=START_TIMEOUT + 60)
    returned, wall = datetime.now(), time.monotonic() - started
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("serving: error: TorchServe failed to load model embedding.mar: ")
    assert "EOFException" in lines[0] or "ZipException" in lines[0], lines[0]
    assert (returned - failure_logged_at(instance.workdir / "logs" / "ts_log.log")).total_seconds() < AFTER_FAILURE
    assert wall < START_TIMEOUT / 2
    assert instance.pid() is None and torchserve_processes(instance.workdir) == []
