"""Start, watch and stop a TorchServe instance with the project's configuration.

`torchserve --start` exits 0 even when the frontend dies a second later (a taken port, say), and
/ping answers before any worker is READY; so readiness here means: the Java process is alive and the
management API reports a READY worker for the model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from settings import (CONFIG_FILE, DEFAULT_MODEL_STORE, KEY_FILE, LOG_CONFIG_FILE, MODEL_NAME, REPO, WORKER_THREADS,
                      Endpoints, read_properties, with_ports, write_properties)
from torchserve_api import instances
from torchserve_api.errors import ClientError
from torchserve_api.management import ManagementClient
from torchserve_api.tokens import from_key_file

from .ports import port_taken
from .server_logs import diagnose, load_failure, log_offsets
from .ts_config import request_limits

PID_FILE = ".model_server.pid"  # TorchServe's launcher writes it into $TMPDIR
FRONT_PID_FILE = "front.pid"
#: Seconds the front may take to listen once started.
FRONT_START_S = 15.0


class LocalServerError(Exception):
    """One-line reason the server could not be started, reached or stopped."""


@dataclass(frozen=True)
class Instance:
    """One TorchServe instance: its config file and its own working directory.

    The working directory holds logs/, key_file.json and a private TMPDIR (which holds the
    launcher's pid file), so several instances can run side by side.
    """

    workdir: Path = REPO
    config: Path = CONFIG_FILE
    model_name: str = MODEL_NAME

    @property
    def tmpdir(self) -> Path:
        return self.workdir / ".ts-tmp"

    @property
    def key_file(self) -> Path:
        return self.workdir / KEY_FILE

    @property
    def log_file(self) -> Path:
        return self.workdir / "logs" / "torchserve.out"

    @property
    def front_log(self) -> Path:
        return self.workdir / "logs" / "front.log"

    @property
    def torchserve_config(self) -> Path:
        """What TorchServe reads when the front holds the inference port: the config, its inference API on a
        private loopback port."""
        return self.tmpdir / "torchserve.properties"

    def front_pid(self) -> int | None:
        """The running front (serving.front) of this instance, if any."""
        try:
            pid = int((self.tmpdir / FRONT_PID_FILE).read_text().strip())
            return pid if "serving.front" in psutil.Process(pid).cmdline() else None
        except (OSError, ValueError, psutil.Error):
            return None

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints.from_properties(read_properties(self.config))

    def pid(self) -> int | None:
        try:
            pid = int((self.tmpdir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if psutil.pid_exists(pid) and _is_torchserve(pid) else None

    @property
    def token_auth(self) -> bool:
        return read_properties(self.config).get("disable_token_authorization", "false").lower() != "true"

    def keys(self) -> dict[str, str]:
        """Current tokens from key_file.json: {"inference": ..., "management": ..., "API": ...} from TorchServe, only
        "inference" from the python runtime (it has no management API).

        Empty when the config turns token authorization off (KServe puts auth at its ingress).
        """
        if not self.token_auth:
            return {}
        try:
            keys = {"inference": from_key_file(self.key_file, "inference").value}
        except ClientError as exc:
            raise LocalServerError(str(exc)) from None
        for kind in ("management", "API"):
            with contextlib.suppress(ClientError):
                keys[kind] = from_key_file(self.key_file, kind).value
        return keys


def _is_torchserve(pid: int) -> bool:
    try:
        return "org.pytorch.serve" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def port_in_use(port: int) -> bool:
    """Whether a process listens on (or holds) loopback `port`."""
    return port_taken("127.0.0.1", port)


def model_status(instance: Instance, timeout: float = 2.0) -> list[dict]:
    """Workers of the model as the management API describes them (all versions); client errors raise."""
    with ManagementClient(instance.endpoints.management, model=instance.model_name,
                          token=instance.keys().get("management"), timeout=timeout, retries=0) as management:
        return management.describe("all")


def wait_ready(instance: Instance, timeout: float = 120.0, offsets: tuple[int, int] | None = None) -> float:
    """Poll until every loaded version of the model has a READY worker; returns the seconds waited.

    A load failure logged after `offsets` (default: the logs' sizes now) ends the wait at once."""
    started = time.monotonic()
    deadline = started + timeout
    if offsets is None:
        offsets = log_offsets(instance)
    while time.monotonic() < deadline:
        if instance.pid() is None and time.monotonic() - started > 3:
            raise LocalServerError(f"TorchServe exited during start: {diagnose(instance)}")
        failure = load_failure(instance, offsets)
        if failure:
            raise LocalServerError(failure)
        try:
            versions = model_status(instance)
            if versions and all(any(w.get("status") == "READY" for w in v.get("workers", [])) for v in versions):
                return time.monotonic() - started
        except (LocalServerError, ClientError):
            pass
        time.sleep(0.2)
    raise LocalServerError(f"no READY worker for {instance.model_name} after {timeout:.0f}s: {diagnose(instance)}")


def model_store_for(config: Path, given: Path | None = None) -> Path:
    """The model store to serve: `given`, else the config's model_store (relative to the config's folder, as
    `python -m client lifecycle-config` writes it), else the repository's model_store/."""
    if given is not None:
        return Path(given).resolve()
    store = read_properties(config).get("model_store")
    return (Path(config).resolve().parent / store).resolve() if store else DEFAULT_MODEL_STORE


def holder_of(port: int) -> str:
    """The words ' by WHAT' naming what listens on `port`: a recorded TorchServe (with the command that stops it)
    or, as far as this user may see, another process; '' when nothing can be named."""
    ours = instances.on_ports({port})
    if ours:
        return f" by {ours[0].describe()} (python -m serving --workdir {ours[0].workdir} stop)"
    others = instances.listeners(port)
    return f" by {', '.join(others)}" if others else ""


def check_free(instance: Instance, ports: dict[str, int] | None = None) -> None:
    """LocalServerError naming what holds a port of the config (or of `ports`), if anything does."""
    for what, port in (instance.endpoints.ports() if ports is None else ports).items():
        if port_in_use(port):
            raise LocalServerError(f"port {port} ({what}) is already in use{holder_of(port)}: stop the other server or "
                              f"change {instance.config.name}")


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Ctrl-C held back until the block ends, then raised: a launch or a stop is never cut in half (the launcher
    starts Java in its own session, which a Ctrl-C would leave running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _prepare_dirs(instance: Instance) -> None:
    instance.tmpdir.mkdir(parents=True, exist_ok=True)
    instance.log_file.parent.mkdir(parents=True, exist_ok=True)
    instance.tmpdir.chmod(0o700)


def _start_front(instance: Instance) -> Path:
    """Start serving.front on the config's inference address, in front of TorchServe's inference API on a private
    loopback port; return the config TorchServe is to read."""
    props = read_properties(instance.config)
    private = f"http://127.0.0.1:{free_ports(1)[0]}"
    max_size, timeout = request_limits(props)
    write_properties({**props, "inference_address": private}, instance.torchserve_config)
    cmd = [sys.executable, "-m", "serving.front", "--listen", urlsplit(instance.endpoints.inference).netloc,
           "--upstream", private, "--max-request-size", str(max_size), "--response-timeout", str(timeout)]
    if instance.token_auth:
        cmd += ["--key-file", str(instance.key_file)]
    env = dict(os.environ, TMPDIR=str(instance.tmpdir), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    with open(instance.front_log, "ab") as log:
        front = subprocess.Popen(cmd, cwd=instance.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    (instance.tmpdir / FRONT_PID_FILE).write_text(f"{front.pid}\n")
    return instance.torchserve_config


def _wait_front(instance: Instance) -> None:
    """Until the front listens; LocalServerError with its log's last line if it exits first."""
    port = instance.endpoints.ports()["inference"]
    deadline = time.monotonic() + FRONT_START_S
    while time.monotonic() < deadline:
        if instance.front_pid() is None:
            break
        if port_in_use(port):
            return
        time.sleep(0.05)
    lines = instance.front_log.read_text(errors="replace").strip().splitlines() if instance.front_log.exists() else []
    raise LocalServerError(f"the front on port {port} did not start: {lines[-1] if lines else 'no log'} "
                           f"(see {instance.front_log})")


def fronted(instance: Instance) -> bool:
    """Whether a start puts serving.front before TorchServe: for a plain-HTTP inference address (with https,
    TorchServe holds the port and terminates TLS itself)."""
    return urlsplit(instance.endpoints.inference).scheme == "http"


def _launch(instance: Instance, ts_config: Path, model_store: Path, models: str | None, threads: int) -> None:
    """Run TorchServe's launcher (it returns once Java runs) with `ts_config` and record the instance."""
    # Java ignores TMPDIR: without java.io.tmpdir the worker sockets and the unpacked .mar would sit in
    # the shared /tmp, where instances collide and other local users could squat the paths.
    env = dict(os.environ, TMPDIR=str(instance.tmpdir), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), PYTHONPATH="",
               JAVA_TOOL_OPTIONS=f"-Djava.io.tmpdir={instance.tmpdir}")
    cmd = [str(Path(sys.executable).parent / "torchserve"), "--start", "--ncs",
           "--ts-config", str(ts_config), "--log-config", str(LOG_CONFIG_FILE), "--model-store", str(model_store)]
    if models:
        cmd += ["--models", models]
    with open(instance.log_file, "ab") as log:
        subprocess.run(cmd, cwd=instance.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, check=False, start_new_session=True)
    pid = instance.pid()
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            instances.save(instances.record_of(pid, instance.workdir, instance.config, instance.model_name,
                                               model_store, instance.key_file if instance.token_auth else None,
                                               instance.endpoints.ports()))


def start(instance: Instance, model_store: Path, models: str | None = None, timeout: float = 120.0,
          threads: int | None = None, front: bool = True) -> float:
    """Launch TorchServe, wait until READY, return seconds from launch to READY.

    `models`: TorchServe's --models (default: load_models of the config); `threads` is OMP_NUM_THREADS of the
    workers (default settings.WORKER_THREADS); `front`: serving.front holds a plain-HTTP inference port (the
    benchmark measures TorchServe without it). A failure or a Ctrl-C before READY leaves no server running."""
    if shutil.which("java") is None:
        raise LocalServerError("java not found: TorchServe needs Java 17 (apt-get install openjdk-17-jre-headless)")
    if instance.pid() is not None:
        raise LocalServerError(f"TorchServe already running (pid {instance.pid()}); stop it first")
    other = recorded_here(instance)
    if other is not None:
        raise LocalServerError(f"{other.describe()} is running; stop it first")
    (instance.tmpdir / PID_FILE).unlink(missing_ok=True)  # stale: the frontend died without cleaning up
    _stop_front(instance, 5.0)  # the front of a TorchServe that died holds the inference port
    props = read_properties(instance.config)
    load = models or props.get("load_models", "")
    for name in filter(None, (m.split("=")[-1].strip() for m in load.split(","))):
        if name not in ("all", "ALL") and not (Path(model_store) / name).exists():
            raise LocalServerError(f"{Path(model_store) / name} not found: build it with ./archive.sh")
    check_free(instance)
    instances.ensure_dir()  # where the start is recorded: unwritable is an error before anything runs
    offsets = log_offsets(instance)
    started = time.monotonic()
    try:
        with held_interrupts():
            _prepare_dirs(instance)
            ts_config = _start_front(instance) if front and fronted(instance) else instance.config
            _launch(instance, ts_config, Path(model_store), models, WORKER_THREADS if threads is None else threads)
        if ts_config != instance.config:
            _wait_front(instance)
        wait_ready(instance, timeout, offsets)
    except BaseException:
        with held_interrupts():
            stop(instance)
        raise
    return time.monotonic() - started


def stop(instance: Instance, timeout: float = 20.0) -> bool:
    """Stop the frontend and every worker it started, as `torchserve --stop` would, and forget its record; True if
    something was running."""
    front = _stop_front(instance, timeout)
    pid = instance.pid() or getattr(recorded_here(instance), "pid", None)
    if pid is None:
        (instance.tmpdir / PID_FILE).unlink(missing_ok=True)
        return front
    try:
        frontend = psutil.Process(pid)
        procs = [frontend, *frontend.children(recursive=True)]
        frontend.terminate()
    except psutil.Error:
        procs = []
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    instance.key_file.unlink(missing_ok=True)
    (instance.tmpdir / PID_FILE).unlink(missing_ok=True)
    instances.forget(pid)
    return True


def _stop_front(instance: Instance, timeout: float) -> bool:
    """Stop the instance's front, if it runs; True if it did."""
    pid = instance.front_pid()
    (instance.tmpdir / FRONT_PID_FILE).unlink(missing_ok=True)
    instance.torchserve_config.unlink(missing_ok=True)
    if pid is None:
        return False
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        proc.terminate()
        if psutil.wait_procs([proc], timeout=timeout)[1]:
            proc.kill()
    return True


def recorded_here(instance: Instance) -> instances.Record | None:
    """The running server a project command started from this instance's workdir, if any."""
    return next((r for r in instances.running() if r.workdir == str(instance.workdir)), None)


def server_name(instance: Instance) -> str:
    """What a stop of `instance` stops: "TorchServe" or "python runtime"."""
    record = recorded_here(instance)
    return "TorchServe" if instance.pid() is not None or record is None else record.server


def recorded_on_ports(instance: Instance) -> list[Instance]:
    """The instances a project command started that listen on a port of `instance`'s config, whatever their
    workdir."""
    ports = set(instance.endpoints.ports().values())
    return [Instance(Path(r.workdir), Path(r.config), r.model_name) for r in instances.on_ports(ports)]


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports that were free a moment ago."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def private_instance(workdir: Path, base_config: Path = CONFIG_FILE, **overrides: str) -> Instance:
    """The project's config on free loopback ports in its own workdir, to run beside another server."""
    workdir.mkdir(parents=True, exist_ok=True)
    props = with_ports(read_properties(base_config), *free_ports(5))
    props.update(overrides)
    config = workdir / "config.properties"
    write_properties(props, config)
    return Instance(workdir=workdir, config=config)
