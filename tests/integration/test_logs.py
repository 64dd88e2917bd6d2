"""What a real TorchServe writes under logs/ with the shipped log4j2 configuration.

The instance is private (its own workdir, TMPDIR and ports) and gets the configuration through vmargs, as
`torchserve --log-config` passes it; it serves the suite's tiny archive. It runs without the local front
(serving.front), so the refused body reaches TorchServe's form decoder, as with an https address; the last test
sends the same body through the front.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.torchserve import running_instance

from serving.log_growth import (FileSize, Sender, access_lines, files_holding, growth, refused_body,
                                repeated_lines, sample_digit, snapshot, wait_for_access_lines)
from serving.server import Instance, model_status
from settings import LOG_CONFIG_FILE, properties

pytestmark = pytest.mark.serving

REQUESTS = 50
LOG_FILES = ("access_log.log", "model_log.log", "ts_log.log")
EVENT_LINE = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3} ")


@dataclass(frozen=True)
class Logged:
    logs: Path
    predictions: dict[str, bytes]
    refused: dict[str, bytes]
    refused_status: int
    refused_answer: dict
    marker: bytes
    access_before: int
    access_after: int
    metrics: str


@pytest.fixture(scope="module")
def logged(tmp_path_factory, model_store) -> Logged:
    """REQUESTS sample digits, then one form-encoded body the frontend refuses, each step's log growth measured."""
    workdir = tmp_path_factory.mktemp("logs-instance")
    vmargs = f"{properties()['vmargs']} -Dlog4j.configurationFile={LOG_CONFIG_FILE}"
    marker = b"refused-body-marker-" + secrets.token_hex(8).encode()
    image = sample_digit()
    with running_instance(workdir, model_store, front=False, vmargs=vmargs) as instance:
        _wait_all_workers_ready(instance)
        logs = workdir / "logs"
        url = f"{instance.endpoints.inference}/predictions/{instance.model_name}"
        sender = Sender(url, instance.keys()["inference"])
        access_before = access_lines(logs)
        start = snapshot(logs)
        try:
            statuses = [sender.post(image, "application/octet-stream")[0] for _ in range(REQUESTS)]
            wait_for_access_lines(logs, access_before + REQUESTS)
            middle = snapshot(logs)
            status, body = sender.post(refused_body(marker, image), "application/x-www-form-urlencoded")
        finally:
            sender.close()
        access_after = wait_for_access_lines(logs, access_before + REQUESTS + 1)
        end = snapshot(logs)
        with urllib.request.urlopen(f"{instance.endpoints.metrics}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
    assert statuses == [200] * REQUESTS
    return Logged(logs, _added(logs, start, middle), _added(logs, middle, end), status, json.loads(body), marker,
                  access_before, access_after, metrics)


def _wait_all_workers_ready(instance: Instance, timeout: float = 120.0) -> None:
    """Until every worker is READY (start() returns at the first), so no worker's start-up lines fall in a step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [w for version in model_status(instance) for w in version.get("workers", [])]
        if workers and all(w.get("status") == "READY" for w in workers):
            return
        time.sleep(0.2)
    raise AssertionError(f"workers not all READY after {timeout:.0f}s: {workers}")


def _added(logs: Path, before: dict[str, FileSize], after: dict[str, FileSize]) -> dict[str, bytes]:
    """The bytes each log file gained between two snapshots (none rotates: the files stay far below 10 MB)."""
    assert all(size.bytes >= 0 for size in growth(before, after).values())
    empty = FileSize(0, 0)
    return {name: (logs / name).read_bytes()[before.get(name, empty).bytes:after.get(name, empty).bytes]
            for name in (*LOG_FILES, "torchserve.out")}


def test_one_access_log_line_per_request(logged):
    assert logged.access_after - logged.access_before == REQUESTS + 1
    lines = logged.predictions["access_log.log"].splitlines()
    assert len(lines) == REQUESTS and all(b'"POST /predictions/embedding HTTP/1.1" 200 ' in line for line in lines)


def test_no_line_is_written_twice(logged):
    for name in LOG_FILES:
        assert repeated_lines(logged.logs / name) == [], name


def test_every_line_is_one_event(logged):
    for name in LOG_FILES:
        lines = (logged.logs / name).read_bytes().splitlines()
        assert lines and all(EVENT_LINE.match(line) for line in lines), name


def test_answered_requests_add_no_frontend_lines_and_one_model_line_per_batch(logged):
    assert logged.predictions["ts_log.log"] == logged.predictions["torchserve.out"] == b""
    lines = logged.predictions["model_log.log"].splitlines()
    assert 0 < len(lines) <= REQUESTS and all(b" MODEL_LOG - batch=" in line for line in lines), lines[:5]
    assert sum(int(re.search(rb" batch=(\d+) ", line).group(1)) for line in lines) == REQUESTS


def test_a_refused_body_is_logged_as_one_line_without_its_bytes(logged):
    # The frontend's form decoder quoted the body back to the client, so it had the marker in hand.
    assert logged.refused_status == 500 and logged.refused_answer["type"] == "ErrorDataDecoderException"
    assert logged.marker.decode() in logged.refused_answer["message"]
    (line,) = logged.refused["ts_log.log"].splitlines()
    assert line.endswith(b"HttpRequestHandler -  (io.netty.handler.codec.http.multipart."
                         b"HttpPostRequestDecoder$ErrorDataDecoderException)")
    assert files_holding(logged.logs, logged.marker) == []
    assert files_holding(logged.logs, b"%zz") == []


def test_metric_log_files_are_off_and_metrics_still_served(logged):
    assert not (logged.logs / "ts_metrics.log").exists() and not (logged.logs / "model_metrics.log").exists()
    assert re.search(r"^EmbeddingAnsweredImages\{.*\} (\d+\.\d+)$", logged.metrics, re.M)
    assert re.search(r"^ts_inference_requests_total\{.*\} (\d+\.\d+)$", logged.metrics, re.M)


def test_through_the_front_the_same_body_is_refused_by_the_handler_in_one_line(torchserve):
    """The front passes the non-ASCII "form" on as bytes: the handler answers 400 and logs one line, no bytes."""
    logs = Path(torchserve.workdir) / "logs"
    marker = b"refused-body-marker-" + secrets.token_hex(8).encode()
    before = snapshot(logs)
    sender = Sender(f"{torchserve.endpoints.inference}/predictions/{torchserve.model_name}",
                    torchserve.keys()["inference"])
    try:
        status, body = sender.post(refused_body(marker, sample_digit()), "application/x-www-form-urlencoded")
    finally:
        sender.close()
    assert status == 400 and "not an image" in json.loads(body)["error"]
    deadline = time.monotonic() + 10
    while b"refused request" not in _added(logs, before, snapshot(logs))["model_log.log"]:
        assert time.monotonic() < deadline, "the handler logged no refusal"
        time.sleep(0.1)
    lines = _added(logs, before, snapshot(logs))["model_log.log"].splitlines()
    (line,) = [line for line in lines if b"refused request" in line]
    assert b": 400 " in line and all(b" MODEL_LOG - batch=" in other for other in lines if other != line)
    assert files_holding(logs, marker) == []
