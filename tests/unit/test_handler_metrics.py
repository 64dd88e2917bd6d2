"""The handler's per-batch metrics and log line: the lines TorchServe's own metrics API would write, in one write.

The reference is TorchServe 0.12's metrics cache (ts.metrics) called as the handler used to call it, one
add_time/add_metric/add_counter per metric: its frontend parses exactly those lines, so they must not change.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import ts
from support.handler_context import run_batch
from ts.metrics import caching_metric
from ts.metrics.dimension import Dimension
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

from handler import ts_metrics
from handler.embedding_handler import batch_log_line
from handler.search import GallerySearcher
from handler.service import BatchTimings
from handler.ts_metrics import METRIC_NAMES, batch_metric_lines, record_metrics

HOST, STAMP = "worker-host", 1795737071
IDS = {0: "9f1c-aa", 1: "77d0-bb", 2: "0e4e-cc"}


def _cache(request_ids=IDS) -> MetricsCacheYamlImpl:
    cache = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    cache.initialize_cache()
    cache.set_request_ids(request_ids)
    return cache


def _through_ts_api(cache, batch_size: int, timings: BatchTimings, name: str, version: str | None) -> list[str]:
    """What TorchServe's metrics cache writes for the handler's metrics, one call per metric."""
    dims = [Dimension("ModelName", name), Dimension("Level", "Model"),
            Dimension("ModelVersion", version or "unversioned")]
    answered = [d for d in timings.top1 if d is not None]
    cache.add_time("EmbeddingPreprocessMs", 1e3 * timings.preprocess, dimensions=list(dims))
    cache.add_time("EmbeddingInferenceMs", 1e3 * timings.embed, dimensions=list(dims))
    cache.add_time("EmbeddingSearchMs", 1e3 * timings.search, dimensions=list(dims))
    cache.add_metric("EmbeddingBatchSize", batch_size, "count", dimensions=list(dims), metric_type=MetricTypes.GAUGE)
    if answered:  # the batch's mean as sum / count (what the counters' rates give)
        cache.add_metric("EmbeddingTop1Distance", float(sum(answered)) / len(answered), "distance",
                         dimensions=list(dims), metric_type=MetricTypes.GAUGE)
    cache.add_counter("EmbeddingUnknownAnswers", timings.unknown, dimensions=list(dims))
    cache.add_counter("EmbeddingRejectedInputs", timings.rejected, dimensions=list(dims))
    cache.add_counter("EmbeddingAnsweredImages", len(answered), dimensions=list(dims))
    cache.add_counter("EmbeddingTop1DistanceSum", float(sum(answered)), dimensions=list(dims))


@pytest.fixture
def fixed_host_and_clock(monkeypatch):
    for module in (caching_metric, ts_metrics):
        monkeypatch.setattr(module.socket, "gethostname", lambda: HOST)
        monkeypatch.setattr(module.time, "time", lambda: STAMP + 0.75)


def _records(caplog, prefix="[METRICS]") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]


TIMINGS = [
    BatchTimings(preprocess=0.0012345, embed=0.0031, search=0.00045, rejected=1, unknown=1, top1=[0.31, 0.5, 1.25]),
    BatchTimings(preprocess=0.002, embed=0.004, search=0.001, rejected=0, unknown=0, top1=[0.1] * 8),
    BatchTimings(preprocess=0.001, rejected=3),  # every image refused: no distance gauge
]


@pytest.mark.parametrize("timings", TIMINGS, ids=["mixed", "clean", "all-refused"])
@pytest.mark.parametrize("request_ids", [IDS, None], ids=["in-a-batch", "no-request-ids"])
@pytest.mark.parametrize("version", ["2.5", None], ids=["versioned", "unversioned"])
def test_lines_are_exactly_what_torchserves_metrics_api_writes(caplog, fixed_host_and_clock, timings, request_ids,
                                                                version):
    batch = len(timings.top1) + timings.rejected
    reference, cache = _cache(request_ids), _cache(request_ids)
    with caplog.at_level(logging.INFO):
        _through_ts_api(reference, batch, timings, "embedding", version)
    expected = _records(caplog)
    assert len(expected) == len(caplog.records) == (9 if timings.top1 else 8)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        record_metrics(cache, batch, timings, "embedding", version)
    assert len(caplog.records) == 1  # one record: one write to the worker's stdout
    assert caplog.records[0].getMessage().split("\n") == expected


def test_one_record_carries_the_log_line_first_then_every_metric(caplog):
    timings = TIMINGS[0]
    line = batch_log_line(4, 4, timings, IDS)
    cache = _cache()
    with caplog.at_level(logging.INFO):
        record_metrics(cache, 4, timings, "embedding", "1.0", log_line=line)
    (record,) = caplog.records
    first, *metrics = record.getMessage().split("\n")
    assert first == line and all(m.startswith("[METRICS]Embedding") for m in metrics)
    assert [m.split("[METRICS]")[1].split(".")[0] for m in metrics] == list(METRIC_NAMES)
    assert all(m.endswith(",9f1c-aa,77d0-bb,0e4e-cc") for m in metrics)


def test_log_line_keeps_the_format_operators_read():
    timings = BatchTimings(preprocess=0.0019249, embed=0.0035, search=0.0004, rejected=1, unknown=2, top1=[0.2])
    line = batch_log_line(8, 9, timings, {0: "a", 1: "b"})
    assert re.fullmatch(r"batch=8 rejected=1 unknown=2 preprocess_ms=1\.92 embed_ms=3\.50 search_ms=0\.40 images=9 "
                        r"pid=\d+ ids=a,b", line), line
    assert batch_log_line(0, 0, BatchTimings(), None).endswith(" ids=")


def test_zero_counter_increments_are_left_out_once_the_counter_was_sent():
    sent: set = set()
    names = lambda lines: [line.split("[METRICS]")[1].split(".")[0] for line in lines]  # noqa: E731
    clean = BatchTimings(preprocess=0.001, embed=0.002, search=0.0005, top1=[0.2, 0.3])
    first = batch_metric_lines(2, clean, "embedding", "1.0", None, HOST, STAMP, sent)
    assert names(first) == list(METRIC_NAMES)  # the first batch registers every counter, zeros included
    second = batch_metric_lines(2, clean, "embedding", "1.0", None, HOST, STAMP, sent)
    assert "EmbeddingUnknownAnswers" not in names(second) and "EmbeddingRejectedInputs" not in names(second)
    assert {"EmbeddingAnsweredImages", "EmbeddingTop1DistanceSum", "EmbeddingBatchSize"} <= set(names(second))
    rejected = batch_metric_lines(1, BatchTimings(rejected=1), "embedding", "1.0", None, HOST, STAMP, sent)
    assert names(rejected) == ["EmbeddingPreprocessMs", "EmbeddingInferenceMs", "EmbeddingSearchMs",
                               "EmbeddingBatchSize", "EmbeddingRejectedInputs"]
    assert rejected[-1].startswith("[METRICS]EmbeddingRejectedInputs.Count:1|")
    # another version is another series: its counters are sent once again
    other = batch_metric_lines(2, clean, "embedding", "2.0", None, HOST, STAMP, sent)
    assert names(other) == list(METRIC_NAMES)
    # without the set every counter is written every time
    assert names(batch_metric_lines(2, clean, "embedding", "1.0", None, HOST, STAMP)) == list(METRIC_NAMES)


def test_images_without_a_neighbour_do_not_break_the_distance_figures():
    timings = BatchTimings(top1=[0.5, None, 0.25], unknown=1)
    lines = batch_metric_lines(3, timings, "embedding", "1.0", None, HOST, STAMP)
    values = {line.split("[METRICS]")[1].split(".")[0]: line.split(":")[1].split("|")[0] for line in lines}
    assert values["EmbeddingTop1Distance"] == "0.375" and values["EmbeddingAnsweredImages"] == "2"
    assert values["EmbeddingTop1DistanceSum"] == "0.75"


def test_a_served_batch_writes_one_record_with_its_log_line_and_metrics(loaded, caplog):
    handler, context = loaded
    from serving.samples import user_digit_png

    image = user_digit_png(np.pad(np.full((12, 6), 255, np.uint8), ((8, 8), (11, 11))))
    with caplog.at_level(logging.INFO):
        answers, statuses = run_batch(handler, context, [{"body": image}, {"body": b"not an image"}])
    assert statuses == [200, 400]
    batch = [r for r in caplog.records if "batch=" in r.getMessage()]
    assert len(batch) == 1, [r.getMessage()[:80] for r in caplog.records]
    first, *metrics = batch[0].getMessage().split("\n")
    assert first.startswith("batch=2 rejected=1 ") and first.endswith(" ids=req-0,req-1")
    assert {"EmbeddingRejectedInputs", "EmbeddingAnsweredImages", "EmbeddingBatchSize"} <= {
        m.split("[METRICS]")[1].split(".")[0] for m in metrics}
    assert all("|#ModelName:embedding,Level:Model,ModelVersion:1.0|" in m for m in metrics)


def test_with_the_handlers_log_line_silenced_the_metrics_still_go_out(loaded, caplog):
    handler, context = loaded
    from handler import embedding_handler

    silenced = logging.getLogger(embedding_handler.logger.name)
    level = silenced.level
    silenced.setLevel(logging.WARNING)
    try:
        with caplog.at_level(logging.INFO):
            run_batch(handler, context, [{"body": b"not an image"}])
    finally:
        silenced.setLevel(level)
    lines = [line for r in caplog.records for line in r.getMessage().split("\n")]
    assert not any("batch=" in line for line in lines)
    assert any(line.startswith("[METRICS]EmbeddingBatchSize.Count:1|") for line in lines), lines


def _answer_before(searcher: GallerySearcher, distances, ids, score):
    """GallerySearcher.answer as it was written before it worked on Python lists (the reference)."""
    from collections import defaultdict

    from handler.answer import Answer, Neighbour

    valid = ids >= 0
    distances, ids = distances[valid], ids[valid]
    if ids.size == 0:
        return Answer.of_vote(None, 0.0, None, (), "no_neighbours")
    labels = [str(label) for label in searcher.labels[ids]]
    weights = defaultdict(float)
    for label, dist in zip(labels, distances):
        weights[label] += 1.0 / (float(dist) + 1e-6)
    pred = max(weights, key=lambda lab: (weights[lab], -labels.index(lab)))
    unknown = bool(searcher.threshold is not None and score > searcher.threshold)
    return Answer.of_vote(pred, round(weights[pred] / sum(weights.values()), 6), round(float(distances[0]), 6),
                          tuple(Neighbour(lab, round(float(d), 6)) for lab, d in zip(labels, distances)),
                          "unlike_any_class" if unknown else None)


@pytest.mark.parametrize("labels", [[str(i % 10) for i in range(60)], [i % 3 for i in range(60)]], ids=["str", "int"])
def test_answers_are_the_ones_of_the_element_wise_code(labels):
    import faiss

    rng = np.random.default_rng(7)
    gallery = rng.standard_normal((60, 8)).astype(np.float32)
    index = faiss.IndexFlatL2(8)
    index.add(gallery)
    searcher = GallerySearcher(index, labels, k=5, threshold=1.5)
    queries = np.concatenate([rng.standard_normal((40, 8)).astype(np.float32), gallery[:3]])
    distances, ids, scores = searcher.search(queries)
    ids[5, 3:] = -1  # an approximate index's missing hits
    ids[6, :] = -1
    distances[7] = distances[7, 0]  # equal distances: the tie goes to the label met first
    for d, i, s in zip(distances, ids, scores):
        got = searcher.answer(d, i, s)
        assert got == _answer_before(searcher, d, i, s)
        assert [type(n["dist"]) for n in got["neighbours"]] == [float] * len(got["neighbours"])


def test_the_distance_gauge_is_the_batch_mean():
    rng = np.random.default_rng(3)
    for n in (1, 5, 8, 13):
        top1 = [round(float(v), 6) for v in rng.uniform(0.0, 2.0, n)]
        lines = batch_metric_lines(n, BatchTimings(top1=top1), "embedding", "1.0", None, HOST, STAMP)
        (gauge,) = [line for line in lines if line.startswith("[METRICS]EmbeddingTop1Distance.")]
        assert float(gauge.split(":")[1].split("|")[0]) == pytest.approx(float(np.mean(top1)), rel=1e-12, abs=0)
