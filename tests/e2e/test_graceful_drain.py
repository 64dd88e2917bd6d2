"""SIGTERM under load: the serving image, run as the ServingRuntime runs it for a grpc-v2 InferenceService (REST
8080 and h2c 8081 published), is stopped with `podman stop -t 30` (the kubelet's SIGTERM, then SIGKILL after
Kubernetes' default 30 s grace period) while 16 REST clients with keep-alive connections and 2 gRPC clients post
a digit without pause.

Every request sent before the signal is answered 200 (gRPC: OK); after it, readiness answers 503 while requests
are still served, keep-alive connections get Connection: close on their last answer, and the rest is refused
(503, UNAVAILABLE or connection refused); a client that is refused stops, as one that moved to another replica.
No request at all is reset or left without an answer, and the container exits 0 within the grace period.
"""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest
from support.containers import Container, build_images, engine_or_reason, start_predictor, wait_for_probe

from pipeline.kserve_deploy import inference_service, stage_layout
from serving.gateway.drain import SHUTDOWN_DELAY_S, TERMINATION_GRACE_S
from serving.samples import held_out_digits, user_digit_png
from settings import MODEL_NAME, MODEL_VERSION

ENGINE, WHY_NOT = engine_or_reason()
pytestmark = [pytest.mark.containers, pytest.mark.skipif(ENGINE is None, reason=WHY_NOT)]

HTTP_CLIENTS = 16
GRPC_CLIENTS = 2
#: Requests answered before the signal is sent, so the load is steady when it comes.
WARM_REQUESTS = 200
#: Outcomes a request sent after the signal may have: served, or refused in a way a client retries elsewhere.
REFUSED = {"503", "refused", "UNAVAILABLE"}


@dataclass
class Outcome:
    """One request: when it was sent (time.monotonic), what came back, whether its answer closed the connection."""

    sent: float
    result: str
    closes: bool = False


@dataclass
class Load:
    """The clients' records, and the moment the signal was sent (None before)."""

    http: list[list[Outcome]] = field(default_factory=lambda: [[] for _ in range(HTTP_CLIENTS)])
    grpc: list[list[Outcome]] = field(default_factory=lambda: [[] for _ in range(GRPC_CLIENTS)])
    ready: list[tuple[float, str]] = field(default_factory=list)
    signalled: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def answered(self) -> int:
        return sum(len(r) for r in self.http) + sum(len(r) for r in self.grpc)

    def after_signal(self, sent: float) -> bool:
        return self.signalled is not None and sent >= self.signalled


def http_client(load: Load, index: int, port: int, path: str, body: bytes, headers: dict[str, str]) -> None:
    """POST `body` on one keep-alive connection, reconnecting when an answer says Connection: close."""
    records, conn = load.http[index], None
    while not load.done.is_set():
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        sent = time.monotonic()
        closes = False
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            response.read()
            result, closes = str(response.status), response.will_close
        except ConnectionRefusedError:
            result, closes = "refused", True
        except (OSError, http.client.HTTPException) as exc:  # a reset, a closed connection, a timeout
            result, closes = type(exc).__name__, True
        if closes:
            conn.close()
            conn = None
        records.append(Outcome(sent, result, closes))
        if load.after_signal(sent) and result in REFUSED:
            break
    if conn is not None:
        conn.close()


def grpc_client(load: Load, index: int, target: str, key: str, png: bytes) -> None:
    """ModelInfer with one BYTES image, over one channel, until refused after the signal."""
    import grpc

    from serving.grpc_stubs import load as load_stubs

    pb, pb_grpc = load_stubs()
    request = pb.ModelInferRequest(model_name=MODEL_NAME, id=f"drain-{index}")
    request.inputs.add(name="image", datatype="BYTES", shape=[1]).contents.bytes_contents.append(png)
    records = load.grpc[index]
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while not load.done.is_set():
            sent = time.monotonic()
            try:
                stub.ModelInfer(request, metadata=[("authorization", f"Bearer {key}")], timeout=30)
                result = "OK"
            except grpc.RpcError as exc:
                result = exc.code().name
            records.append(Outcome(sent, result))
            if load.after_signal(sent) and result in REFUSED:
                break


def readiness_watch(load: Load, port: int) -> None:
    """Poll the readiness probe's path from the signal on, as the kubelet keeps doing on a terminating pod."""
    while not load.done.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/v2/health/ready")
            result = str(conn.getresponse().status)
        except ConnectionRefusedError:
            result = "refused"
        except (OSError, http.client.HTTPException) as exc:
            result = type(exc).__name__
        finally:
            conn.close()
        load.ready.append((time.monotonic(), result))
        time.sleep(0.2)


@pytest.fixture(scope="module")
def images() -> dict:
    return build_images(ENGINE, only="serving")


@pytest.fixture(scope="module")
def mnt_models(model_store, tmp_path_factory):
    """/mnt/models as the storage initializer leaves it, and a grpc-v2 InferenceService (REST and h2c ports)."""
    out = tmp_path_factory.mktemp("mnt-models")
    stage_layout(model_store / "embedding.mar", MODEL_NAME, MODEL_VERSION, out)
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)  # the image runs as uid 10001
    return out, inference_service("embedding", "models", out.as_uri(), "grpc-v2", MODEL_NAME, MODEL_VERSION)


def summary(records: list[list[Outcome]], load: Load) -> tuple[Counter, Counter]:
    """(results of requests sent before the signal, results of those sent after it)."""
    before, after = Counter(), Counter()
    for outcome in (o for client in records for o in client):
        (after if load.after_signal(outcome.sent) else before)[outcome.result] += 1
    return before, after


def test_sigterm_under_load_answers_every_accepted_request_and_exits_0(images, mnt_models):
    container, url, key, spec = start_predictor(images, mnt_models, f"embedding-drain-{uuid.uuid4().hex[:6]}")
    threads: list[threading.Thread] = []
    load = Load()
    try:
        wait_for_probe(url, spec["readinessProbe"], 180, container)
        (grpc_port,) = [p["hostPort"] for p in spec["ports"] if p["name"] == "h2c"]
        png = user_digit_png(held_out_digits()[7])
        body = json.dumps({"instances": [{"data": base64.b64encode(png).decode()}]}).encode()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        port = int(url.rsplit(":", 1)[1])
        threads = [threading.Thread(target=http_client, args=(load, i, port, f"/v1/models/{MODEL_NAME}:predict",
                                                              body, headers)) for i in range(HTTP_CLIENTS)]
        threads += [threading.Thread(target=grpc_client, args=(load, i, f"127.0.0.1:{grpc_port}", key, png))
                    for i in range(GRPC_CLIENTS)]
        for thread in threads:
            thread.start()
        warm_until = time.monotonic() + 60
        while load.answered() < WARM_REQUESTS and time.monotonic() < warm_until:
            time.sleep(0.05)
        assert all(t.is_alive() for t in threads), "a client stopped before the signal"
        watcher = threading.Thread(target=readiness_watch, args=(load, port))
        load.signalled = time.monotonic()
        watcher.start()
        threads.append(watcher)
        seconds = stop(container, TERMINATION_GRACE_S)
        status, code = container.state()
        logs = container.logs()
    finally:
        load.done.set()
        for thread in threads:
            thread.join(timeout=60)
        container.remove()

    http_before, http_after = summary(load.http, load)
    grpc_before, grpc_after = summary(load.grpc, load)
    readiness = Counter(result for _, result in load.ready)
    print(f"stop took {seconds:.1f} s, exit ({status}, {code})\n"
          f"REST sent before the signal: {dict(http_before)}; after it: {dict(http_after)}\n"
          f"gRPC sent before the signal: {dict(grpc_before)}; after it: {dict(grpc_after)}\n"
          f"readiness after the signal: {dict(readiness)}")
    print("\n".join(line for line in logs.splitlines() if "kserve_runtime " in line))
    assert (status, code) == ("exited", 0), logs[-3000:]
    assert seconds < TERMINATION_GRACE_S, f"took {seconds:.1f} s, beyond the {TERMINATION_GRACE_S:g} s grace"
    assert seconds >= SHUTDOWN_DELAY_S, f"stopped after {seconds:.1f} s, before the shutdown delay had passed"

    # Every request sent before the signal was answered.
    assert set(http_before) == {"200"} and http_before["200"] >= WARM_REQUESTS // 2, http_before
    assert set(grpc_before) == {"OK"}, grpc_before
    # After it: served during the delay, then refused; nothing reset, nothing unanswered.
    assert set(http_after) <= {"200"} | REFUSED, http_after
    assert set(grpc_after) <= {"OK"} | REFUSED, grpc_after
    assert http_after["200"] > 0 and grpc_after["OK"] > 0, "nothing was served after the signal"
    for client in (*load.http, *load.grpc):
        assert client[-1].result in REFUSED, f"a client was never refused: it ended with {client[-1].result}"
    # Keep-alive connections were told to close with their last answer.
    for client in load.http:
        served = [o for o in client if o.result == "200"]
        assert served[-1].closes, "the last answer on a keep-alive connection did not say Connection: close"
    # Readiness went 503 while requests were still served.
    first_not_ready = min((t for t, result in load.ready if result == "503"), default=None)
    assert first_not_ready is not None, f"readiness never answered 503: {readiness}"
    assert any(o.sent > first_not_ready and o.result == "200" for client in load.http for o in client), \
        "no request was served after readiness went 503"


def stop(container: Container, grace_s: float) -> float:
    """`podman stop -t GRACE` (SIGTERM, SIGKILL after the grace period); the seconds until it returned."""
    return container.stop(timeout_s=int(grace_s))
