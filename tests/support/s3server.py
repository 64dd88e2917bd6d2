"""A real S3 API server on loopback for the storage tests: moto's standalone server (``python -m moto.server``).

Why moto: it is a pip package (no registry image or binary download, which these machines cannot fetch),
runs as its own process speaking S3's REST API over HTTP, and both boto3 (the pipeline's upload) and
KServe's storage code (the storage initializer's download) talk to it through their ordinary endpoint
settings, exactly as they would to MinIO. It keeps objects in memory and does not check signatures.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

from settings import REPO
from serving.server import free_ports

EXAMPLE_SECRET = REPO / "deploy" / "kserve" / "storage-credentials.example.yaml"

ACCESS_KEY, SECRET_KEY, REGION = "test-access-key", "test-secret-key", "us-east-1"


@contextmanager
def s3_server() -> Iterator[str]:
    """Start moto's S3 server on a free loopback port; yields its endpoint URL and stops it afterwards."""
    (port,) = free_ports(1)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto S3 server did not start: {proc.stderr.read().decode()[-500:]}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def client_env(endpoint: str) -> dict[str, str]:
    """What a pipeline task gets from its storage Secret: the AWS SDK's own variables."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint}


def storage_initializer_env(secret: dict, endpoint: str) -> dict[str, str]:
    """The storage initializer's environment as KServe's credential builder derives it from an S3 Secret in
    KServe's format (deploy/kserve/storage-credentials.example.yaml), pointed at `endpoint` instead of the
    example's address. Only the keys the example uses."""
    notes = secret["metadata"].get("annotations", {})
    https = notes.get("serving.kserve.io/s3-usehttps", "1")
    host = endpoint.split("://", 1)[1]
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "S3_ENDPOINT": host, "S3_USE_HTTPS": https,
           "AWS_ENDPOINT_URL": f"{'https' if https == '1' else 'http'}://{host}"}
    if "serving.kserve.io/s3-region" in notes:
        env["AWS_DEFAULT_REGION"] = env["AWS_REGION"] = notes["serving.kserve.io/s3-region"]
    if "serving.kserve.io/s3-useanoncredential" in notes:
        env["awsAnonymousCredential"] = notes["serving.kserve.io/s3-useanoncredential"]
    return {**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR")}, **env}


@functools.cache
def kserve_storage_python() -> str:
    """The python of the kserve-storage virtual environment (scripts/kserve-storage-venv.sh makes it once)."""
    result = subprocess.run([str(REPO / "scripts" / "kserve-storage-venv.sh")], capture_output=True, text=True,
                            timeout=900)
    if result.returncode != 0:
        raise AssertionError(f"kserve-storage-venv.sh failed: {result.stderr[-2000:]}")
    return result.stdout.strip().splitlines()[-1]


def kserve_download(uri: str, out: Path, endpoint: str) -> subprocess.CompletedProcess:
    """What KServe's storage initializer does with storageUri, with the env its credential builder derives from
    the example S3 Secret, pointed at `endpoint`."""
    (secret, _) = [d for d in yaml.safe_load_all(EXAMPLE_SECRET.read_text()) if d]
    code = "import sys; from kserve_storage import Storage; print(Storage.download(sys.argv[1], sys.argv[2]))"
    return subprocess.run([kserve_storage_python(), "-c", code, uri, str(out)], capture_output=True, text=True,
                          timeout=120, env=storage_initializer_env(secret, endpoint))


def files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
