"""The python runtime's parts without a server: the rows TorchServe 0.12 makes of a request (observed with a handler
that echoed its rows, and checked end to end by tests/integration/test_runtime_conformance.py), TorchServe's error
bodies, the batcher, the archive checks, and the metrics under TorchServe's names."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import zipfile

import pytest
from prometheus_client.parser import text_string_to_metric_families

from handler.service import BatchTimings
from handler.ts_metrics import batch_metric_lines
from serving.gateway.backend import InferenceCall
from serving.python_runtime.archive import RUNTIME_MODULES, ArchiveError, open_archive
from serving.python_runtime.in_process import inference_target, torchserve_error
from serving.python_runtime.batcher import Batcher, Job
from serving.python_runtime.metrics import batch_values
from serving.python_runtime.metrics_page import render
from serving.forms import FormError
from serving.python_runtime.request_rows import request_row
from settings import REPO


def row(data: bytes, content_type: str | None = None, **headers: str):
    if content_type is not None:
        headers["Content-Type"] = content_type
    return request_row(InferenceCall("POST", "/predictions/embedding", data, headers))


# --- rows as TorchServe makes them -------------------------------------------------------------------------------

def test_the_body_is_one_parameter_typed_by_its_media_type():
    assert row(b"abc", "image/png") == ({"body": b"abc"}, {"body": "image/png"})
    assert row(b"") == ({"body": b""}, {"body": ""})
    assert row(b'{"a": 1}', "application/json;charset=utf-8") == ({"body": {"a": 1}}, {"body": "application/json"})
    assert row(b"{bad", "application/json") == ({"body": b"{bad"}, {"body": "application/json"})
    assert row(b"hello", "text/plain") == ({"body": "hello"}, {"body": "text/plain"})
    assert row(b"\xff", "text/plain") == ({"body": b"\xff"}, {"body": "text/plain"})
    assert row(b"[" * 100_000, "application/json")[0] == {"body": b"[" * 100_000}  # RecursionError: bytes kept


def test_multipart_parts_become_parameters():
    boundary = "b0undary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"data\"; filename=\"d.png\"\r\n\r\n".encode()
            + b"\x89PNG\r\n" + f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"embedding\"\r\n\r\n"
            f"true\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"meta\"; filename=\"m.json\"\r\n"
            f"Content-Type: application/json; charset=utf-8\r\n\r\n{{\"k\": 1}}\r\n--{boundary}--\r\n".encode())
    got = row(body, f"multipart/form-data; boundary={boundary}")
    assert got == ({"data": b"\x89PNG\r\n", "embedding": b"true", "meta": {"k": 1}},
                   {"data": "application/octet-stream", "embedding": "", "meta": "application/json"})
    assert row(b"\x89PNG", "multipart/form-data; boundary=x") == ({}, {})  # no boundary in the body: no part
    assert row(b"\x89PNG", "multipart/form-data") == ({"body": b"\x89PNG"}, {"body": "multipart/form-data"})


def test_urlencoded_fields_as_netty_decodes_them():
    form = "application/x-www-form-urlencoded"
    assert row(b"abc", form) == ({}, {})  # a last field without "=" is dropped
    assert row(b"c&a=1", form) == ({"c": b"", "a": b"1"}, {"c": "", "a": ""})
    assert row(b"a=1&a=2&", form) == ({"a": b"2"}, {"a": ""})
    assert row(b"x=%41+b%20&a+b=b=c", form) == ({"x": b"A b ", "a b": b"b=c"}, {"x": "", "a b": ""})
    assert row(b"data=%89PNG", form)[0] == {"data": b"\x89PNG"}
    for bad in (b"=v", b"&&a=1", b"a=%ZZ", b"a=%4"):
        with pytest.raises(FormError):
            row(bad, form)


def test_a_header_named_like_a_parameter_hides_its_type():
    """TorchServe's worker merges the request headers over the parameters' content types."""
    assert row(b"abc", "image/png", body="x") == ({"body": b"abc"}, {})


def test_torchserves_error_bodies():
    assert torchserve_error(404, "ModelNotFoundException", "Model not found: nothere") == (
        b'{\n  "code": 404,\n  "type": "ModelNotFoundException",\n  "message": "Model not found: nothere"\n}\n')
    assert b'"Model not found: a\\u003db\\u0026c\\u003c"' in torchserve_error(404, "ModelNotFoundException",
                                                                                 "Model not found: a=b&c<")


@pytest.mark.parametrize("path, target", [
    ("/predictions/embedding", ("embedding", None)), ("/predictions/embedding/1.0", ("embedding", "1.0")),
    ("/predictions/emb%20edding/v%2F1", ("emb edding", "v/1")), ("/v1/models/embedding:predict", ("embedding", None)),
    ("/v2/models/embedding/infer", ("embedding", None)), ("/v2/models/embedding", None), ("/ping", None),
])
def test_inference_paths(path, target):
    assert inference_target(path) == target


# --- batching ----------------------------------------------------------------------------------------------------

def run_batches(jobs: list[tuple[str, int]], max_batch: int, fail_version: str = "") -> tuple[list, list]:
    """Submit `jobs` (version, value) at once; (the batches the answerer saw, each job's result)."""
    seen: list[tuple[str, list]] = []

    def answer(version, rows):
        if version == fail_version:
            raise RuntimeError("boom")
        time.sleep(0.01)
        seen.append((version, list(rows)))
        return [value * 10 for value in rows]

    async def main():
        batcher = Batcher(answer, lambda version, exc: f"failed: {exc}", max_batch)
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(Job(version, value)) for version, value in jobs))
        finally:
            await batcher.stop()

    return seen, asyncio.run(main())


def test_queued_requests_of_one_version_share_a_batch_up_to_the_limit():
    """The oldest request's version goes first; the others of that version ride along, up to the limit."""
    jobs = [("1", 1), ("1", 2), ("2", 3), ("1", 4), ("1", 5)]
    seen, results = run_batches(jobs, max_batch=2)
    assert results == [10, 20, 30, 40, 50]
    assert seen == [("1", [1, 2]), ("2", [3]), ("1", [4, 5])]
    assert run_batches(jobs, max_batch=8)[0] == [("1", [1, 2, 4, 5]), ("2", [3])]


def test_a_failed_batch_fails_its_requests_only():
    seen, results = run_batches([("bad", 1), ("1", 2)], max_batch=8, fail_version="bad")
    assert results == ["failed: boom", 20] and seen == [("1", [2])]


def test_a_lone_request_never_waits_for_company():
    async def main():
        batcher = Batcher(lambda version, rows: list(rows), lambda version, exc: None, 8)
        batcher.start()
        job = Job("1", 0)
        await batcher.submit(job)
        await batcher.stop()
        return job.started - job.arrived

    assert asyncio.run(main()) < 0.005


# --- archives ----------------------------------------------------------------------------------------------------

def mar(tmp_path, files: dict[str, bytes]):
    path = tmp_path / "m.mar"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


MANIFEST = json.dumps({"model": {"modelName": "embedding", "modelVersion": "1.0", "handler": "embedding_handler.py",
                                 "configFile": "model-config.yaml"}}).encode()
#: The handler package of an archive the runtime serves: the modules its workers import.
HANDLER = {f"handler/{name}": b"" for name in ("__init__.py", *RUNTIME_MODULES)}


def test_an_archive_of_this_projects_handler_opens(tmp_path):
    path = mar(tmp_path, {"MAR-INF/MANIFEST.json": MANIFEST, **HANDLER,
                          "model-config.yaml": b"batchSize: 8\nminWorkers: 2\nhandler:\n  threads: 1\n"})
    archive = open_archive(path, tmp_path / "out")
    assert (archive.name, archive.version, archive.batch_size, archive.workers) == ("embedding", "1.0", 8, 2)
    assert archive.handler_settings == {"threads": 1} and len(archive.code_digest()) == 64


@pytest.mark.parametrize("files, message", [
    ({"x": b""}, "no MAR-INF/MANIFEST.json"),
    ({"MAR-INF/MANIFEST.json": MANIFEST.replace(b"embedding_handler.py", b"image_classifier")},
     "is not this project's"),
    ({"MAR-INF/MANIFEST.json": MANIFEST, "handler/__init__.py": b"", "../evil": b""}, "outside the model directory"),
    ({"MAR-INF/MANIFEST.json": b"[1]", "handler/__init__.py": b""}, "is not a model manifest"),
    ({"MAR-INF/MANIFEST.json": MANIFEST, **{k: v for k, v in HANDLER.items() if not k.endswith("metric_names.py")}},
     r"handler/ package has no metric_names.py: packed before this runtime could serve it; rebuild it"),
])
def test_archives_this_runtime_cannot_serve_are_refused(tmp_path, files, message):
    with pytest.raises(ArchiveError, match=message):
        open_archive(mar(tmp_path, files), tmp_path / "out")


def test_a_file_that_is_no_archive_is_refused(tmp_path):
    (tmp_path / "plain.mar").write_bytes(b"not a zip")
    with pytest.raises(ArchiveError, match="not a readable model archive"):
        open_archive(tmp_path / "plain.mar", tmp_path / "out")
    with pytest.raises(ArchiveError, match="no such file"):
        open_archive(tmp_path / "missing.mar", tmp_path / "out2")


# --- metrics -----------------------------------------------------------------------------------------------------

def test_batch_values_are_the_handlers():
    timings = BatchTimings(preprocess=0.002, embed=0.001, search=0.0005, rejected=1, unknown=1, top1=[0.25, 0.5])
    lines = batch_metric_lines(3, timings, "embedding", "1.0", None, "h", 0)
    handler = {line.split(".", 1)[0].removeprefix("[METRICS]"): float(line.split(":", 1)[1].split("|")[0])
               for line in lines}
    assert batch_values(3, timings) == pytest.approx(handler)


def test_the_page_writes_counters_under_torchserves_names(tmp_path):
    from prometheus_client import CollectorRegistry, Counter, Gauge

    registry = CollectorRegistry()
    Counter("Requests2XX", "h", ["Level", "Hostname"], registry=registry).labels("Host", "vm").inc(2)
    Counter("ts_inference_requests_total", "h", ["model_name"], registry=registry).labels("e").inc()
    Gauge("PredictionTime", "h", ["ModelName"], registry=registry).labels("e").set(1.5)
    text = render(registry.collect(), scrapes=3, host="vm").decode()
    assert 'Requests2XX{Level="Host",Hostname="vm"} 5.0\n' in text and "# TYPE Requests2XX counter" in text
    assert 'ts_inference_requests_total{model_name="e"} 1.0\n' in text and "_created" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["PredictionTime"].samples[0].value == 1.5
    assert "Requests2XX" in render([], scrapes=1, host="vm").decode()  # scrapes alone make the counter exist



# --- what it needs installed -------------------------------------------------------------------------------------

#: What a worker and the supervisor import, the archive's handler package included (from the repository here).
RUNTIME_IMPORTS = ("serving.python_runtime.cli", "serving.python_runtime.worker", "handler.metric_names",
                   "handler.protocols", "handler.service")


def test_the_runtime_runs_without_the_torchserve_package():
    """Its image has no TorchServe: `import ts` (and Java's absence) must never be needed by its processes."""
    code = ("import sys; sys.modules['ts'] = None\n"  # any `import ts...` now raises ImportError
            f"import importlib; [importlib.import_module(m) for m in {RUNTIME_IMPORTS!r}]\n"
            "print(sorted(m for m in sys.modules if m == 'ts' or m.startswith('ts.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "['ts']"  # only the blocker itself
