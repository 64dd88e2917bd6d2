"""End to end against a real TorchServe (Java frontend + Python workers) serving the tiny archive."""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import urllib.error
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from serving.samples import user_digit_png

from handler.preprocessing import preprocess
from handler.service import EmbeddingService

pytestmark = pytest.mark.serving


def call(url: str, data: bytes | None = None, token: str | None = None, headers: dict | None = None,
         method: str | None = None) -> tuple[int, dict]:
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body.strip().startswith(b"{") else {"raw": body.decode()}


def multipart(field: str, filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def predict_forms(png: bytes) -> dict[str, tuple[bytes, dict]]:
    form_body, form_type = multipart("data", "digit.png", png)
    return {
        "raw": (png, {"Content-Type": "application/octet-stream"}),
        "multipart": (form_body, {"Content-Type": form_type}),
        "json": (json.dumps({"data": base64.b64encode(png).decode()}).encode(), {"Content-Type": "application/json"}),
    }


@pytest.fixture(scope="module")
def endpoint(torchserve):
    return f"{torchserve.endpoints.inference}/predictions/{torchserve.model_name}", torchserve.keys()["inference"]


@pytest.fixture(scope="module")
def digits(prepared_sample):
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    return [user_digit_png(prepared_sample.test_images[i]) for i in picks]


def test_served_answers_equal_offline_answers_in_every_form(endpoint, digits, tiny_artifacts):
    url, token = endpoint
    service = EmbeddingService.from_dir(tiny_artifacts)
    offline = service.searcher.classify(service.embed(np.stack([preprocess(png) for png in digits])))
    for png, expected in zip(digits, offline):
        for form, (body, headers) in predict_forms(png).items():
            status, answer = call(url, body, token, headers)
            assert status == 200, (form, answer)
            assert answer["pred"] == expected["pred"], form
            assert [n["label"] for n in answer["neighbours"]] == [n["label"] for n in expected["neighbours"]]
            np.testing.assert_allclose([n["dist"] for n in answer["neighbours"]],
                                       [n["dist"] for n in expected["neighbours"]], atol=1e-5)


def test_served_model_classifies_held_out_digits(endpoint, digits):
    url, token = endpoint
    preds = [call(url, png, token, {"Content-Type": "application/octet-stream"})[1]["pred"] for png in digits]
    assert sum(p == str(d) for d, p in enumerate(preds)) >= 8


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_inference_requires_the_token(endpoint, digits, token):
    url, _ = endpoint
    status, body = call(url, digits[0], token, {"Content-Type": "application/octet-stream"})
    assert status == 400 and body["type"] == "InvalidKeyException"


def test_management_requires_its_own_token(torchserve):
    url = f"{torchserve.endpoints.management}/models"
    keys = torchserve.keys()
    assert call(url)[0] == 400
    assert call(url, token=keys["inference"])[0] == 400
    status, body = call(url, token=keys["management"])
    assert status == 200 and body["models"][0]["modelName"] == "embedding"


def test_model_api_is_off_by_default(torchserve):
    url = f"{torchserve.endpoints.management}/models?url=embedding.mar"
    assert call(url, b"", torchserve.keys()["management"], method="POST")[0] == 405


def test_key_file_is_private(torchserve):
    assert stat.S_IMODE(os.stat(torchserve.key_file).st_mode) == 0o600


@pytest.mark.parametrize("body,headers,status", [
    (b"", {"Content-Type": "application/octet-stream"}, 400),
    (b"\x89PNG\r\n\x1a\n-truncated", {"Content-Type": "application/octet-stream"}, 400),
    (b"just some text", {"Content-Type": "text/plain"}, 415),
    (b'{"image": "x"}', {"Content-Type": "application/json"}, 400),
    (b'{"data": "not base64!"}', {"Content-Type": "application/json"}, 400),
    (b"{not json", {"Content-Type": "application/json"}, 400),
])
def test_bad_input_gets_4xx_json_and_server_keeps_answering(endpoint, digits, body, headers, status):
    url, token = endpoint
    got, answer = call(url, body, token, headers)
    assert got == status and answer["error"], answer
    assert call(url, digits[5], token, {"Content-Type": "application/octet-stream"})[0] == 200


def test_concurrent_requests_with_one_bad_item(endpoint, digits):
    url, token = endpoint
    bodies = [*digits, b"garbage", *digits]

    def send(body):
        return call(url, body, token, {"Content-Type": "application/octet-stream"})

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        results = list(pool.map(send, bodies))
    statuses = [s for s, _ in results]
    assert statuses[10] == 400
    assert statuses[:10] == [200] * 10 and statuses[11:] == [200] * 10
    assert [a["pred"] for _, a in results[:10]] == [a["pred"] for _, a in results[11:]]


def test_request_over_size_limit_is_refused_before_the_body_is_read(endpoint):
    """The frontend answers 413 from the Content-Length header alone (max_request_size = 8 MiB)."""
    url, token = endpoint
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall((f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
                      f"Content-Type: application/octet-stream\r\nContent-Length: {9 * 1024 * 1024}\r\n\r\n").encode())
        sock.sendall(b"\0" * 65536)
        status_line = sock.makefile("rb").readline().decode()
    assert status_line.split()[1] == "413", status_line


@pytest.fixture(scope="module")
def offline_with_embedding(tiny_artifacts, digits):
    service = EmbeddingService.from_dir(tiny_artifacts)
    return service.answer(digits[:3], [True] * 3)[0]


def test_embedding_option_as_a_json_field_and_a_form_field(endpoint, digits, offline_with_embedding):
    url, token = endpoint
    for png, expected in zip(digits[:3], offline_with_embedding):
        form_body, form_type = multipart("data", "digit.png", png)
        boundary = form_type.split("boundary=")[1]
        form_body = form_body.replace(f"--{boundary}--".encode(), (
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"embedding\"\r\n\r\ntrue\r\n"
            f"--{boundary}--").encode())
        forms = {
            "json": (json.dumps({"data": base64.b64encode(png).decode(), "embedding": True}).encode(),
                     {"Content-Type": "application/json"}),
            "form": (form_body, {"Content-Type": form_type}),
        }
        for form, (body, headers) in forms.items():
            status, answer = call(url, body, token, headers)
            assert status == 200, (form, answer)
            np.testing.assert_allclose(answer["embedding"], expected["embedding"], atol=1e-6)
            assert [(n["id"], n["dataset_index"], n["label"]) for n in answer["neighbours"]] == \
                [(n["id"], n["dataset_index"], n["label"]) for n in expected["neighbours"]], form


def test_torchserve_drops_query_parameters_so_the_option_is_not_a_query_parameter(endpoint, digits):
    """Checked against TorchServe 0.12: the handler never sees ?embedding=true, so the answer is the plain one
    (docs/serving.md says to use the JSON or form field)."""
    url, token = endpoint
    status, answer = call(f"{url}?embedding=true", digits[1], token, {"Content-Type": "application/octet-stream"})
    assert status == 200 and "embedding" not in answer and set(answer["neighbours"][0]) == {"label", "dist"}


@pytest.mark.parametrize("value", ['"maybe"', "2", "null"])
def test_invalid_option_value_is_a_400_with_a_json_message(endpoint, digits, value):
    url, token = endpoint
    body = f'{{"data": "{base64.b64encode(digits[2]).decode()}", "embedding": {value}}}'.encode()
    status, answer = call(url, body, token, {"Content-Type": "application/json"})
    assert status == 400 and answer["status"] == 400 and '"embedding"' in answer["error"]


def test_embedding_option_on_the_v2_route(torchserve, digits, offline_with_embedding):
    """Typed outputs carry the embedding and the neighbours' ids; output_format json keeps the answer object."""
    url = f"{torchserve.endpoints.inference}/v2/models/{torchserve.model_name}/infer"
    want = offline_with_embedding[0]
    for output_format in ("typed", "json"):
        parameters = {"embedding": True, **({"output_format": "json"} if output_format == "json" else {})}
        body = {"inputs": [{"name": "image-0", "shape": [1], "datatype": "BYTES",
                            "data": [base64.b64encode(digits[0]).decode()]}], "parameters": parameters}
        status, answer = call(url, json.dumps(body).encode(), torchserve.keys()["inference"],
                              {"Content-Type": "application/json"})
        assert status == 200, answer
        if output_format == "json":
            got = json.loads(answer["outputs"][0]["data"][0])
            embedding, ids = got["embedding"], [n["id"] for n in got["neighbours"]]
        else:
            outputs = {o["name"]: o for o in answer["outputs"]}
            assert outputs["embedding"]["datatype"] == "FP32"
            assert outputs["embedding"]["shape"] == [1, len(want["embedding"])]
            embedding, ids = outputs["embedding"]["data"], outputs["neighbour_ids"]["data"]
        np.testing.assert_allclose(embedding, want["embedding"], atol=1e-6)
        assert ids == [n["id"] for n in want["neighbours"]]
