"""KServe's and Triton's own Python clients against the serving image, run as the ServingRuntime describes it.

Each client (oldest and newest supported kserve and tritonclient, requirements/clients/) lives in its own
virtual environment (scripts/client-venvs.sh) and runs tests/support/client_probe.py, which sends the same
ten digits every way that client can: KServe v1 base64 instances, v2 BYTES (raw and base64), FP32 as JSON
and binary, UINT8, with JSON, binary and mixed outputs. Every way must give the offline service's answers.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
from support.containers import build_images, client_pythons, engine_or_reason, start_predictor, wait_for_probe
from support.imagegen import png_bytes
from support.istio_ingress import BAD_FORMAT, DENIED, kubeflow_ingress

from handler.service import EmbeddingService
from pipeline.kserve_deploy import inference_service, stage_layout
from serving.gateway.auth import REST_REFUSAL
from settings import MODEL_NAME, MODEL_VERSION, REPO

ENGINE, WHY_NOT = engine_or_reason()
pytestmark = [pytest.mark.containers, pytest.mark.skipif(ENGINE is None, reason=WHY_NOT)]

PROBE = Path(__file__).resolve().parents[1] / "support" / "client_probe.py"
CLIENTS = sorted(p.stem for p in (REPO / "requirements" / "clients").glob("*.txt"))


@pytest.fixture(scope="module")
def pythons() -> dict[str, str]:
    return client_pythons()


@pytest.fixture(scope="module")
def predictor(model_store, tmp_path_factory):
    """The serving image with the storage initializer's layout at /mnt/models: (url, key)."""
    images = build_images(ENGINE, only="serving")
    out = tmp_path_factory.mktemp("mnt-models")
    stage_layout(model_store / "embedding.mar", MODEL_NAME, MODEL_VERSION, out)
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)  # the image runs as uid 10001
    manifest = inference_service("embedding", "models", out.as_uri(), "v2", MODEL_NAME, MODEL_VERSION)
    container, url, key, spec = start_predictor(images, (out, manifest), f"embedding-clients-{uuid.uuid4().hex[:6]}")
    try:
        wait_for_probe(url, spec["readinessProbe"], 180, container)
        yield url, key
    finally:
        container.remove()


@pytest.fixture(scope="module")
def digits(prepared_sample) -> list[np.ndarray]:
    return [prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == d)[0])] for d in range(10)]


@pytest.fixture(scope="module")
def expected(tiny_artifacts, digits) -> list[dict]:
    answers, _ = EmbeddingService.from_dir(tiny_artifacts).answer([png_bytes(d) for d in digits])
    return answers


def same_as_offline(case: str, got: dict | list, want: list[dict]) -> None:
    v1 = isinstance(got, dict) and "predictions" in got
    if v1:  # KServe v1
        got = {"label": [p["pred"] for p in got["predictions"]], "unknown": [p["unknown"] for p in got["predictions"]],
               "distance": [p["dist"] for p in got["predictions"]],
               "confidence": [p["confidence"] for p in got["predictions"]],
               "neighbour_labels": [[n["label"] for n in p["neighbours"]] for p in got["predictions"]],
               "neighbour_distances": [[n["dist"] for n in p["neighbours"]] for p in got["predictions"]]}
    # v2's BYTES label of an unknown answer is "" (handler.answer.COLUMNS); v1's JSON keeps null.
    assert got["label"] == [w["pred"] if v1 else w["pred"] or "" for w in want], case
    assert got["unknown"] == [w["unknown"] for w in want], case
    assert got["neighbour_labels"] == [[n["label"] for n in w["neighbours"]] for w in want], case
    np.testing.assert_allclose(got["distance"], [w["dist"] for w in want], atol=1e-4, err_msg=case)
    np.testing.assert_allclose(got["confidence"], [w["confidence"] for w in want], atol=1e-4, err_msg=case)
    np.testing.assert_allclose(got["neighbour_distances"], [[n["dist"] for n in w["neighbours"]] for w in want],
                               atol=1e-4, err_msg=case)


def probe(client: str, python: str, url: str, key: str, digits: list[np.ndarray], expected: list[dict], tmp_path: Path,
          gateway_token: str | None = None) -> None:
    """Run the client's probe against `url` and check every way it sent the digits against the offline answers."""
    given = tmp_path / "digits.json"
    given.write_text(json.dumps({"pngs": [base64.b64encode(png_bytes(d)).decode() for d in digits],
                                 "pixels": [d.tolist() for d in digits]}))
    kind = client.split("-")[0].replace("tritonclient", "triton")
    result = subprocess.run([python, "-I", str(PROBE), kind, url, MODEL_NAME, key, str(given),
                             *([gateway_token] if gateway_token else [])],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    print(f"{client}: version {report['version']}, checks {report['checks']}, cases {sorted(report['cases'])}")
    assert report["version"].startswith(client.split("-")[1])
    checks = report["checks"]
    assert all(v is True for k, v in checks.items() if k != "metadata outputs"), checks
    if "metadata outputs" in checks:
        assert {"label", "distance", "unknown", "neighbour_labels"} <= set(checks["metadata outputs"])
    assert len(report["cases"]) >= 4
    for case, got in report["cases"].items():
        same_as_offline(f"{client}: {case}", got, expected)


@pytest.mark.parametrize("client", CLIENTS)
def test_client_gets_the_offline_answers_every_way_it_sends(client, pythons, predictor, digits, expected, tmp_path):
    url, key = predictor
    probe(client, pythons[client], url, key, digits, expected, tmp_path)


# --- behind Kubeflow's Istio ingress (support.istio_ingress: its RequestAuthentications and require-jwt policy) ---


@pytest.fixture(scope="module")
def kubeflow(predictor):
    """(ingress URL, serving key, a user's dex JWT, a service account's JWT) in front of the same container."""
    url, key = predictor
    with kubeflow_ingress(url) as (ingress, dex, m2m):
        yield (ingress, key, dex.token("CgR1c2VyEgVsb2NhbA", email="user@example.com", groups=["team-a"]),
               m2m.token("system:serviceaccount:kubeflow-user:default-editor"))


def curl(url: str, *args: str) -> tuple[int, str]:
    out = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", *args, url], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    body, _, status = out.rpartition("\n")
    return int(status), body


def test_curl_through_kubeflows_ingress_as_docs_kserve_md_shows(kubeflow, digits, expected, tmp_path):
    """The Kubeflow token in Authorization (Istio verifies it), the serving key in X-API-Key (the pod checks it)."""
    ingress, key, user_token, sa_token = kubeflow
    image = tmp_path / "digit.png"
    image.write_bytes(png_bytes(digits[7]))
    predict = f"{ingress}/predictions/{MODEL_NAME}"
    for token in (user_token, sa_token):
        status, body = curl(predict, "-H", f"Authorization: Bearer {token}", "-H", f"X-API-Key: {key}",
                            "-T", str(image))
        assert status == 200 and json.loads(body)["pred"] == expected[7]["pred"]
    v1 = json.dumps({"instances": [{"data": base64.b64encode(png_bytes(digits[3])).decode()}]})
    status, body = curl(f"{ingress}/v1/models/{MODEL_NAME}:predict", "-H", f"Authorization: Bearer {user_token}",
                        "-H", f"X-API-Key: {key}", "-H", "Content-Type: application/json", "-d", v1)
    assert status == 200 and json.loads(body)["predictions"][0]["pred"] == expected[3]["pred"]


def test_each_wrong_call_through_kubeflows_ingress_is_refused_where_the_docs_say(kubeflow, digits, tmp_path):
    ingress, key, user_token, _ = kubeflow
    image = tmp_path / "digit.png"
    image.write_bytes(png_bytes(digits[7]))
    predict = f"{ingress}/predictions/{MODEL_NAME}"
    # The key as the bearer value, as without a gateway: Istio refuses it as a JWT.
    assert curl(predict, "-H", f"Authorization: Bearer {key}", "-T", str(image)) == (401, BAD_FORMAT)
    # A Kubeflow token alone: through Istio, then refused by the pod, which names its header.
    status, body = curl(predict, "-H", f"Authorization: Bearer {user_token}", "-T", str(image))
    assert status == 401 and json.loads(body)["error"] == REST_REFUSAL
    status, body = curl(predict, "-H", f"Authorization: Bearer {user_token}", "-H", "X-API-Key: wrong",
                        "-T", str(image))
    assert status == 401 and json.loads(body)["error"] == REST_REFUSAL
    # No token at all: the require-jwt policy.
    assert curl(predict, "-H", f"X-API-Key: {key}", "-T", str(image)) == (403, DENIED)


@pytest.mark.parametrize("client", CLIENTS)
def test_client_through_kubeflows_ingress_gets_the_offline_answers(client, pythons, kubeflow, digits, expected,
                                                                   tmp_path):
    ingress, key, user_token, _ = kubeflow
    probe(client, pythons[client], ingress, key, digits, expected, tmp_path, gateway_token=user_token)
