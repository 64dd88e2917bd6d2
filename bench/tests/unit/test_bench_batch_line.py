"""The benchmark reads the handler's per-batch log line with bench.torchserve.BATCH_LINE: the two stay in step."""

from __future__ import annotations

from bench.torchserve import BATCH_LINE
from handler.embedding_handler import batch_log_line
from handler.service import BatchTimings


def test_the_bench_reads_the_handlers_batch_line():
    timings = BatchTimings(preprocess=0.0019249, embed=0.0035, search=0.0004, rejected=1, unknown=2, top1=[0.2])
    line = batch_log_line(8, 9, timings, {0: "a", 1: "b"})
    assert [float(g) for g in BATCH_LINE.search(line).groups()] == [8.0, 1.92, 3.5, 0.4]
