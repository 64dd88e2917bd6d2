"""Every command line answers a user's mistake with one line on stderr and a documented exit status, never a
traceback: a missing file, a folder given for a file, an output that cannot be written, a malformed URL, an
unknown or old flag. Each case runs the real command as a subprocess and must fail before any slow work
(training, TorchServe, a broker or a cluster is never needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from settings import REPO

PY = (sys.executable, "-m")
DIGEST = "sha256:" + "a" * 64
NOT_A_DIR = "README.md/sub"  # a path under a regular file: nothing can be written there, even as root

CASES: list[tuple[str, tuple[str, ...], int, str]] = [
    # python -m training
    ("training unknown flag", (*PY, "training", "--bogus"), 2, "unrecognized arguments: --bogus"),
    ("training old flag", (*PY, "training", "--data", "mnist-sample", "-k", "3"), 2,
     "unrecognized arguments: --data"),
    ("training malformed URL", (*PY, "training", "--data-source", "s3://"), 2, "argument --data-source"),
    ("training unwritable out", (*PY, "training", "--out", NOT_A_DIR), 2, "--out README.md/sub"),
    # python -m training eval
    ("eval missing artifacts", (*PY, "training", "eval", "--artifacts", "/nonexistent"), 2, "no such folder"),
    ("eval old flag", (*PY, "training", "eval", "--json", "x.json"), 2, "unrecognized arguments: --json"),
    ("eval out is a folder", (*PY, "training", "eval", "--artifacts", "docs", "--out", "docs"), 2,
     "--out docs: is a folder"),
    # python -m training enroll
    ("enroll unwritable out", (*PY, "training", "enroll", "--artifacts", "docs", "--data-source", "folder:/x",
                               "--out", NOT_A_DIR), 2, "is not a folder"),
    # python -m serving
    ("serving missing config", (*PY, "serving", "--config", "/nonexistent.properties", "start"), 2,
     "--config /nonexistent.properties: no such file"),
    ("serving config not key=value", (*PY, "serving", "--config", "README.md", "stop"), 2,
     "write key=value (a ':' or whitespace separator"),
    ("serving config is a folder", (*PY, "serving", "--config", "docs", "stop"), 2, "is a folder, not a file"),
    ("serving workdir is a file", (*PY, "serving", "--workdir", "README.md", "start"), 2,
     "--workdir README.md: is a file"),
    ("serving missing model store", (*PY, "serving", "start", "--model-store", "/nonexistent"), 2, "no such folder"),
    ("serving unwritable samples", (*PY, "serving", "samples", "--out", NOT_A_DIR), 2, "is not a folder"),
    ("serving predict is gone", (*PY, "serving", "predict", "x.png"), 2, "invalid choice: 'predict'"),
    ("serving unknown flag", (*PY, "serving", "--bogus", "stop"), 2, "unrecognized arguments: --bogus"),
    # python -m pipeline
    ("compile unwritable out", (*PY, "pipeline", "compile", "--out", f"{NOT_A_DIR}/p.yaml"), 2, "is not a folder"),
    ("run-local workdir is a file", (*PY, "pipeline", "run-local", "--workdir", "README.md"), 2, "is a file"),
    ("run-local bad k", (*PY, "pipeline", "run-local", "-k", "x"), 2, "argument -k/--k"),
    ("pipeline old flag", (*PY, "pipeline", "run-local", "--data", "x"), 2, "unrecognized arguments: --data"),
    ("submit malformed URL", (*PY, "pipeline", "submit", "--host", "http://[bad"), 2, "argument --host"),
    ("rollback bad timeout", (*PY, "pipeline", "rollback", "--to", "1.0", "--timeout", "-1"), 2,
     "argument --timeout"),
    ("runtime unwritable out", (*PY, "pipeline", "runtime", "--image", f"r/i@{DIGEST}", "--out", f"{NOT_A_DIR}/r"),
     2, "is not a folder"),
    # python -m queue_bridge
    ("queue malformed URL", (*PY, "queue_bridge", "--url", "localhost", "call", "README.md"), 2, "argument --url"),
    ("queue missing image", (*PY, "queue_bridge", "call", "/nonexistent.png"), 2, "/nonexistent.png: no such file"),
    ("queue folder image", (*PY, "queue_bridge", "call", "docs"), 2, "docs: is a folder"),
    ("queue missing key file", (*PY, "queue_bridge", "serve", "--key-file", "/nonexistent"), 2, "no such file"),
    ("queue old flag", (*PY, "queue_bridge", "serve", "--model", "x"), 2, "unrecognized arguments: --model"),
    ("queue old body flag", (*PY, "queue_bridge", "call", "README.md", "--json"), 2, "unrecognized arguments"),
    # ./archive.sh
    ("archive missing artifacts", ("./archive.sh", "--artifacts", "/nonexistent"), 2, "no such folder"),
    ("archive empty version", ("./archive.sh", "--model-version", ""), 2, "invalid model version ''"),
    ("archive export path is a file", ("./archive.sh", "--export-path", "README.md", "--no-train"), 2,
     "--export-path README.md: is a file"),
    ("archive config is a folder", ("./archive.sh", "--model-config", "docs"), 2, "is a folder, not a file"),
    ("archive old flag", ("./archive.sh", "--version", "2.0"), 2, "unrecognized arguments: --version"),
    # python -m client
    ("client missing image", (*PY, "client", "predict", "/nonexistent.png"), 2, "/nonexistent.png"),
    ("client malformed URL", (*PY, "client", "predict", "README.md", "--url", "http://[bad"), 2, "--url"),
    ("client missing key file", (*PY, "client", "status", "--key-file", "/nonexistent"), 2, "/nonexistent"),
    ("client key file is a folder", (*PY, "client", "status", "--key-file", "docs"), 2, "docs"),
    ("client unwritable out", (*PY, "client", "embed", "SECURITY.md", "--out", f"{NOT_A_DIR}/e.npy"), 2,
     "README.md/sub"),
    ("client out inside its input", (*PY, "client", "predict", "docs", "--out", "docs/answers.csv"), 2,
     "--out docs/answers.csv: the command reads from"),
    ("client out over a user's file", (*PY, "client", "predict", "SECURITY.md", "--out", "README.md"), 2,
     "--out README.md: exists and was not written by this command"),
    ("lifecycle-config over its base", (*PY, "client", "lifecycle-config", "--out", "config.properties"), 2,
     "--out config.properties: the command reads from"),
    ("client old flag", (*PY, "client", "status", "--model", "x"), 2, "unrecognized arguments: --model"),
]


@pytest.mark.parametrize(("argv", "code", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_mistake_is_one_line_and_an_exit_status(argv: tuple[str, ...], code: int, message: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PIPELINE_IMAGE": "", "KUBECONFIG": "/nonexistent"}
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, result.stderr
    assert result.returncode == code, result.stderr
    assert message in lines[0]
    assert "error: " in lines[0]
