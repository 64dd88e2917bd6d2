"""bench.procs: the CPU a process tree used since a snapshot."""

from __future__ import annotations

import os
import time

from bench.procs import ProcessTree


def test_cpu_pct_since_counts_the_cpu_used_since_the_snapshot():
    tree = ProcessTree(os.getpid())
    before = tree.cpu_snapshot()
    started, end = time.perf_counter(), time.process_time() + 0.2
    while time.process_time() < end:
        pass
    seconds = time.perf_counter() - started
    pct = tree.cpu_pct_since(before, seconds)
    assert pct * seconds / 100 >= 0.15
    assert pct <= 100.0 * os.cpu_count() + 1
