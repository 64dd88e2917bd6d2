"""A real S3 API server on loopback for the storage tests: moto's standalone server (``python -m moto.server``).

Why moto: it is a pip package (no registry image or binary download, which these machines cannot fetch),
runs as its own process speaking S3's REST API over HTTP, and both boto3 (the pipeline's upload) and
KServe's storage code (the storage initializer's download) talk to it through their ordinary endpoint
settings, exactly as they would to MinIO. It keeps objects in memory and does not check signatures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator

from serving.server import free_ports

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
