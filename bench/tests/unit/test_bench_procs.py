"""bench.procs: CPU by process role, and the labels of a serving tree."""

from __future__ import annotations

import os
import time

import psutil

from bench.procs import ProcessTree, serving_role


class FakeProcess:
    def __init__(self, name: str, cmdline: list[str]) -> None:
        self._name, self._cmdline = name, cmdline

    def name(self) -> str:
        return self._name

    def cmdline(self) -> list[str]:
        return self._cmdline


class GoneProcess:
    def name(self) -> str:
        raise psutil.NoSuchProcess(1)


def test_serving_role_labels_each_process_of_the_image():
    assert serving_role(FakeProcess("nginx", ["nginx: worker process"])) == "nginx"
    assert serving_role(FakeProcess("java", ["java", "-Dmodel_server_home=/opt/venv"])) == "frontend"
    assert serving_role(FakeProcess("python3", ["/opt/venv/bin/python3", "/x/ts/model_service_worker.py",
                                                "--sock-type", "unix"])) == "workers"
    assert serving_role(FakeProcess("python", ["python", "-m", "serving.kserve_runtime"])) == "gateway"
    assert serving_role(FakeProcess("torchserve", ["python", "/opt/venv/bin/torchserve"])) == "other"
    assert serving_role(GoneProcess()) == "gone"


def test_cpu_by_role_counts_the_cpu_used_since_the_snapshot():
    tree = ProcessTree(os.getpid())
    before = tree.cpu_snapshot()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    used = tree.cpu_by_role_since(before, lambda proc: "me" if proc.pid == os.getpid() else "child")
    assert used["me"] >= 0.15
    assert sum(used.values()) < 5.0
