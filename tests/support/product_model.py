"""The model ./quickstart.sh ships (default training on the bundled sample), for tests of the product's quality.

Training it takes 3-8 minutes on 2 cores (24 epochs), so the artifacts are cached under the user's cache directory,
keyed by a hash of everything that decides them: the training and handler code, the versions of torch and FAISS,
and the command. A change to any of them trains anew; the tests never see a stale model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

from settings import DEFAULT_THREADS, REPO, cache_root

COMMAND = ("-m", "training", "--no-plots", "--threads", str(DEFAULT_THREADS))
INPUTS = ("training", "handler", "settings.py")


def cache_key() -> str:
    digest = hashlib.sha256(" ".join(COMMAND).encode())
    for name in ("torch", "torchao", "faiss-cpu", "numpy", "pillow"):
        digest.update(f"{name}={importlib.metadata.version(name)}".encode())
    for root in INPUTS:
        path = REPO / root
        for file in sorted([path] if path.is_file() else path.rglob("*.py")):
            digest.update(str(file.relative_to(REPO)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _out() -> Path:
    return cache_root() / "test-models" / cache_key()


def _command(out: Path) -> tuple[list[str], dict[str, str]]:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": str(DEFAULT_THREADS)}
    return [sys.executable, *COMMAND, "--out", str(out)], env


def start_training() -> subprocess.Popen | None:
    """Train the artifacts in the background when they are not cached: conftest.py starts this as the session
    begins, so the minutes of training overlap the other tests instead of preceding the ones that need them. None
    when cached. Not niced: ./test.sh runs a second pytest beside this one, and a niced training starved behind
    both (14 minutes of a cold run waiting on it)."""
    out = _out()
    if (out / "metadata.json").is_file():
        return None
    command, env = _command(out)  # its errors show when the fixture trains again after it
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def product_artifacts(background: subprocess.Popen | None = None) -> Path:
    """The quick start's artifacts, trained once per cache key (atomically published by the training CLI); waits
    for `background` (start_training) first, and trains here when that did not publish them."""
    out = _out()
    if background is not None:
        background.wait(timeout=1800)
    if not (out / "metadata.json").is_file():
        command, env = _command(out)
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"training the product model failed: {done.stderr[-2000:]}")
    return out
