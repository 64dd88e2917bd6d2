"""Queue-based inference against a real RabbitMQ node (scripts/rabbitmq.sh) and a real TorchServe."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pika
import pytest
from serving.server import free_ports
from serving.samples import user_digit_png

from client import AuthError, BadImageError, ConnectionFailed, ModelNotFoundError, RequestTimeout, ServerError
from handler.requests import RequestError
from queue_bridge import QueueClient, Topology
from queue_bridge.model_backend import ModelBackend, Outcome, TokenSource, outcome_of
from queue_bridge.protocol import image_from_message
from client import EmbeddingClient
from settings import REPO

serving = pytest.mark.serving  # needs TorchServe (and the broker): skipped by -m "not serving"


# --- no broker needed ------------------------------------------------------------------------------

@pytest.mark.parametrize("body, content_type, expected", [
    (b"\x89PNG...", None, b"\x89PNG..."),
    (b"\x89PNG...", "application/octet-stream", b"\x89PNG..."),
    (b"\x89PNG...", "image/png", b"\x89PNG..."),
    (json.dumps({"data": base64.b64encode(b"\x89PNG...").decode()}).encode(), "application/json; charset=utf-8",
     b"\x89PNG..."),
])
def test_request_forms_give_the_image_bytes(body, content_type, expected):
    assert image_from_message(body, content_type) == expected


@pytest.mark.parametrize("body, content_type, status", [
    (b"", "application/octet-stream", 400),
    (b"{not json", "application/json", 400),
    (b'["a list"]', "application/json", 400),
    (b'{"data": "***"}', "application/json", 400),
    (b"\x80\x04\x95pickled", "application/x-python-pickle", 415),
    (b"hello", "text/plain", 415),
    (b"\0" * (8 * 1024 * 1024 + 1), "application/octet-stream", 413),
])
def test_bad_requests_become_error_answers(body, content_type, status):
    with pytest.raises(RequestError) as info:
        image_from_message(body, content_type)
    assert info.value.status == status


@pytest.mark.parametrize("error, retried", [
    (BadImageError("not an image Pillow can read", 400), False),
    (BadImageError("request too large", 413), False),
    (AuthError("token refused", "refused"), True),
    (ModelNotFoundError("model 'embedding' is not loaded", "embedding"), True),
    (ServerError("unavailable (503)", 503), True),
    (ServerError("answered 500", 500), True),
    (ConnectionFailed("connection refused"), True),
    (RequestTimeout("no answer within 30s"), True),
])
def test_only_failures_that_are_not_the_requests_fault_are_retried(error, retried):
    outcome = outcome_of(error)
    assert (outcome.retry is not None) is retried
    if not retried:
        assert outcome.answer == {"error": error.message, "status": error.status}


# --- real broker and TorchServe ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def digits(prepared_sample) -> list[bytes]:
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    return [user_digit_png(prepared_sample.test_images[i]) for i in picks]


@pytest.fixture(scope="module")
def direct(torchserve) -> Callable[[bytes], dict]:
    """The same image straight through TorchServe's REST API."""
    rest = EmbeddingClient(torchserve.endpoints.inference, model=torchserve.model_name,
                           token=torchserve.keys()["inference"], retries=0)

    def answer(image: bytes) -> dict:
        try:
            return rest.predict(image)
        except BadImageError as exc:
            return exc.answer()
    return answer


@pytest.fixture
def queue(request) -> str:
    return f"test.{request.node.name[:40]}.{uuid.uuid4().hex[:6]}"


class Admin:
    """A side connection to look into queues the way an operator would."""

    def __init__(self, url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()

    def ready(self, queue: str) -> int:
        return self.channel.queue_declare(queue, passive=True).method.message_count

    def consumers(self, queue: str) -> int:
        return self.channel.queue_declare(queue, passive=True).method.consumer_count

    def get(self, queue: str, timeout: float = 10.0) -> tuple[pika.spec.BasicProperties, bytes]:
        """Take one message off `queue`, waiting for it to arrive."""
        deadline = time.monotonic() + timeout
        while True:
            method, properties, body = self.channel.basic_get(queue, auto_ack=True)
            if method is not None:
                return properties, body
            assert time.monotonic() < deadline, f"nothing arrived in {queue} within {timeout:.0f}s"
            time.sleep(0.05)

    def wait_ready(self, queue: str, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.ready(queue) != n:
            assert time.monotonic() < deadline, f"{queue}: {self.ready(queue)} messages ready, expected {n}"
            time.sleep(0.02)

    def wait_consumers(self, queue: str, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.consumers(queue) != n:
            assert time.monotonic() < deadline, f"{queue}: {self.consumers(queue)} consumers, expected {n}"
            time.sleep(0.05)


@pytest.fixture
def admin(rabbitmq) -> Iterator[Admin]:
    admin = Admin(rabbitmq)
    yield admin
    admin.connection.close()


@pytest.fixture
def start_bridge(rabbitmq, torchserve, queue, admin, tmp_path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start `python -m queue_bridge serve` processes on the test's queue; killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(*extra: str, inference_url: str | None = None) -> subprocess.Popen:
        with open(tmp_path / f"bridge{len(procs)}.log", "wb") as log:  # the child keeps its own handle
            proc = subprocess.Popen(
                [sys.executable, "-m", "queue_bridge", "--url", rabbitmq, "--queue", queue, "serve",
                 "--inference-url", inference_url or torchserve.endpoints.inference,
                 "--key-file", str(torchserve.key_file), *extra],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        Topology(queue).declare(admin.channel)
        admin.wait_consumers(queue, sum(p.poll() is None for p in procs))
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.fixture
def client(rabbitmq, queue) -> Iterator[QueueClient]:
    with QueueClient(rabbitmq, queue) as client:
        yield client


def wait_all(futures, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for future in futures:
        future.result(max(0.0, deadline - time.monotonic()))


def wait_answered(futures, n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(f.done() for f in futures) < n:
        assert time.monotonic() < deadline, f"fewer than {n} answers within {timeout:.0f}s"
        time.sleep(0.005)


def same_answer(got: dict, want: dict) -> bool:
    """Equal up to float noise: batches of different sizes may round the last digit differently."""
    return (got["pred"] == want["pred"] and got["unknown"] == want["unknown"]
            and abs(got["dist"] - want["dist"]) < 1e-4
            and [n["label"] for n in got["neighbours"]] == [n["label"] for n in want["neighbours"]])


@serving
def test_round_trip_equals_direct_rest_in_every_form(start_bridge, client, direct, digits, rabbitmq, queue):
    start_bridge()
    for png in digits[:3]:
        assert client(png, timeout=30) == direct(png)
        as_json = json.dumps({"data": base64.b64encode(png).decode()}).encode()
        assert client(as_json, timeout=30, content_type="application/json") == direct(png)
    bad = b"this is not an image"
    assert client(bad, timeout=30) == direct(bad)
    assert client(bad, timeout=30)["status"] == 400
    refused = client(b"\x80\x04\x95pickle", timeout=30, content_type="application/python-pickle")
    assert refused["status"] == 415 and "not accepted" in refused["error"]

    cli = subprocess.run([sys.executable, "-m", "queue_bridge", "--url", rabbitmq, "--queue", queue,
                          "call", str(REPO / "README.md"), "--timeout", "30"],
                         cwd=REPO, check=False, capture_output=True, text=True)
    assert cli.returncode == 1, cli.stderr
    assert json.loads(cli.stdout) == {"image": str(REPO / "README.md"), **direct(bad)}


@serving
def test_100_concurrent_requests_answered_exactly_once_by_two_bridges(start_bridge, client, direct, digits,
                                                                    admin, queue):
    start_bridge("--prefetch", "8")
    start_bridge("--prefetch", "8")
    expected = [direct(png) for png in digits]
    futures = [client.submit(digits[i % 10]) for i in range(100)]
    wait_all(futures, 60)
    for i, future in enumerate(futures):
        assert same_answer(future.result(), expected[i % 10]), i
    assert {f.headers["attempt"] for f in futures} == {1}
    assert len({f.headers["bridge"] for f in futures}) == 2  # both bridges took a share
    time.sleep(0.3)  # a second answer to any request would have arrived by now
    assert client.unmatched_replies == 0
    assert admin.ready(queue) == 0


@serving
def test_bridge_killed_mid_stream_and_restarted_loses_no_request(start_bridge, client, direct, digits):
    first = start_bridge("--prefetch", "16")
    futures = [client.submit(digits[i % 10]) for i in range(200)]
    wait_answered(futures, 20)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    answered_before = sum(f.done() for f in futures)
    assert answered_before < 200, "killed too late to test anything"
    start_bridge("--prefetch", "16")
    wait_all(futures, 90)
    expected = [direct(png) for png in digits]
    for i, future in enumerate(futures):
        assert same_answer(future.result(), expected[i % 10]), i
    # Requests the killed bridge held unacked were redelivered to the new one.
    assert max(f.headers["attempt"] for f in futures) >= 2


@serving
def test_sigterm_finishes_requests_in_flight_and_exits_cleanly(start_bridge, client, digits, admin, queue):
    bridge = start_bridge("--prefetch", "8")
    futures = [client.submit(digits[i % 10]) for i in range(100)]
    wait_answered(futures, 10)
    bridge.send_signal(signal.SIGTERM)
    assert bridge.wait(30) == 0
    answered = sum(f.done() for f in futures)
    assert answered < 100, "stopped too late to test anything"
    assert admin.ready(queue) == 100 - answered  # in flight were answered and acked, the rest still queued
    start_bridge("--prefetch", "8")
    wait_all(futures, 60)
    time.sleep(0.3)
    assert client.unmatched_replies == 0  # nothing was answered twice


@serving
def test_request_failing_every_time_lands_in_dead_letter_queue(start_bridge, client, digits, admin, queue):
    closed_port = free_ports(1)[0]
    start_bridge("--max-attempts", "3", "--retry-delay", "0.05", inference_url=f"http://127.0.0.1:{closed_port}")
    future = client.submit(digits[7])
    answer = client.result(future, 30)
    assert answer["status"] == 503 and "gave up after 3 attempts" in answer["error"]
    assert future.headers["attempt"] == 3
    properties, body = admin.get(Topology(queue).dead_letter_queue)  # rejected right after the reply
    assert body == digits[7] and properties.correlation_id == future.correlation_id
    assert properties.headers["x-first-death-reason"] == "rejected"
    assert properties.headers["x-first-death-queue"] == queue
    assert admin.ready(queue) == 0


@serving
def test_request_that_kills_every_consumer_is_dead_lettered_by_the_broker(rabbitmq, admin, queue):
    topology = Topology(queue)
    topology.declare(admin.channel)
    admin.channel.basic_publish("", queue, b"poison", pika.BasicProperties(correlation_id="p1"))
    for delivery in range(topology.delivery_limit + 1):  # each consumer dies holding it, unacked
        channel = admin.connection.channel()
        deadline = time.monotonic() + 5
        while channel.basic_get(queue)[0] is None:  # returned to the queue asynchronously
            assert time.monotonic() < deadline, f"delivery {delivery}: message gone"
            time.sleep(0.01)
        channel.close()
    properties, body = admin.get(topology.dead_letter_queue)
    assert body == b"poison" and properties.headers["x-first-death-reason"] == "delivery_limit"


@serving
def test_purge_drops_waiting_requests_and_reports_the_count(client, digits, admin, queue, rabbitmq):
    for png in digits[:7]:
        client.submit(png)
    admin.wait_ready(queue, 7)
    out = subprocess.run([sys.executable, "-m", "queue_bridge", "--url", rabbitmq, "--queue", queue, "purge"],
                         cwd=REPO, check=False, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "7"
    assert admin.ready(queue) == 0


@serving
def test_client_times_out_cleanly_when_no_bridge_runs(client, digits, admin, queue):
    assert admin.consumers(queue) == 0
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="is a bridge running"):
        client(digits[0], timeout=1.0)
    assert 1.0 <= time.monotonic() - started < 3.0
    assert client.pending() == 0
    assert admin.ready(queue) == 1  # the request waits for a bridge; purge drops it


@serving
def test_rejected_token_is_reread_from_the_key_file(torchserve, digits, direct, tmp_path):
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"inference": {"key": "wrong"}}))
    backend = ModelBackend(torchserve.endpoints.inference, torchserve.model_name, TokenSource(key_file=key_file))
    refused = backend(digits[1])
    assert refused.answer is None and refused.retry.startswith("AuthError")
    key_file.write_text(torchserve.key_file.read_text())  # TorchServe restarted with new keys
    assert backend(digits[1]) == Outcome(answer=direct(digits[1]))
    backend.close()


@serving
def test_bridge_over_grpc_gives_the_rest_answer(start_bridge, client, direct, digits, torchserve):
    pytest.importorskip("grpc")
    start_bridge("--protocol", "grpc", inference_url=f"127.0.0.1:{torchserve.endpoints.grpc_inference_port}")
    assert same_answer(client(digits[4], timeout=60), direct(digits[4]))
    bad = b"this is not an image"
    assert client(bad, timeout=30) == direct(bad)
