"""`python -m serving start --runtime python`: the same archives served without Java, on the config's ports.

The python runtime (:mod:`serving.python_runtime`) serves on ``inference_address`` what TorchServe serves there
(``/predictions``, ``/ping``, KServe v1, Open Inference v2), Open Inference gRPC on ``grpc_inference_port`` and
TorchServe's metric names on ``metrics_address``. It has no management API: registering, scaling and
``client status`` are TorchServe's. Its key is written to the workdir's ``key_file.json`` under ``inference``, as
TorchServe writes its own, and the start is recorded (:mod:`torchserve_api.instances`), so ``client`` finds the
key and ``serving stop`` the server from any directory.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from settings import read_properties
from torchserve_api import instances

from .gateway.app import API_KEY_ENV
from .server import Instance, LocalServerError, check_free, held_interrupts, recorded_here, stop

RUNTIME = "python"
MODULE = "serving.python_runtime"
#: A local server leaves no load balancer to wait for: drain at once, within this many seconds.
LOCAL_GRACE_S = 15.0


def log_file(instance: Instance) -> Path:
    return instance.workdir / "logs" / "python_runtime.log"


def served_ports(instance: Instance) -> dict[str, int]:
    """The config's ports this runtime listens on (TorchServe's management ports stay free)."""
    ports = instance.endpoints.ports()
    return {what: ports[what] for what in ("inference", "metrics", "gRPC inference")}


def archives(model_store: Path, models: str | None, instance: Instance) -> list[Path]:
    """The archives to serve: `models` (TorchServe's --models, comma-separated names), else the config's
    load_models; LocalServerError for none, for "all", or for a file not in the store."""
    load = models or read_properties(instance.config).get("load_models", "")
    names = [m.split("=")[-1].strip() for m in load.split(",") if m.strip()]
    if not names or any(name in ("all", "ALL") for name in names):
        raise LocalServerError(f"the python runtime serves named archives: pass --mar, or set load_models in "
                          f"{instance.config.name} to the .mar files")
    paths = [Path(model_store) / name for name in names]
    for path in paths:
        if not path.is_file():
            raise LocalServerError(f"{path} not found: build it with ./archive.sh")
    return paths


def write_key_file(path: Path, key: str) -> None:
    """key_file.json as TorchServe lays it out (``{"inference": {"key": ...}}``), created 0600 and whole."""
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        json.dump({"inference": {"key": key}}, fh)
    os.replace(partial, path)


def ready(instance: Instance) -> bool:
    """Whether the runtime answers its readiness probe (open without the key) with 200."""
    url = f"{instance.endpoints.inference.rstrip('/')}/v2/health/ready"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        with opener.open(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _last_error(path: Path) -> str:
    """The runtime's own one-line refusal from its log, else where to look."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith("python_runtime: ") or "refusing to load model" in line or " ERROR " in line:
            return line.strip()[-300:]
    return f"see {path}"


def launch(instance: Instance, paths: list[Path], threads: int) -> subprocess.Popen:
    """Start the runtime in its own session (a Ctrl-C at the terminal is this command's, not the server's)."""
    inference = urlsplit(instance.endpoints.inference)
    key = secrets.token_urlsafe(24)
    log = log_file(instance)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", MODULE, "--ts-config", str(instance.config), "--model-name",
               instance.model_name, "--http-host", inference.hostname or "127.0.0.1",
               "--http-port", str(served_ports(instance)["inference"]),
               "--grpc-port", str(served_ports(instance)["gRPC inference"]),
               "--shutdown-delay", "0", "--termination-grace", str(LOCAL_GRACE_S)]
    for path in paths:
        command += ["--mar", str(path)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop(API_KEY_ENV, None)
    if instance.token_auth:
        env[API_KEY_ENV] = key
    else:  # the config turns token authorization off, as TorchServe would honour it
        command.append("--allow-unauthenticated")
    with open(log, "ab") as out:
        process = subprocess.Popen(command, cwd=instance.workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    if instance.token_auth:
        write_key_file(instance.key_file, key)
    instances.save(instances.record_of(process.pid, instance.workdir, instance.config, instance.model_name,
                                       paths[0].parent, instance.key_file if instance.token_auth else None,
                                       served_ports(instance), RUNTIME))
    return process


def start(instance: Instance, model_store: Path, models: str | None = None, timeout: float = 120.0,
          threads: int = 1) -> float:
    """Serve the archives with the python runtime and wait until it is ready; seconds from launch to ready.

    A failure or a Ctrl-C before ready leaves no server running, as :func:`serving.server.start` does."""
    running = recorded_here(instance)
    if instance.pid() is not None or running is not None:
        what = running.describe() if running is not None else f"TorchServe pid {instance.pid()}"
        raise LocalServerError(f"{what} is running; stop it first")
    paths = archives(model_store, models, instance)
    check_free(instance, served_ports(instance))
    instances.ensure_dir()
    started = time.monotonic()
    try:
        with held_interrupts():
            process = launch(instance, paths, threads)
        while not ready(instance):
            if process.poll() is not None:
                raise LocalServerError(f"the python runtime exited during start: {_last_error(log_file(instance))}")
            if time.monotonic() - started > timeout:
                raise LocalServerError(f"not ready after {timeout:.0f}s: see {log_file(instance)}")
            time.sleep(0.2)
    except BaseException:
        with held_interrupts():
            stop(instance)
        raise
    return time.monotonic() - started
