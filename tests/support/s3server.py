"""A real S3 API server on loopback for the storage tests: moto's standalone server (``python -m moto.server``).

Why moto: it is a pip package (no registry image or binary download, which these machines cannot fetch),
runs as its own process speaking S3's REST API over HTTP, and both boto3 (the pipeline's upload) and
KServe's storage code (the storage initializer's download) talk to it through their ordinary endpoint
settings, exactly as they would to MinIO. It keeps objects in memory and does not check signatures.

:class:`FaultyS3` sits in front of it as a loopback proxy and answers chosen uploads with the faults of the
way to a real store: the connection dropped halfway through the body, 503 SlowDown (AWS S3's answer to too
many requests), 507 XMinioStorageFull (MinIO's answer when its drives are full, cmd/api-errors.go) or
400 EntityTooLarge (AWS S3's, over the object size limit), as S3's XML error documents; or it keeps only half of
an upload and answers the store's success.
"""

from __future__ import annotations

import functools
import http.client
import os
import socket
import subprocess
import sys
import threading
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import yaml

from settings import REPO
from serving.server import free_ports

EXAMPLE_SECRET = REPO / "deploy" / "kserve" / "storage-credentials.example.yaml"

ACCESS_KEY, SECRET_KEY, REGION = "test-access-key", "test-secret-key", "us-east-1"


@contextmanager
def s3_server() -> Iterator[str]:
    """Start moto's S3 server on a free loopback port; yields its endpoint URL and stops it afterwards."""
    (port,) = free_ports(1)
    # werkzeug logs every request to stderr: a file, not a pipe nobody reads (a full pipe would stall the server).
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"moto S3 server did not start: {log.read().decode(errors='replace')[-500:]}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


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


#: fault -> (HTTP status, S3 error code, message), as the servers named in the module docstring answer.
S3_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "full": (507, "XMinioStorageFull", "Storage backend has reached its minimum free drive threshold. "
                                       "Please delete a few objects to proceed."),
    "too_large": (400, "EntityTooLarge", "Your proposed upload exceeds the maximum allowed object size."),
}
FAULTS = ("drop", "truncate", *S3_ERRORS)


class FaultyS3:
    """``with FaultyS3(endpoint) as url:`` a loopback proxy to `endpoint`; ``fail(key_part, fault, times)`` makes
    the next `times` uploads (PUT) whose path holds `key_part` meet `fault` (times=None: every one).
    ``faults_met`` counts the faults answered."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.rules: list[dict[str, Any]] = []
        self.faults_met = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def fail(self, key_part: str, fault: str, times: int | None = None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r} is not one of {', '.join(FAULTS)}")
        with self._lock:
            self.rules.append({"key_part": key_part, "fault": fault, "times": times})

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def _fault_for(self, method: str, path: str) -> str | None:
        with self._lock:
            for rule in self.rules:
                if method == "PUT" and rule["key_part"] in path:
                    if rule["times"] is not None:
                        rule["times"] -= 1
                        if rule["times"] <= 0:
                            self.rules.remove(rule)
                    self.faults_met += 1
                    return rule["fault"]
        return None

    def __enter__(self) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # answers boto3's "Expect: 100-continue" before it sends a body

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self, limit: int | None = None) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    data = b""
                    while limit is None or len(data) < limit:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline().strip():  # trailers, up to the blank line
                                pass
                            break
                        data += self.rfile.read(size)
                        self.rfile.readline()  # the CRLF that ends the chunk
                    return data
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length if limit is None else min(limit, length))

            def _relay(self) -> None:
                fault = proxy._fault_for(self.command, self.path)
                if fault == "drop":
                    self._body(limit=max(1, int(self.headers.get("Content-Length") or 2) // 2))
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                body = self._body()
                if fault == "truncate":  # a store that acknowledges what it did not keep
                    body = body[:len(body) // 2]
                elif fault:
                    status, code, message = S3_ERRORS[fault]
                    xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}'
                           f"</Message><Resource>{self.path.split('?')[0]}</Resource><RequestId>fault</RequestId>"
                           "</Error>").encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(xml)
                    self.close_connection = True
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("expect", "transfer-encoding", "content-length", "connection")}
                headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # HEAD answers with the length of the body it would have sent
                self.send_header("Content-Length", answer.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __exit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
