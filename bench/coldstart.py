"""Cold start: `./archive.sh` with existing artifacts (no training) and the size of the .mar it writes.

Start-to-READY is measured on the shipped configuration's server by `bench.run` (stop/start
cycles of the same instance), with `serving.server.start`, which returns exactly that time.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from settings import MODEL_NAME, REPO

from .stats import mid, summarize

Log = Callable[[str], None]


def archive_times(artifacts: Path, export: Path, trials: int, log: Log = print) -> dict[str, Any]:
    """Wall time of `./archive.sh --artifacts A --export-path E --no-train`, repeated."""
    times = []
    for _ in range(trials):
        started = time.perf_counter()
        done = subprocess.run([str(REPO / "archive.sh"), "--artifacts", str(artifacts), "--export-path", str(export),
                               "--no-train"], check=False, cwd=REPO, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"archive.sh failed: {(done.stderr or done.stdout).strip()[-300:]}")
        times.append(elapsed)
    mar = export / f"{MODEL_NAME}.mar"
    result: dict[str, Any] = {"archive_s": summarize(times), "mar_mb": mar.stat().st_size / 1e6, "artifacts": str(artifacts)}
    log(f"  archive.sh {mid(result['archive_s']):.2f} s, .mar {result['mar_mb']:.1f} MB")
    return result
