"""A Docker-compatible API for tools that speak only Docker's (kfp.local.DockerRunner, the `docker` SDK).

With a docker daemon that answers, its own socket is used as it is. With podman, `podman system service`
serves the same API on a unix socket in a temporary directory, with the containers.conf that
scripts/build-images.sh wrote (runtime runc, ulimits this machine allows), so containers started through
the API run like the ones the build script and the podman CLI run. The service is stopped by its pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _answers(docker_host: str | None) -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
    except docker.errors.DockerException:
        return False
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001  connection refused, socket not there yet, ...
        return False
    finally:
        client.close()


@contextmanager
def docker_api(images: dict, timeout_s: float = 60) -> Iterator[str | None]:
    """Yield the DOCKER_HOST to use for the engine of build/images.json (None: docker's own default)."""
    if images["engine"] == "docker":
        yield os.environ.get("DOCKER_HOST")
        return
    with tempfile.TemporaryDirectory(prefix="podman-api-") as tmp:
        socket = Path(tmp) / "podman.sock"
        url = f"unix://{socket}"
        env = dict(os.environ)
        if images.get("containers_conf"):
            env["CONTAINERS_CONF"] = images["containers_conf"]
        log = open(Path(tmp) / "service.log", "wb")
        proc = subprocess.Popen(["podman", "system", "service", "--time=0", url], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while not (socket.exists() and _answers(url)):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise RuntimeError(f"podman system service did not answer on {url} "
                                       f"(exit {proc.poll()}): {(Path(tmp) / 'service.log').read_text()[-2000:]}")
                time.sleep(0.2)
            yield url
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            log.close()
