"""serving.server_logs.load_failure: the one line `serving start` ends with when TorchServe cannot load the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.server import Instance
from serving.server_logs import load_failure, log_offsets

RECORD = "2026-11-26T23:49:46,845 [WARN ] main org.pytorch.serve.ModelServer - "


def instance_with_logs(tmp_path: Path, ts_log: str = "", model_log: str = "") -> Instance:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "ts_log.log").write_text(ts_log)
    (tmp_path / "logs" / "model_log.log").write_text(model_log)
    return Instance(workdir=tmp_path)


@pytest.mark.parametrize("ts_log, expected", [
    (RECORD + "Failed to load model: embedding.mar\njava.io.EOFException: Unexpected end of ZLIB input stream\n"
     "\tat java.util.zip.InflaterInputStream.fill(InflaterInputStream.java:244)\n",
     "TorchServe failed to load model embedding.mar: java.io.EOFException: Unexpected end of ZLIB input stream"),
    (RECORD + "Failed to load model: embedding.mar (java.io.EOFException)\n" + RECORD + "next record\n",
     "TorchServe failed to load model embedding.mar: java.io.EOFException"),
    (RECORD + "Failed to load model: embedding.mar\n" + RECORD + "next record\n",
     "TorchServe failed to load model embedding.mar"),
])
def test_the_frontends_load_failure_is_one_line_naming_the_archive(tmp_path, ts_log, expected):
    assert load_failure(instance_with_logs(tmp_path, ts_log), (0, 0)) == expected


def test_the_handlers_refusal_is_reported_from_the_model_log(tmp_path):
    line = "2026-11-26T23:49:46,845 [INFO ] W-9000 MODEL_LOG - refusing to load model: metadata.json sha256 mismatch\n"
    assert load_failure(instance_with_logs(tmp_path, model_log=line), (0, 0)) == (
        "refusing to load model: metadata.json sha256 mismatch")


def test_failures_logged_before_this_start_are_ignored(tmp_path):
    instance = instance_with_logs(tmp_path, RECORD + "Failed to load model: embedding.mar (java.io.EOFException)\n")
    offsets = log_offsets(instance)
    assert load_failure(instance, offsets) is None
    with open(instance.workdir / "logs" / "ts_log.log", "a") as log:
        log.write(RECORD + "Loading initial models: embedding.mar\n")
    assert load_failure(instance, offsets) is None
