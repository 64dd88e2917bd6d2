"""EmbeddingClient and ``python -m client`` against a real TorchServe: REST and gRPC agree, the token is
required on both, and each failure is a typed error with a one-line CLI message and its exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from serving.samples import user_digit_png

from client import AuthError, BadImageError, EmbeddingClient, ModelNotFoundError
from client.tokens import Token
from settings import REPO

pytestmark = pytest.mark.serving

NOT_AN_IMAGE = "not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, TIFF)"


@pytest.fixture(scope="module")
def digits(prepared_sample) -> list[bytes]:
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    return [user_digit_png(prepared_sample.test_images[i]) for i in picks]


def grpc_url(instance) -> str:
    return f"127.0.0.1:{instance.endpoints.grpc_inference_port}"


def url_for(instance, protocol: str) -> str:
    return grpc_url(instance) if protocol == "grpc" else instance.endpoints.inference


@pytest.fixture(scope="module")
def clients(torchserve):
    token = torchserve.keys()["inference"]
    with EmbeddingClient(torchserve.endpoints.inference, token=token) as rest, \
            EmbeddingClient(grpc_url(torchserve), protocol="grpc", token=token) as grpc_:
        yield rest, grpc_


def test_rest_and_grpc_give_identical_answers(clients, digits):
    rest, grpc_ = clients
    rest_answers = [rest.predict(png) for png in digits]
    grpc_answers = [grpc_.predict(png) for png in digits]
    assert rest_answers == grpc_answers
    assert sum(a["pred"] == str(d) for d, a in enumerate(rest_answers)) >= 8
    assert rest.ping() == grpc_.ping() == "Healthy"


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_concurrent_requests_answer_each_image(clients, digits, protocol):
    client = clients[0] if protocol == "rest" else clients[1]
    images = digits * 3
    results = dict(client.predict_many(images, concurrency=8))
    assert sorted(results) == list(range(len(images)))
    assert [results[i]["pred"] for i in range(10)] == [results[i + 20]["pred"] for i in range(10)]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
@pytest.mark.parametrize("token,reason", [(None, "missing"), ("wrong-token", "refused")])
def test_the_token_is_required(torchserve, digits, protocol, token, reason):
    client = EmbeddingClient(url_for(torchserve, protocol), protocol=protocol, token=token, retries=0)
    with pytest.raises(AuthError) as caught:
        client.predict(digits[0])
    assert caught.value.reason == reason and caught.value.exit_code == 3
    with pytest.raises(AuthError):
        client.ping()


def test_an_expired_key_file_token_is_named_expired(torchserve, digits):
    stale = Token("old-key", source="key_file.json", expires=datetime.now(timezone.utc) - timedelta(minutes=3))
    with pytest.raises(AuthError, match="expired at") as caught:
        EmbeddingClient(torchserve.endpoints.inference, token=stale).predict(digits[0])
    assert caught.value.reason == "expired"


def test_the_management_key_is_not_an_inference_key(torchserve, digits):
    with pytest.raises(AuthError, match="wrong or expired"):
        EmbeddingClient(torchserve.endpoints.inference, token=torchserve.keys()["management"]).predict(digits[0])


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
@pytest.mark.parametrize("model,version", [("nomodel", None), ("embedding", "9.9")])
def test_a_model_or_version_not_loaded(torchserve, digits, protocol, model, version):
    client = EmbeddingClient(url_for(torchserve, protocol), protocol=protocol, model=model, version=version,
                             token=torchserve.keys()["inference"])
    with pytest.raises(ModelNotFoundError) as caught:
        client.predict(digits[0])
    assert (caught.value.model, caught.value.version, caught.value.exit_code) == (model, version, 4)
    assert ("does not exist" if version else "Model not found") in str(caught.value)


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
@pytest.mark.parametrize("body,message", [
    (b"garbage", NOT_AN_IMAGE),
    (b"\x89PNG\r\n\x1a\n-truncated", None),
    (b"", None),
])
def test_a_refused_image_carries_the_handlers_message(clients, digits, protocol, body, message):
    client = clients[0] if protocol == "rest" else clients[1]
    with pytest.raises(BadImageError) as caught:
        client.predict(body)
    assert caught.value.status == 400 and caught.value.exit_code == 5
    if message:
        assert caught.value.message == message
    assert client.predict(digits[5])["pred"]  # the server keeps answering


def test_rest_and_grpc_refuse_an_image_with_the_same_message(clients):
    rest, grpc_ = clients
    messages = []
    for client in (rest, grpc_):
        with pytest.raises(BadImageError) as caught:
            client.predict(b"\x89PNG\r\n\x1a\n-truncated")
        messages.append(caught.value.message)
    assert messages[0] == messages[1]


def _without_server_records(case: str, tmp_path: Path) -> dict[str, str]:
    """For "no token": an empty state directory, so the client cannot find the test server's key file through its
    record (torchserve_api.instances), as for a server no command of the project started."""
    return {"XDG_STATE_HOME": str(tmp_path / "no-state")} if case == "no token" else {}


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "client", *args], capture_output=True, text=True, cwd=cwd,
                          env={**base, **(env or {})}, timeout=120)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory, digits) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for d in range(10):
        (folder / f"digit_{d}.png").write_bytes(digits[d])
    return folder


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_cli_predicts_a_folder_concurrently(torchserve, image_folder, tmp_path, protocol):
    args = ["predict", str(image_folder), "--url", url_for(torchserve, protocol), "--key-file",
            str(torchserve.key_file), "--concurrency", "4"]
    result = run_cli(*args, *(["--grpc"] if protocol == "grpc" else []), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [Path(line["image"]).name for line in lines] == [f"digit_{d}.png" for d in range(10)]
    assert sum(line["pred"] == str(d) for d, line in enumerate(lines)) >= 8


def test_cli_reports_a_refused_image_on_its_line_and_exits_5(torchserve, image_folder, tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"garbage")
    result = run_cli("predict", str(image_folder / "digit_3.png"), str(bad), "--url", torchserve.endpoints.inference,
                     "--key-file", str(torchserve.key_file), cwd=tmp_path)
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert result.returncode == 5 and first["neighbours"]
    assert second == {"image": str(bad), "error": NOT_AN_IMAGE, "status": 400, "kind": "BadImageError"}


def test_cli_reads_the_token_from_the_environment(torchserve, image_folder, tmp_path):
    result = run_cli("predict", str(image_folder / "digit_1.png"), "--url", torchserve.endpoints.inference,
                     cwd=tmp_path, env={"EMBEDDING_TOKEN": torchserve.keys()["inference"]})
    assert result.returncode == 0 and json.loads(result.stdout)["neighbours"], result.stderr


@pytest.mark.parametrize("case,code,message", [
    ("no token", 3, "no token sent"),
    ("wrong token", 3, "refused the token from --token: wrong or expired"),
    ("missing version", 4, "model 'embedding' version '9.9' is not loaded"),
    ("grpc missing version", 4, "model 'embedding' version '9.9' is not loaded"),
    ("nothing listening", 7, "connection refused"),
    ("missing image", 2, "no such file or folder"),
    ("missing key file", 2, "cannot read the key file"),
    ("management port", 2, "is TorchServe's management port, not TorchServe's inference port: use --url {inference} "
                           "(inference_address in {config})"),
    ("metrics port", 2, "is TorchServe's metrics port, not TorchServe's inference port: use --url {inference} "
                        "(inference_address in {config})"),
    ("grpc management port", 2, "is TorchServe's gRPC management port, not TorchServe's gRPC inference port: use "
                                "--url 127.0.0.1:{grpc} (grpc_inference_port in {config})"),
    ("grpc to the REST port", 2, "is an HTTP (REST) port, not TorchServe's gRPC inference port: use "
                                 "--url 127.0.0.1:{grpc} (grpc_inference_port in {config})"),
    ("status on the inference port", 2, "is TorchServe's inference port, not TorchServe's management port: use "
                                        "--url {management} (management_address in {config})"),
    ("status on the metrics port", 2, "is TorchServe's metrics port, not TorchServe's management port: use "
                                      "--url {management} (management_address in {config})"),
    ("register another version", 2, "holds version '1.0', not '2.0' (build it with ./archive.sh --model-version 2.0)"),
])
def test_cli_errors_are_one_line_with_their_exit_code(torchserve, model_store, image_folder, tmp_path, case, code,
                                                      message):
    image = str(image_folder / "digit_2.png")
    ends = torchserve.endpoints
    rest = ["--url", ends.inference]
    keys = ["--key-file", str(torchserve.key_file)]
    config = ["--config", str(torchserve.config)]
    grpc_mgmt = f"127.0.0.1:{ends.grpc_management_port}"
    args = {
        "no token": ["predict", image, *rest],
        "wrong token": ["predict", image, *rest, "--token", "not-the-key"],
        "missing version": ["predict", image, *rest, *keys, "--model-version", "9.9"],
        "grpc missing version": ["predict", image, "--grpc", "--url", grpc_url(torchserve), *keys, "--model-version",
                                 "9.9"],
        "nothing listening": ["predict", image, "--url", "http://127.0.0.1:9", "--retries", "1"],
        "missing image": ["predict", str(tmp_path / "nope.png"), *rest, *keys],
        "missing key file": ["predict", image, *rest, "--key-file", str(tmp_path / "nope.json")],
        "management port": ["predict", image, "--url", ends.management, *keys, *config],
        "metrics port": ["predict", image, "--url", ends.metrics, *keys, *config],
        "grpc management port": ["predict", image, "--grpc", "--url", grpc_mgmt, *keys, *config, "--retries", "0"],
        "grpc to the REST port": ["ping", "--grpc", *rest, *keys, *config, "--retries", "0"],
        "status on the inference port": ["status", *rest, *keys, *config],
        "status on the metrics port": ["status", "--url", ends.metrics, *keys, *config],
        "register another version": ["register", "--mar", str(model_store / "embedding.mar"), "--model-version", "2.0",
                                     "--url", ends.management, *keys],
    }[case]
    result = run_cli(*args, cwd=tmp_path, env=_without_server_records(case, tmp_path))
    assert result.returncode == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    expected = message.format(inference=ends.inference, management=ends.management, config=torchserve.config,
                              grpc=ends.grpc_inference_port)
    assert line.startswith("client: error: ") and expected in line


@pytest.fixture(scope="module")
def offline_embeddings(tiny_artifacts, digits) -> np.ndarray:
    from handler.service import EmbeddingService

    service = EmbeddingService.from_dir(tiny_artifacts)
    answers, _ = service.answer(digits, [True] * len(digits))
    return np.asarray([a["embedding"] for a in answers], dtype=np.float32)


@pytest.mark.parametrize("protocol", ["rest", "grpc", "v1", "v2"])
def test_every_protocol_returns_the_embedding_and_neighbour_ids(torchserve, digits, offline_embeddings, protocol):
    token = torchserve.keys()["inference"]
    with EmbeddingClient(url_for(torchserve, protocol), protocol=protocol, token=token) as client:
        with_option = [client.predict(png, embedding=True) for png in digits[:4]]
        without = client.predict(digits[0])
    np.testing.assert_allclose([a["embedding"] for a in with_option], offline_embeddings[:4], atol=1e-6)
    assert all({"id", "dataset_index"} <= set(n) for a in with_option for n in a["neighbours"])
    assert "embedding" not in without and set(without["neighbours"][0]) == {"label", "dist"}
    assert [{"label": n["label"], "dist": n["dist"]} for n in with_option[0]["neighbours"]] == without["neighbours"]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_cli_embed_writes_the_npy_and_the_file_order(torchserve, image_folder, tmp_path, offline_embeddings,
                                                     protocol):
    out = tmp_path / "embeddings.npy"
    extra = image_folder / "digit_3.png"
    result = run_cli("embed", str(image_folder), str(extra), "--out", str(out), "--url", url_for(torchserve, protocol),
                     "--key-file", str(torchserve.key_file), *(["--grpc"] if protocol == "grpc" else []), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    matrix = np.load(out, allow_pickle=False)
    assert matrix.dtype == np.float32 and matrix.shape == (11, 32)
    np.testing.assert_allclose(matrix, np.vstack([offline_embeddings, offline_embeddings[3:4]]), atol=1e-6)
    sidecar = json.loads((tmp_path / "embeddings.files.json").read_text())
    assert sidecar["files"] == [str(image_folder / f"digit_{d}.png") for d in range(10)] + [str(extra)]
    assert sidecar["dim"] == 32 and sidecar["model_version"] == "1.0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["embeddings.files.json", "embeddings.npy"]


def test_cli_embed_goes_on_past_a_refused_image_and_lists_it(torchserve, image_folder, tmp_path, offline_embeddings):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"garbage")
    out = tmp_path / "work" / "e.npy"
    result = run_cli("embed", str(bad), str(image_folder), "--out", str(out), "--url", torchserve.endpoints.inference,
                     "--key-file", str(torchserve.key_file), "--no-progress", cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    assert f"client: failed: {bad}: {NOT_AN_IMAGE} (HTTP 400)" in result.stderr.splitlines()
    np.testing.assert_allclose(np.load(out, allow_pickle=False), offline_embeddings, atol=1e-6)
    sidecar = json.loads((out.parent / "e.files.json").read_text())
    assert sidecar["files"] == [str(image_folder / f"digit_{d}.png") for d in range(10)]
    assert sidecar["failed"] == [{"image": str(bad), "error": NOT_AN_IMAGE, "status": 400, "kind": "BadImageError"}]


@pytest.mark.parametrize("case,code,message", [
    ("missing file", 2, "nope.png: no such file or folder"),
    ("no token", 3, "no token sent"),
])
def test_cli_embed_failure_is_one_line_and_writes_nothing(torchserve, image_folder, tmp_path, case, code, message):
    work = tmp_path / "work"
    work.mkdir()
    images = {"missing file": [str(tmp_path / "nope.png")], "no token": [str(image_folder)]}[case]
    keys = [] if case == "no token" else ["--key-file", str(torchserve.key_file)]
    result = run_cli("embed", *images, "--out", str(work / "e.npy"), "--url", torchserve.endpoints.inference, *keys,
                     "--no-progress", cwd=tmp_path, env=_without_server_records(case, tmp_path))
    assert result.returncode == code, (result.stdout, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("client: error: ") and message in line
    assert result.stdout == "" and list(work.iterdir()) == []
