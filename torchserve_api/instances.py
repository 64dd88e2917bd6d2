"""The TorchServes this user's project commands started, found from any directory.

Whatever starts one (`python -m serving start`, run-local's deploy-local task, a lifecycle config: all go through
serving.server.start) records it as ``<pid>.json`` in settings.servers_dir(), written by rename, and
serving.server.stop removes it. A record whose process is gone, or whose pid now names a process started at
another time, is stale: reading skips and deletes it. `client` finds here the key file of the server on a URL's
port, `serving stop` the server holding its config's ports whatever --workdir says, and `listeners` names any
other process on a port.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from settings import servers_dir


def is_loopback(url: str) -> bool:
    """Whether `url` names this machine. Loopback servers are called directly, never through an HTTP(S)_PROXY
    from the environment, and only they may be found in the records of this machine."""
    host = urlsplit(url if "//" in url else f"//{url}").hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


#: What each runtime a record may name is called in messages.
RUNTIME_NAMES = {"torchserve": "TorchServe", "python": "python runtime"}
#: Seconds two readings of one process's start time may differ by (psutil derives it from clock ticks).
SAME_START_S = 1.0


@dataclass(frozen=True)
class Record:
    """One running server: its frontend's (or the python runtime supervisor's) pid and start time, where it runs and what it listens on."""

    pid: int
    started: float
    workdir: str
    config: str
    model_name: str
    model_store: str
    key_file: str | None  # None: the config turns token authorization off
    ports: dict[str, int] = field(default_factory=dict)
    runtime: str = "torchserve"  # or "python": serving.python_runtime, the same archives without Java

    @property
    def server(self) -> str:
        """What runs: "TorchServe" or "python runtime"."""
        return RUNTIME_NAMES.get(self.runtime, self.runtime)

    def alive(self) -> bool:
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) < SAME_START_S
        except psutil.Error:
            return False

    def describe(self) -> str:
        return f"{self.server} pid {self.pid} of {self.workdir}"


def record_of(pid: int, workdir: Path, config: Path, model_name: str, model_store: Path, key_file: Path | None,
              ports: dict[str, int], runtime: str = "torchserve") -> Record:
    """The record of the running process `pid`; psutil.Error if it is gone."""
    return Record(pid, psutil.Process(pid).create_time(), str(workdir), str(config), model_name, str(model_store),
                  None if key_file is None else str(key_file), dict(ports), runtime)


def ensure_dir() -> Path:
    """The records' folder, made private (0700) if missing; OSError if it cannot be."""
    folder = servers_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def save(record: Record) -> Path:
    """Write `record` by rename: a reader sees the whole record or none."""
    folder = ensure_dir()
    path = folder / f"{record.pid}.json"
    fd, partial = tempfile.mkstemp(prefix=f".{record.pid}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(record), fh)
        os.replace(partial, path)
    finally:
        Path(partial).unlink(missing_ok=True)
    return path


def forget(pid: int) -> None:
    (servers_dir() / f"{pid}.json").unlink(missing_ok=True)


def _read(path: Path) -> Record | None:
    try:
        data = json.loads(path.read_text())
        return Record(**data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError):
        return None


def running() -> list[Record]:
    """The recorded servers still running, oldest first; stale records are deleted on the way."""
    try:
        paths = sorted(servers_dir().glob("*.json"))
    except OSError:
        return []
    found = []
    for path in paths:
        record = _read(path)
        if record is None:
            continue
        if record.alive():
            found.append(record)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda r: r.started)


def on_ports(ports: set[int]) -> list[Record]:
    """The recorded servers listening on any of `ports`."""
    return [record for record in running() if ports & set(record.ports.values())]


def for_address(address: str) -> Record | None:
    """The recorded server behind `address` (a URL, or host:port for gRPC) when the host is this machine."""
    try:
        parts = urlsplit(address if "//" in address else f"//{address}")
        port = parts.port
    except ValueError:
        return None
    if port is None or not is_loopback(address):
        return None
    return next(iter(on_ports({port})), None)


def listeners(port: int) -> list[str]:
    """What listens on TCP `port` of this machine, as this user may see it: "java pid 812 (a TorchServe started in
    /srv/ts)", or "a process of another user"; empty when nothing does."""
    try:
        pids = {conn.pid for conn in psutil.net_connections("tcp")
                if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN}
    except (psutil.Error, OSError):
        return []
    return [_process(pid) for pid in sorted(pids, key=lambda p: p or 0)]


def _process(pid: int | None) -> str:
    if pid is None:
        return "a process of another user"
    try:
        proc = psutil.Process(pid)
        text = f"{proc.name()} pid {pid}"
        if any("org.pytorch.serve" in part for part in proc.cmdline()):
            text += f" (a TorchServe started in {proc.cwd()})"
        return text
    except psutil.Error:
        return f"pid {pid}"
