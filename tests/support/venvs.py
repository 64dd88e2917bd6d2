"""Side virtual environments for the tests, one per requirements file (scripts/kserve-storage-venv.sh builds each
once under build/venvs/, named by the file's content hash)."""

from __future__ import annotations

import functools
import subprocess

from settings import REPO


@functools.cache
def venv_python(requirements: str) -> str:
    """The python of the environment holding exactly the pins of `requirements` (a path relative to the repo)."""
    result = subprocess.run([str(REPO / "scripts" / "kserve-storage-venv.sh"), requirements], capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        raise AssertionError(f"kserve-storage-venv.sh {requirements} failed: {result.stderr[-2000:]}")
    return result.stdout.strip().splitlines()[-1]
