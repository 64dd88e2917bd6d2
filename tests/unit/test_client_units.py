"""Client pieces that need no TorchServe: retries, timeouts and refusals against small local servers,
tokens, gRPC stub generation, and decoding of the answers TorchServe's KServe envelopes produce."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

import cli_common
from client import (
    AuthError,
    BadImageError,
    ClientError,
    ConnectionFailed,
    EmbeddingClient,
    ModelNotFoundError,
    RequestTimeout,
    ServerError,
    kserve_codec,
    protos,
    tokens,
)
from client.answers import as_answer
from client.rest import auth_error
from torchserve_api.errors import ClientUsageError
from torchserve_api.retry import RetryPolicy
from settings import REPO
from support.http import send_json

ANSWER = {"pred": "3", "dist": 0.1, "confidence": 1.0, "unknown": False, "neighbours": [{"label": "3", "dist": 0.1}]}


@contextmanager
def scripted_server(responses: list[tuple[int, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP server answering each request with the next (status, JSON body); records what it got."""
    seen: list[dict[str, Any]] = []
    script = iter(responses)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append({"path": self.path, "headers": dict(self.headers), "body": body, "at": time.monotonic()})
            status, answer = next(script)
            send_json(self, status, answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """Accepts connections and never answers (a hung server); yields its port and the accepted sockets."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(2)
        for conn in accepted:
            conn.close()
        listener.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rest_sends_raw_bytes_with_the_token_to_the_versioned_path():
    with scripted_server([(200, ANSWER)]) as (url, seen):
        with EmbeddingClient(url, token="secret", version="2.0") as client:
            assert client.predict(b"\x89PNG-bytes") == ANSWER
    (request,) = seen
    assert request["path"] == "/predictions/embedding/2.0"
    assert request["headers"]["Authorization"] == "Bearer secret"
    assert request["headers"]["Content-Type"] == "application/octet-stream"
    assert request["body"] == b"\x89PNG-bytes"


def test_503_is_retried_with_exponential_backoff_then_answered():
    busy = {"code": 503, "type": "ServiceUnavailableException", "message": "Model has no worker"}
    with scripted_server([(503, busy), (503, busy), (200, ANSWER)]) as (url, seen):
        with EmbeddingClient(url, token="t", retries=3, backoff=0.1) as client:
            assert client.predict(b"img") == ANSWER
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(seen)]
    assert len(seen) == 3
    assert gaps[0] < 0.1 <= gaps[1] < 1.0, gaps  # urllib3's schedule: the first retry at once, then 0.1 s


def test_503_retries_are_bounded():
    busy = {"code": 503, "type": "ServiceUnavailableException", "message": "Model has no worker"}
    with scripted_server([(503, busy)] * 5) as (url, seen):
        with pytest.raises(ServerError, match="unavailable") as caught:
            EmbeddingClient(url, token="t", retries=2, backoff=0.01).predict(b"img")
    assert caught.value.status == 503 and caught.value.exit_code == 8 and len(seen) == 3


@pytest.mark.parametrize("status,body,error", [
    (400, {"error": "not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, TIFF)", "status": 400}, BadImageError),
    (413, {"error": "image has 20000000 pixels, more than 16000000", "status": 413}, BadImageError),
    (400, {"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed."}, AuthError),
    (404, {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: x"}, ModelNotFoundError),
    (500, {"code": 500, "type": "InternalServerException", "message": "Worker died."}, ServerError),
])
def test_refusals_and_other_errors_are_typed_and_not_retried(status, body, error):
    with scripted_server([(status, body)] * 3) as (url, seen):
        with pytest.raises(error) as caught:
            EmbeddingClient(url, token="t", retries=2, backoff=0.01).predict(b"img")
    assert len(seen) == 1
    if error is BadImageError:
        assert caught.value.message == body["error"] and caught.value.status == body["status"]


def test_retry_policy_maps_onto_urllib3_and_grpc():
    retry = RetryPolicy(retries=3, backoff=0.2, max_delay=5.0).urllib3()
    assert (retry.total, retry.connect, retry.read, retry.status) == (3, 3, False, 3)
    assert retry.status_forcelist == (503,) and retry.allowed_methods is None  # POST /predictions retries too
    config = json.loads(RetryPolicy(retries=9, backoff=0.2).grpc_service_config("pkg.Svc"))
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": "pkg.Svc"}]
    assert method["retryPolicy"] == {"maxAttempts": 5, "initialBackoff": "0.200s", "maxBackoff": "5.000s",
                                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
    assert "retryPolicy" not in json.loads(RetryPolicy(retries=0).grpc_service_config("pkg.Svc"))["methodConfig"][0]


def test_connection_refused_through_the_client():
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="connection refused"):
        EmbeddingClient(f"http://127.0.0.1:{closed_port()}", token="t", retries=2, backoff=0.05).predict(b"img")
    assert time.monotonic() - started >= 0.05  # the second retry waited the backoff


@pytest.mark.parametrize("failures,retries,answered", [(2, 3, True), (3, 2, False)])
def test_grpc_unavailable_is_retried_by_the_channel_and_bounded(failures, retries, answered):
    """A real gRPC server answers UNAVAILABLE `failures` times; the channel's retry policy does the rest."""
    from concurrent import futures

    import grpc

    from client import protos

    stubs = protos.load()
    calls: list[float] = []

    class Servicer(stubs.inference_pb2_grpc.InferenceAPIsServiceServicer):
        def Predictions(self, request, context):  # noqa: N802 (the proto's name)
            calls.append(time.monotonic())
            if len(calls) <= failures:
                context.abort(grpc.StatusCode.UNAVAILABLE, "no worker yet")
            return stubs.inference_pb2.PredictionResponse(prediction=json.dumps(ANSWER).encode())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    stubs.inference_pb2_grpc.add_InferenceAPIsServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        client = EmbeddingClient(f"127.0.0.1:{port}", protocol="grpc", token="t", retries=retries, backoff=0.05)
        if answered:
            assert client.predict(b"img") == ANSWER
        else:
            with pytest.raises(ServerError, match="unavailable: no worker yet"):
                client.predict(b"img")
        client.close()
    finally:
        server.stop(None)
    assert len(calls) == min(failures + 1, retries + 1)


@pytest.mark.parametrize("protocol", ["rest", "grpc", "v2"])
def test_a_hung_server_times_out_without_retries(protocol):
    with silent_server() as (port, accepted):
        started = time.monotonic()
        with pytest.raises(RequestTimeout, match="within 0.5s") as caught:
            EmbeddingClient(f"127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}",
                            protocol=protocol, token="t", timeout=0.5, retries=3, backoff=0.01).predict(b"img")
        elapsed = time.monotonic() - started
        assert caught.value.exit_code == 6
        assert 0.5 <= elapsed < 2.0 and len(accepted) == 1


def test_cli_reports_a_timeout_in_one_line(tmp_path):
    (tmp_path / "digit.png").write_bytes(b"\x89PNG any bytes")
    with silent_server() as (port, _):
        result = subprocess.run([sys.executable, "-m", "client", "predict", "digit.png", "--url",
                                 f"http://127.0.0.1:{port}", "--token", "t", "--timeout", "0.5"],
                                capture_output=True, text=True, cwd=tmp_path, timeout=60,
                                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert result.returncode == 6 and result.stdout == ""
    assert result.stderr.splitlines() == [f"client: error: no answer from 127.0.0.1:{port} within 0.5s"]


def test_key_file_token_carries_its_expiry(tmp_path):
    past = datetime.now(timezone.utc) - timedelta(minutes=5)
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({
        "management": {"key": "mgmt", "expiration time": "2099-01-01T00:00:00.123456789Z"},
        "inference": {"key": "inf", "expiration time": past.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"},
        "API": {"key": "api"}}))
    inference = tokens.resolve("inference", key_file=key_file, env={})
    management = tokens.resolve("management", key_file=key_file, env={})
    assert (inference.value, management.value) == ("inf", "mgmt")
    assert inference.expired() and not management.expired()
    assert tokens.resolve("inference", key_file=key_file, env={"EMBEDDING_TOKEN": "from-env"}).value == "from-env"
    assert tokens.resolve("inference", token="flag", key_file=key_file, env={"EMBEDDING_TOKEN": "e"}).value == "flag"


def test_auth_errors_say_missing_expired_or_refused():
    past = datetime.now(timezone.utc) - timedelta(minutes=1)
    assert auth_error(tokens.Token(None), "host:1").reason == "missing"
    assert "no token sent" in str(auth_error(tokens.Token(None), "host:1"))
    expired = auth_error(tokens.Token("k", "key_file.json", past), "host:1")
    assert expired.reason == "expired" and "expired at" in str(expired)
    refused = auth_error(tokens.Token("k", "--token"), "host:1")
    assert refused.reason == "refused" and "wrong or expired" in str(refused)


def test_an_unreadable_key_file_is_a_usage_error(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ClientError, match="not a TorchServe key file") as caught:
        tokens.resolve("inference", key_file=tmp_path / "bad.json", env={})
    assert caught.value.exit_code == 2
    assert isinstance(caught.value, cli_common.UsageError)  # the one usage error every command line catches


def test_the_client_s_usage_error_is_the_cli_one_and_a_server_error_is_an_answer():
    assert issubclass(ClientUsageError, ClientError) and issubclass(ClientUsageError, cli_common.UsageError)
    assert ClientUsageError.exit_code == cli_common.UsageError.exit_code == cli_common.EXIT_USAGE
    assert not issubclass(ServerError, cli_common.UsageError) and ServerError.exit_code == 8


def test_stub_generation_is_atomic_safe_to_race_and_replaces_stale_stubs(tmp_path):
    target = tmp_path / "_grpc"
    target.mkdir()
    (target / protos.VERSIONS_FILE).write_text('{"torchserve": "0.0.1", "grpcio-tools": "0.0.1"}')
    assert not protos.current(target)
    errors: list[BaseException] = []

    def generate() -> None:
        try:
            protos.generate(target)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=generate) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(p.name for p in target.iterdir()) == [
        "__init__.py", "inference_pb2.py", "inference_pb2_grpc.py", "management_pb2.py", "management_pb2_grpc.py",
        protos.VERSIONS_FILE]
    assert [p.name for p in tmp_path.iterdir()] == ["_grpc"]  # no partial directories left behind
    assert protos.current(target)
    assert f"from {protos.PACKAGE} import inference_pb2" in (target / "inference_pb2_grpc.py").read_text()


def test_stub_install_survives_a_third_process_moving_the_stubs_aside_mid_race(tmp_path, monkeypatch):
    """The interleaving CI once hit with three generators: this one's rename fails because another's stubs are
    there, and before it looks, a third has moved them aside to put its own in. It must try again, not fail."""
    import grpc_codegen

    target = tmp_path / "_grpc"
    target.mkdir()
    (target / "other.py").write_text("")
    built = tmp_path / "built"
    built.mkdir()
    (built / "mine.py").write_text("")
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 1:
            try:
                real_rename(src, dst)
            finally:
                real_rename(target, tmp_path / "aside")  # the third process, between the failure and the check
        real_rename(src, dst)

    monkeypatch.setattr(grpc_codegen.os, "rename", rename)
    grpc_codegen._install(built, target)
    assert calls == [("built", "_grpc"), ("built", "_grpc")]
    assert [p.name for p in target.iterdir()] == ["mine.py"]


def test_stubs_come_from_set_up_and_missing_ones_say_how_to_generate_them(tmp_path):
    stubs = protos.load()  # ./scripts/bootstrap.sh generated them (test.sh runs it first)
    assert stubs.directory == protos.STUB_DIR and protos.current()
    assert stubs.inference_pb2.PredictionsRequest(model_name="m", input={"data": b"x"}).input["data"] == b"x"
    code = "from client import protos; protos.STUB_DIR = __import__('pathlib').Path(%r); protos.load()"
    missing = subprocess.run([sys.executable, "-c", code % str(tmp_path / "none")], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1].endswith(
        f"StubError: TorchServe's gRPC stubs in {tmp_path / 'none'} are missing: {protos.HOW}")


def test_answers_arrive_as_objects_or_json_text():
    assert as_answer(ANSWER) == ANSWER
    assert as_answer(json.dumps(ANSWER)) == ANSWER
    assert as_answer(json.dumps(ANSWER).encode()) == ANSWER
    with pytest.raises(BadImageError, match="empty body") as caught:
        as_answer('{"error": "empty body: send an image", "status": 400}')
    assert caught.value.status == 400
    with pytest.raises(ClientError, match="no pred"):
        as_answer({"label": "3"})


def test_decodes_torchserve_kserve_envelope_answers():
    """Bodies as TorchServe 0.12 returns them with service_envelope=kserve / kservev2 (answers as JSON text)."""
    error = {"error": "not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, TIFF)", "status": 400}
    v1 = {"predictions": [json.dumps(ANSWER), json.dumps(error)]}
    first, second = kserve_codec.decode_v1(v1, 2)
    assert first == ANSWER and isinstance(second, BadImageError) and second.message == error["error"]
    v2 = {"id": "abc", "model_name": "embedding", "model_version": "1.0", "outputs": [
        {"name": "image-1", "datatype": "BYTES", "data": [json.dumps(error)], "shape": [1]},
        {"name": "image-0", "datatype": "BYTES", "data": [json.dumps(ANSWER)], "shape": [1]}]}
    first, second = kserve_codec.decode_v2(v2, 2)  # matched by input name, not position
    assert first == ANSWER and isinstance(second, BadImageError)
    with pytest.raises(ClientError, match="1 answers for 2 images"):
        kserve_codec.decode_v2({"outputs": [{"name": "answer", "datatype": "BYTES", "data": [json.dumps(ANSWER)]}]}, 2)
    with pytest.raises(ClientError, match="not a BYTES tensor"):
        kserve_codec.decode_v2({"outputs": [{"name": "image-0", "datatype": "FP32", "data": [0.5]}]}, 1)


def test_kserve_v2_request_has_one_bytes_tensor_per_image():
    request = kserve_codec.encode_v2([b"\x01\x02", b"\x03"], request_id="r1")
    assert request == {"id": "r1", "inputs": [
        {"name": "image-0", "shape": [1], "datatype": "BYTES", "data": ["AQI="]},
        {"name": "image-1", "shape": [1], "datatype": "BYTES", "data": ["Aw=="]}],
        "parameters": {"output_format": "json"}}  # answers as the REST answer objects, not typed outputs
    assert kserve_codec.encode_v1([b"\x03"]) == {"instances": [{"data": "Aw=="}]}


def test_prometheus_text_is_summed_per_name_over_matching_label_sets():
    from client.metrics_text import sum_by_name

    text = """# HELP EmbeddingAnsweredImages Images answered
# TYPE EmbeddingAnsweredImages counter
EmbeddingAnsweredImages{ModelName="embedding",Level="Model",Hostname="a"} 3.0
EmbeddingAnsweredImages{ModelName="embedding",Level="Model",Hostname="b"} 4.0
EmbeddingAnsweredImages{ModelName="other",Level="Model",Hostname="a"} 100.0
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{model_name="embedding",model_version="default",hostname="a"} 9.0
# TYPE EmbeddingBaselineUnknownRate gauge
EmbeddingBaselineUnknownRate{ModelName="embedding",Label="with \\"quotes\\", and commas"} 0.05
"""
    assert sum_by_name(text, ModelName="embedding") == {"EmbeddingAnsweredImages": 7.0,
                                                       "EmbeddingBaselineUnknownRate": 0.05}
    assert sum_by_name(text)["EmbeddingAnsweredImages"] == 107.0
    assert sum_by_name(text)["ts_inference_requests"] == 9.0


def test_cli_with_an_unreadable_config_says_so_in_one_line(tmp_path):
    (tmp_path / "digit.png").write_bytes(b"\x89PNG any bytes")
    (tmp_path / "partial.properties").write_text("management_address=http://127.0.0.1:1\n")
    for config, reason in (("missing.properties", "cannot read (No such file or directory)"),
                           ("partial.properties", "config.properties has no inference_address")):
        result = subprocess.run([sys.executable, "-m", "client", "predict", "digit.png", "--config", config,
                                 "--token", "t"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
        assert result.returncode == 2 and result.stdout == "", result.stderr
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"client: error: {config}: {reason}"), line


def test_kserve_requests_carry_the_embedding_option_in_parameters():
    assert kserve_codec.encode_v1([b"\x03"], embedding=True) == {"instances": [{"data": "Aw=="}],
                                                          "parameters": {"embedding": True}}
    assert kserve_codec.encode_v2([b"\x03"], request_id="r", embedding=True)["parameters"] == {"embedding": True,
                                                                                         "output_format": "json"}
    assert kserve_codec.encode_v2([b"\x03"], request_id="r")["parameters"] == {"output_format": "json"}


def test_an_answer_without_the_requested_embedding_is_an_error():
    assert as_answer({**ANSWER, "embedding": [0.5]}, embedding=True)["embedding"] == [0.5]
    with pytest.raises(ClientError, match="without an embedding"):
        as_answer(ANSWER, embedding=True)


def test_embed_sidecar_sits_beside_the_npy():
    from client.outputs import sidecar_path

    assert sidecar_path(Path("/x/embeddings.npy")) == Path("/x/embeddings.files.json")
    assert sidecar_path(Path("out")) == Path("out.files.json")


def test_write_embeddings_leaves_nothing_behind_when_it_fails(tmp_path, monkeypatch):
    import numpy as np

    from client.outputs import write_embeddings

    out = tmp_path / "e.npy"
    write_embeddings(out, np.ones((2, 3), np.float32), {"files": ["a", "b"]})
    assert np.load(out, allow_pickle=False).tolist() == [[1.0] * 3] * 2
    assert json.loads((tmp_path / "e.files.json").read_text()) == {"files": ["a", "b"]}

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", broken)
    with pytest.raises(OSError):
        write_embeddings(tmp_path / "f.npy", np.ones((1, 1), np.float32), {"files": ["a"]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.files.json", "e.npy"]
