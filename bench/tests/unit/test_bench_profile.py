"""bench.profile_worker's stage rules: samples land where the code that ran them lives, and the rules still name
functions that exist (a rename would otherwise move their time into "other" without a word)."""

from __future__ import annotations

import importlib

from bench import profile_worker
from bench.profile_worker import STAGES, stage_of, tally

POST = "EmbeddingHandler.postprocess (embedding_handler.py:125)"
ROOT = "<module> (ts/model_service_worker.py:300);TorchModelServiceWorker.handle_connection (ts/model_service_worker.py:180)"
PREDICT = ROOT + ";Service.predict (ts/service.py:120);BaseHandler.handle (ts/torch_handler/base_handler.py:420)"


def test_each_sample_goes_to_the_first_stage_its_stack_matches():
    raw = [
        PREDICT + ";EmbeddingHandler.inference (embedding_handler.py:115);EmbeddingService.predict (handler/service.py:200)"
        ";EmbeddingService.embed (handler/service.py:180);Module._call_impl (torch/nn/modules/module.py:1784) 40",
        PREDICT + ";EmbeddingHandler.preprocess (embedding_handler.py:110);EmbeddingService.prepare (handler/service.py:150)"
        ";decode_image (handler/preprocessing.py:90);ImageFile.load (PIL/ImageFile.py:300) 25",
        PREDICT + ";" + POST + ";record_metrics (handler/ts_metrics.py:35);CachingMetric.add_or_update "
        "(ts/metrics/caching_metric.py:80);Logger.info (logging/__init__.py:1500) 6",
        PREDICT + ";" + POST + ";Logger.info (logging/__init__.py:1500);StreamHandler.emit (logging/__init__.py:1100) 3",
        PREDICT + ";" + POST + ";dumps (json/__init__.py:231) 1",
        PREDICT + ";EmbeddingHandler.inference (embedding_handler.py:115);EmbeddingService.predict (handler/service.py:200)"
        ";GallerySearcher.search (handler/search.py:90) 5",
        ROOT + ";retrieve_msg (ts/protocol/otf_message_handler.py:40);_retrieve_buffer "
        "(ts/protocol/otf_message_handler.py:200) 7",
        PREDICT + ";MetricCacheAbstract.add_time (ts/metrics/metric_cache_abstract.py:160) 2",
        ROOT + " 9",
        PREDICT + ";EmbeddingHandler.preprocess (embedding_handler.py:110);read_row (handler/requests.py:40) 4",
        PREDICT + ";EmbeddingHandler.inference (embedding_handler.py:115);EmbeddingService.predict (handler/service.py:200)"
        ";stack (numpy/_core/shape_base.py:450) 2",
        "<module> (somewhere_else.py:1) 1",
        "a line without a count",
    ]
    counts = tally(raw)
    assert counts == {
        "model forward pass": 40, "image decoding and preprocessing": 25,
        "handler: Prometheus metrics per batch": 6, "handler: per-batch log line": 3, "answers to JSON": 1,
        "gallery search": 5, "TorchServe: reading requests from the frontend": 7,
        "TorchServe: its own metrics and logging": 2, "TorchServe: the rest (sending answers, service wrapper)": 9,
        "handler: the rest (reading request bodies, stacking the batch)": 6, "other": 1,
    }
    assert set(counts) == {stage for stage, _ in STAGES}


def test_no_sample_under_the_handler_is_counted_as_torchserve_s():
    handler_stages = [stage for stage, _ in STAGES if not stage.startswith(("TorchServe", "other"))]
    for frame in ("EmbeddingHandler.preprocess (embedding_handler.py:110)",
                  "EmbeddingHandler.inference (embedding_handler.py:115)", POST):
        stack = (PREDICT + ";" + frame + ";anything (somewhere.py:1);MetricCacheAbstract.add_time "
                 "(ts/metrics/metric_cache_abstract.py:160)").split(";")
        assert stage_of(stack) in handler_stages, frame


def test_the_rules_name_functions_that_exist():
    import handler.embedding_handler as entry
    from handler.embedding_handler import EmbeddingHandler
    from handler.search import GallerySearcher
    from handler.service import EmbeddingService
    from handler.ts_metrics import record_metrics

    assert callable(EmbeddingService.embed) and callable(EmbeddingService.prepare)
    assert callable(EmbeddingHandler.postprocess) and callable(record_metrics) and GallerySearcher
    otf = importlib.import_module("ts.protocol.otf_message_handler")
    assert callable(otf.retrieve_msg)
    assert importlib.import_module("ts.metrics.caching_metric").__file__.replace("\\", "/").find("ts/metrics/") > 0
    assert stage_of(["EmbeddingService.embed (handler/service.py:1)"]) == "model forward pass"
    assert entry.__file__.endswith("embedding_handler.py")  # the file name the catch-all handler rule matches


def test_without_py_spy_it_stops_with_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(profile_worker.shutil, "which", lambda *a, **k: None)
    assert profile_worker.main(["--artifacts", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bench.profile_worker: error: py-spy not found: .venv/bin/pip install -r requirements-bench.txt"]
    assert not (tmp_path / "out").exists()


def test_rules_cover_the_stages_in_order():
    names = [stage for stage, _ in STAGES]
    assert names[-1] == "other" and len(set(names)) == len(names)
    # handler-specific stages come before TorchServe's catch-all, or the catch-all would swallow them
    assert names.index("handler: Prometheus metrics per batch") < names.index(
        "TorchServe: the rest (sending answers, service wrapper)")
