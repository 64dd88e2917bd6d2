"""bench.profile_worker's stage rules: samples land where the code that ran them lives, and the rules still name
functions that exist (a rename would otherwise move their time into "other" without a word)."""

from __future__ import annotations

import importlib

from bench import profile_worker
from bench.profile_worker import STAGES, comparison, function_of, per_batch_us, stage_names, stage_of, tally

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
        PREDICT + ";" + POST + ";batch_log_line (embedding_handler.py:70) 2",
        PREDICT + ";EmbeddingHandler.preprocess (embedding_handler.py:110);EmbeddingService.prepare (handler/service.py:150)"
        ";Profile.normalize (handler/preprocessing.py:335) 8",
        ROOT + ";Service.predict (ts/service.py:180);create_predict_response (ts/protocol/otf_message_handler.py:80) 3",
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
    leaves: dict = {}
    counts = tally(raw, leaves)
    assert counts == {
        "model forward pass": 40, "image decoding (Pillow)": 25, "preprocessing (grey, crop, centre, normalise)": 8,
        "handler: per-batch log line and metrics": 6 + 3 + 2, "answers to JSON": 1,
        "gallery search": 5, "TorchServe: reading requests from the frontend": 7,
        "TorchServe: its own metrics and logging": 2, "TorchServe: encoding answers": 3,
        "TorchServe: the rest (socket, service wrapper)": 9, "handler: reading request rows": 4,
        "handler: the rest (content types, stacking the batch)": 2, "other": 1,
    }
    assert set(counts) == set(stage_names())
    # the innermost function of each sample, without its line number
    assert leaves["handler: per-batch log line and metrics"] == {"Logger.info (logging/__init__.py)": 6,
                                                                 "StreamHandler.emit (logging/__init__.py)": 3,
                                                                 "batch_log_line (embedding_handler.py)": 2}
    assert leaves["image decoding (Pillow)"] == {"ImageFile.load (PIL/ImageFile.py)": 25}


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
    from handler.preprocessing import decode_image
    from handler.protocols import read_row
    from handler.ts_metrics import record_metrics

    assert callable(EmbeddingService.embed) and callable(EmbeddingService.prepare)
    assert callable(EmbeddingHandler.postprocess) and callable(record_metrics) and GallerySearcher
    assert callable(entry.batch_log_line) and callable(decode_image) and callable(read_row)
    otf = importlib.import_module("ts.protocol.otf_message_handler")
    assert callable(otf.retrieve_msg) and callable(otf.create_predict_response)
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
    names = stage_names()
    assert names[-1] == "other" and [stage for stage, _ in STAGES][-1] == "other"
    # a stage's rules are adjacent, so that its place in the order is one place
    rules = [stage for stage, _ in STAGES]
    positions = [[i for i, rule in enumerate(rules) if rule == name] for name in names]
    assert all(p == list(range(p[0], p[0] + len(p))) for p in positions)
    # handler-specific stages come before TorchServe's catch-all, or the catch-all would swallow them
    assert names.index("handler: per-batch log line and metrics") < names.index(
        "TorchServe: the rest (socket, service wrapper)")
    assert names.index("image decoding (Pillow)") < names.index("preprocessing (grey, crop, centre, normalise)")


def test_function_of_drops_only_a_line_number():
    assert function_of("Logger.info (logging/__init__.py:1500)") == "Logger.info (logging/__init__.py)"
    assert function_of("<module> (somewhere_else.py:1)") == "<module> (somewhere_else.py)"
    assert function_of("__init__ (<string>)") == "__init__ (<string>)"
    assert function_of("f (c:/path/x.py:12)") == "f (c:/path/x.py)"


def _run(throughput, mean_batch, worker, java, shares):
    return {"run": {"throughput": throughput, "mean_batch": mean_batch, "cpu": {"worker": worker,
                                                                                 "frontend (java)": java},
                    "stages": {name: {"samples": int(share * 1000), "share": share} for name, share in shares.items()}}}


def test_cpu_per_batch_is_the_cpu_over_the_batch_rate():
    run = _run(1000.0, 8.0, 150.0, 50.0, {})["run"]  # 125 batches/s; 1.5 cores -> 12 ms of worker CPU per batch
    assert per_batch_us(run, 150.0) == 12000.0 and per_batch_us(run, 50.0) == 4000.0
    assert per_batch_us({**run, "mean_batch": None}, 150.0) != per_batch_us({**run, "mean_batch": None}, 150.0)  # NaN


def test_comparison_rows_hold_both_runs_and_stages_only_one_has():
    before = _run(1000.0, 8.0, 150.0, 50.0, {"model forward pass": 0.5, "handler: per-batch log line": 0.1,
                                             "other": 0.0})
    after = _run(1100.0, 8.0, 140.0, 45.0, {"model forward pass": 0.6, "other": 0.0})
    table = comparison(before, after)
    assert table[0].startswith("| per batch | before:")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table[2:]}
    assert rows["model forward pass"] == "| model forward pass | 50.0% | 6000 | 60.0% | 6109 |"
    assert rows["handler: per-batch log line"] == "| handler: per-batch log line | 10.0% | 1200 | - | - |"
    assert "other" not in rows  # no samples on either side
    assert rows["**worker, all stages**"].endswith("| 12000 | | 10182 |")
