"""CPU and memory of a server's process tree (a frontend and its workers), read with psutil."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable

import psutil

MB = 1e6


class ProcessTree:
    """A root process and its descendants; Process objects are kept so CPU deltas stay per process."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._procs: dict[int, psutil.Process] = {}

    def processes(self) -> list[psutil.Process]:
        try:
            root = self._procs.setdefault(self.root_pid, psutil.Process(self.root_pid))
            found = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        return [self._procs.setdefault(p.pid, p) for p in found]

    def cpu_snapshot(self) -> dict[int, float]:
        out = {}
        for proc in self.processes():
            try:
                times = proc.cpu_times()
                out[proc.pid] = times.user + times.system
            except psutil.Error:
                pass
        return out

    def cpu_pct_since(self, before: dict[int, float], seconds: float) -> float:
        """CPU used since `before`, in percent of one core (200 = both cores of a 2-core machine)."""
        after = self.cpu_snapshot()
        used = sum(after[pid] - before.get(pid, 0.0) for pid in after)
        return 100.0 * used / seconds if seconds > 0 else float("nan")

    def memory(self, role: Callable[[psutil.Process], str] | None = None) -> list[dict]:
        """RSS of every process in the tree, labelled by `role` (default: the process name)."""
        rows = []
        for proc in self.processes():
            try:
                rows.append({"pid": proc.pid, "role": role(proc) if role else proc.name(),
                             "rss_mb": proc.memory_info().rss / MB})
            except psutil.Error:
                pass
        return rows


def stop_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group this benchmark started (start_new_session=True); SIGKILL what is left after `grace`.

    LitServe's main process exits on SIGTERM at once while its workers linger, so the whole tree is
    waited for, not just the main process.
    """
    try:
        members = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        members = []
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _, alive = psutil.wait_procs(members, timeout=grace)
    if alive:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for member in alive:
            try:
                member.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace)
    proc.wait()
