"""bench.peers: the processes of a peer server labelled by role, its CPU per process and for the machine per trial,
and the verdict on whether it used both cores under load and why not; bench.fastapi_app's per-worker sockets."""

from __future__ import annotations

import socket
from collections import defaultdict, namedtuple
from dataclasses import dataclass

import pytest

from bench.fastapi_app import reuse_port_socket
from bench.peers import PeerConfig, annotate_runs, cpu_verdict, label_processes, machine_cpu
from bench.report import _both_cores_rows, markdown

LITSERVE = "/venv/bin/python -m bench.litserve_app --port 8000 --workers 2"
SPAWNED = "/venv/bin/python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=7) --multiprocessing-fork"
TRACKER = "/venv/bin/python -B -c from multiprocessing.resource_tracker import main;main(5)"


@dataclass
class FakeProcess:
    pid: int
    cmd: str
    started: float

    def cmdline(self) -> list[str]:
        return self.cmd.split(" ")

    def create_time(self) -> float:
        return self.started


def s(*values: float) -> dict:
    return {"median": sorted(values)[len(values) // 2], "min": min(values), "max": max(values), "n": len(values),
            "missing": 0, "values": list(values)}


def row(c: int, cpu: float, by_process: dict[str, float] | None = None, machine: float | None = None,
        loadgen: float = 4.0, steal: float = 0.0) -> dict:
    out = {"concurrency": c, "throughput": s(1500.0), "p50_ms": s(8.0), "p90_ms": s(12.0), "p99_ms": s(15.0),
           "errors": 0, "requests": 4500, "loadgen_cpu_pct": s(loadgen), "server_cpu_pct": s(cpu)}
    if by_process is not None:
        out["server_cpu_by_process"] = {label: s(pct) for label, pct in by_process.items()}
    if machine is not None:
        out["machine_busy_pct"], out["machine_steal_pct"] = s(machine), s(steal)
    return out


def test_litserve_processes_are_labelled_by_what_litserve_started_them_as():
    # LitServe 0.2's order: the manager is forked first, the inference workers spawned, the API servers forked last.
    procs = [FakeProcess(10, LITSERVE, 1.0), FakeProcess(11, LITSERVE, 2.0), FakeProcess(12, TRACKER, 2.1),
             FakeProcess(14, SPAWNED, 2.3), FakeProcess(13, SPAWNED, 2.2), FakeProcess(20, LITSERVE, 9.0),
             FakeProcess(21, LITSERVE, 9.1)]
    assert label_processes("litserve", 10, procs) == {
        10: "main", 11: "manager", 12: "resource tracker", 13: "inference worker 1", 14: "inference worker 2",
        20: "API server 1", 21: "API server 2"}


def test_fastapi_processes_are_the_supervisor_and_its_numbered_workers():
    root = "/venv/bin/python -m bench.fastapi_app --host 127.0.0.1 --port 8000 --workers 2"
    procs = [FakeProcess(5, root, 1.0), FakeProcess(7, root + " --worker-index 1", 1.2),
             FakeProcess(6, root + " --worker-index 0", 1.1)]
    assert label_processes("fastapi", 5, procs) == {5: "supervisor", 6: "worker 1", 7: "worker 2"}
    # a single process of a role keeps the bare name
    assert label_processes("fastapi", 5, procs[:2]) == {5: "supervisor", 7: "worker"}


def test_machine_cpu_counts_everything_but_idle_and_reports_steal():
    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest")
    before = Times(10.0, 5.0, 2.0, 100.0, 1.0, 0.0, 0.5, 1.0, 0.0)
    after = Times(12.0, 6.0, 3.0, 102.0, 3.0, 0.0, 0.5, 1.5, 0.5)  # +4.5 s busy, +0.5 s steal over 3 s
    assert machine_cpu(before, after, 3.0) == pytest.approx({"machine_busy_pct": 150.0, "machine_steal_pct": 50 / 3})


def test_windows_land_on_their_trials_and_are_summarized_per_row():
    runs = [{"concurrency": 4, "trials": [{}, {}]}, {"concurrency": 16, "trials": [{}, {}]}]
    windows = [{"server_cpu_by_process": {"worker 1": 50.0 + i, "worker 2": 40.0}, "machine_busy_pct": 100.0 + i,
                "machine_steal_pct": 0.0} for i in range(4)]
    windows[3]["server_cpu_by_process"] = {"worker 1": 95.0}  # worker 2 gone in the last trial
    assert annotate_runs(runs, windows)
    assert runs[1]["trials"][0]["machine_busy_pct"] == 102.0
    assert runs[0]["server_cpu_by_process"]["worker 1"]["values"] == [50.0, 51.0]
    assert runs[1]["server_cpu_by_process"]["worker 2"]["values"] == [40.0]
    assert runs[1]["machine_busy_pct"]["median"] == 102.5
    assert not annotate_runs([{"concurrency": 1, "trials": [{}]}], windows)  # not one window per trial


def test_a_peer_that_used_both_cores_is_a_yes_with_no_reason():
    v = cpu_verdict(row(16, 186.0, {"worker 1": 93.0, "worker 2": 92.0, "supervisor": 0.2}, machine=195.0))
    assert v["used_both_cores"] and v["why"] == ""
    assert v["by_process"] == "worker 1 93%, worker 2 92%"  # processes under 1% left out


def test_all_the_work_on_one_process_is_named_as_the_reason():
    v = cpu_verdict(row(16, 98.0, {"worker 1": 97.0, "worker 2": 1.0}, machine=105.0))
    assert not v["used_both_cores"]
    assert v["why"] == "the work stayed on one process: worker 1 used a whole core (97%), worker 2 1%"


def test_processes_that_wait_are_told_apart_from_a_full_machine():
    waiting = cpu_verdict(row(16, 174.0, {"inference worker 1": 62.0, "inference worker 2": 60.0,
                                          "API server 1": 30.0, "API server 2": 10.0, "manager": 12.0}, machine=180.0))
    assert waiting["why"] == ("no process used a whole core (busiest: inference worker 1 62%): its processes spent "
                              "part of the time waiting (for requests, on each other, on batch timeouts), not computing")
    # measured at load average 9 (nice 19): both workers shared the work, but other work had the cores
    full = cpu_verdict(row(16, 39.0, {"worker 1": 19.0, "worker 2": 20.0, "supervisor": 0.2}, machine=202.0,
                           loadgen=1.0))
    assert full["why"] == "the machine was full (202% of 200%): other work took 162% (hypervisor steal 0%)"
    assert full["others_pct"] == pytest.approx(162.0)
    uneven = cpu_verdict(row(16, 150.0, {"worker 1": 90.0, "worker 2": 60.0}, machine=170.0, steal=20.0))
    assert uneven["why"] == ("the machine was busy (170% of 200%): other work took 16% (hypervisor steal 20%); "
                             "uneven: worker 1 used a whole core (90%), worker 2 only 60%")


def test_one_process_doing_its_roles_work_is_named():
    # measured at load average 9: every connection on one of LitServe's API servers (they share one socket)
    v = cpu_verdict(row(16, 115.0, {"inference worker 2": 35.0, "API server 1": 35.0, "inference worker 1": 32.0,
                                    "manager": 13.0, "API server 2": 0.4, "main": 0.0}, machine=203.0, loadgen=2.0))
    assert v["why"] == ("the machine was full (203% of 200%): other work took 86% (hypervisor steal 0%); "
                        "API server 1 did nearly all of the 2 API servers' work (35%; API server 2 0%)")
    # the one-process reason already says it for a concentrated FastAPI
    alone = cpu_verdict(row(16, 98.0, {"worker 1": 97.0, "worker 2": 1.0}, machine=103.0))
    assert "did nearly all" not in alone["why"]


def test_no_verdict_below_c16_and_a_plain_one_for_records_without_per_process_cpu():
    assert cpu_verdict(row(4, 98.0, {"worker 1": 97.0})) is None
    old = cpu_verdict(row(64, 120.0))
    assert not old["used_both_cores"] and old["why"] == "no per-process CPU in this record"
    assert old["machine_busy_pct"] is None


def test_report_has_a_both_cores_row_per_peer_and_loaded_concurrency():
    peers = [{"name": "fastapi", "label": "2x1", "runs": [row(4, 90.0, {"worker 1": 89.0}),
                                                           row(16, 98.0, {"worker 1": 97.0, "worker 2": 1.0},
                                                               machine=104.0)]},
             {"name": "litserve", "label": "2x1", "runs": [row(16, 185.0, {"inference worker 1": 70.0}, machine=192.0)]}]
    rows = _both_cores_rows(peers, 2)
    assert [(r[0], r[1], r[3]) for r in rows] == [("fastapi", 16, "**no**"), ("litserve", 16, "yes")]
    assert rows[0][5] == "104 (2)"  # machine busy (other work = 104 - 98 - 4)
    header = {"mode": "full", "started": "today", "settings": {"trials": 1},
              "machine": defaultdict(lambda: 2), "versions": defaultdict(str)}
    text = markdown({**header, "peers": peers})
    assert "### Both cores at c >= 16" in text
    assert "| fastapi | 16 | 98 | **no** | worker 1 97%, worker 2 1% | 104 (2) | the work stayed on one process" in text


def test_fastapi_and_the_python_runtime_wait_for_each_worker_to_listen():
    assert PeerConfig("fastapi", workers=2).own_sockets == 2
    assert PeerConfig("python", workers=2).own_sockets == 2
    assert PeerConfig("litserve", workers=2).own_sockets == 0  # its API servers share one socket


def test_python_runtime_processes_are_the_supervisor_and_its_workers():
    root = "/venv/bin/python -m serving.python_runtime --mar /s/embedding.mar --workers 2"
    worker = "/venv/bin/python -m serving.python_runtime.worker --plan /t/plan.json --index "
    procs = [FakeProcess(5, root, 1.0), FakeProcess(8, worker + "1", 1.3), FakeProcess(6, worker + "0", 1.1)]
    assert label_processes("python", 5, procs) == {5: "supervisor", 6: "worker 1", 8: "worker 2"}
    assert "never waits" in PeerConfig("python", workers=2, max_batch=8).label


def test_worker_sockets_share_a_port_and_each_gets_connections():
    first = reuse_port_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = reuse_port_socket("127.0.0.1", port)
    plain = socket.socket()
    try:
        with pytest.raises(OSError):  # a socket without SO_REUSEPORT cannot join the group
            plain.bind(("127.0.0.1", port))
        assert first.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY on what it accepts from it
        for sock in (first, second):
            sock.listen(64)
            sock.setblocking(False)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        accepted = {}
        for name, sock in (("first", first), ("second", second)):
            accepted[name] = 0
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                conn.close()
                accepted[name] += 1
        for client in clients:
            client.close()
        # the kernel hashes each connection to one socket: all 32 on one has probability 2 * 2**-32
        assert accepted["first"] + accepted["second"] == 32
        assert accepted["first"] > 0 and accepted["second"] > 0
    finally:
        for sock in (first, second, plain):
            sock.close()
