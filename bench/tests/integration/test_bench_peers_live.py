"""The peer servers as bench.run starts them, on the tiny model: every model process is up before the server counts
as ready, FastAPI's and the python runtime's connections reach both workers, and the CPU of the whole process tree
is recorded per process under the role each process has. A handful of requests only: no load, no timing assertions."""

from __future__ import annotations

import io
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from bench.peers import PATH, PeerConfig, PeerTree, launch, listening_processes, wait_ready
from bench.procs import stop_group
from serving.server import free_ports

KEY = "bench-test-key"
EXPECTED_ROLES = {
    "fastapi": {"supervisor", "worker 1", "worker 2"},
    "python": {"supervisor", "worker 1", "worker 2"},
    "litserve": {"main", "manager", "resource tracker", "inference worker 1", "inference worker 2", "API server 1",
                 "API server 2"},
}


def png() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((28, 28), 255, np.uint8)).save(out, "PNG")
    return out.getvalue()


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(scope="module", params=sorted(EXPECTED_ROLES))
def peer(request, tiny_artifacts, tmp_path_factory):
    cfg = PeerConfig(request.param, workers=2, threads=1, max_batch=8, batch_delay_ms=1.0,
                     key=KEY if request.param == "python" else None)
    port = free_ports(1)[0]
    log = tmp_path_factory.mktemp(cfg.name) / "server.log"
    proc = launch(cfg, Path(tiny_artifacts), port, log)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}{PATH}", png(), log, timeout=180.0, own_sockets=cfg.own_sockets,
                   key=cfg.key)
        yield cfg, proc, port
    finally:
        members = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        stop_group(proc)
        assert not [m.pid for m in members if alive(m)], "stop_group left processes of the tree running"


def connections_by_process(root_pid: int, port: int) -> dict[int, int]:
    counts = {}
    for proc in [psutil.Process(root_pid), *psutil.Process(root_pid).children(recursive=True)]:
        n = sum(1 for c in proc.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)
        if n:
            counts[proc.pid] = n
    return counts


def test_each_process_is_labelled_and_its_cpu_recorded(peer):
    cfg, proc, port = peer
    tree = PeerTree(proc.pid, cfg.name)
    before = tree.cpu_snapshot()
    started = time.monotonic()
    for _ in range(20):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{PATH}", data=png(),
                                         headers={"Content-Type": "application/octet-stream",
                                                  **({"Authorization": f"Bearer {cfg.key}"} if cfg.key else {})})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    total = tree.cpu_pct_since(before, time.monotonic() - started)
    (window,) = tree.windows
    assert set(window["server_cpu_by_process"]) == EXPECTED_ROLES[cfg.name]
    assert total == pytest.approx(sum(window["server_cpu_by_process"].values()))
    assert window["machine_busy_pct"] >= 0.0
    assert {m["role"] for m in tree.memory(tree.role)} == EXPECTED_ROLES[cfg.name]


def test_connections_reach_both_workers(peer):
    """FastAPI's and the python runtime's workers each listen on their own SO_REUSEPORT socket."""
    cfg, proc, port = peer
    if cfg.name not in ("fastapi", "python"):
        pytest.skip("LitServe's API servers share one socket; its inference workers share one request queue")
    assert listening_processes(proc.pid, port) == 2
    workers = {p.pid for p in psutil.Process(proc.pid).children()}
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]  # opened at once, as wrk does
    try:
        deadline = time.monotonic() + 10
        while sum(connections_by_process(proc.pid, port).values()) < 16 and time.monotonic() < deadline:
            time.sleep(0.1)
        counts = connections_by_process(proc.pid, port)
        # each connection hashes to one of the two sockets: all 16 on one worker has probability 2 * 2**-16
        assert set(counts) == workers and sum(counts.values()) == 16, counts
    finally:
        for client in clients:
            client.close()
