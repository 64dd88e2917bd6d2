"""A Google Cloud Storage JSON API server on loopback for the storage tests: gcp-storage-emulator, a pip package
that serves the paths google-cloud-storage calls (bucket and object listing, media download, uploads), in memory,
as its own process from its own environment (requirements/gcs-emulator.txt). google-cloud-storage talks to it
through its documented STORAGE_EMULATOR_HOST variable, with anonymous credentials."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator

from serving.server import free_ports
from support.venvs import venv_python

REQUIREMENTS = "requirements/gcs-emulator.txt"


@contextmanager
def gcs_server() -> Iterator[str]:
    """Start the emulator on a free loopback port; yields the value for STORAGE_EMULATOR_HOST."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([venv_python(REQUIREMENTS), "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                             "--port", str(port), "--in-memory", "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"GCS emulator did not start: {proc.stderr.read().decode()[-500:]}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
