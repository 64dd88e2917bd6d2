"""Open Inference gRPC (KServe grpc-v2) of the serving image, run as the ServingRuntime runs it for an
InferenceService with protocolVersion grpc-v2 (predictor ports: h2c 8081), called with KServe's own
InferenceGRPCClient from the oldest and newest supported kserve (requirements/clients/kserve-*.txt).

Health without a key, ModelMetadata declaring the typed outputs, ModelInfer with BYTES images and FP32 pixels
(raw_input_contents and typed contents) giving the REST v2 answers, and refusals as gRPC statuses: no key or a
wrong key UNAUTHENTICATED, a malformed or unusable tensor INVALID_ARGUMENT, an unknown model NOT_FOUND.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
from support.containers import (build_images, client_pythons, engine_or_reason, post, start_predictor,
                                wait_for_probe)
from support.imagegen import png_bytes
from support.istio_ingress import BAD_FORMAT, DENIED, kubeflow_grpc_ingress

from handler.v2_schema import V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT, V2_OUTPUTS
from pipeline.kserve_deploy import inference_service, stage_layout
from settings import KSERVE_GRPC_PORT, MODEL_NAME, MODEL_VERSION, REPO

ENGINE, WHY_NOT = engine_or_reason()
pytestmark = [pytest.mark.containers, pytest.mark.skipif(ENGINE is None, reason=WHY_NOT)]

PROBE = Path(__file__).resolve().parents[1] / "support" / "grpc_probe.py"
CLIENTS = sorted(p.stem for p in (REPO / "requirements" / "clients").glob("kserve-*.txt"))
TYPED = ("label", "distance", "confidence", "unknown", "neighbour_labels", "neighbour_distances")


@pytest.fixture(scope="module")
def pythons() -> dict[str, str]:
    return client_pythons(*CLIENTS)


@pytest.fixture(scope="module")
def predictor(model_store, tmp_path_factory):
    """The serving image as a grpc-v2 InferenceService runs it: (REST url, gRPC host:port, key)."""
    images = build_images(ENGINE, only="serving")
    out = tmp_path_factory.mktemp("mnt-models")
    stage_layout(model_store / "embedding.mar", MODEL_NAME, MODEL_VERSION, out)
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)  # the image runs as uid 10001
    manifest = inference_service("embedding", "models", out.as_uri(), "grpc-v2", MODEL_NAME, MODEL_VERSION)
    model = manifest["spec"]["predictor"]["model"]
    assert model["ports"] == [{"name": "h2c", "containerPort": KSERVE_GRPC_PORT, "protocol": "TCP"}]
    container, url, key, spec = start_predictor(images, (out, manifest), f"embedding-grpc-{uuid.uuid4().hex[:6]}")
    try:
        wait_for_probe(url, spec["readinessProbe"], 180, container)
        (grpc_port,) = [p["hostPort"] for p in spec["ports"] if p["name"] == "h2c"]
        yield url, f"127.0.0.1:{grpc_port}", key
    finally:
        container.remove()


@pytest.fixture(scope="module")
def digits(prepared_sample) -> list[np.ndarray]:
    return [prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == d)[0])] for d in range(10)]


@pytest.fixture(scope="module")
def rest_answer(predictor, digits) -> dict:
    """The REST v2 answer to the same digits as FP32 pixels (JSON): the reference every gRPC case must give."""
    url, _, key = predictor
    fp32 = (np.stack(digits).astype(np.float32) / 255.0).reshape(len(digits), 1, 28, 28)
    status, body = post(f"{url}/v2/models/{MODEL_NAME}/infer", {"inputs": [
        {"name": "pixels", "datatype": "FP32", "shape": list(fp32.shape), "data": fp32.ravel().tolist()}]}, key)
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    return {name: np.array(outputs[name]["data"], dtype=object).reshape(outputs[name]["shape"]).tolist()
            for name in TYPED}


@pytest.mark.parametrize("client", CLIENTS)
def test_kserve_grpc_client_gets_the_rest_answers_and_the_refusals(client, pythons, predictor, digits, rest_answer,
                                                                   tmp_path):
    _, address, key = predictor
    given = tmp_path / "digits.json"
    given.write_text(json.dumps({"pngs": [base64.b64encode(png_bytes(d)).decode() for d in digits],
                                 "pixels": [d.tolist() for d in digits]}))
    result = subprocess.run([pythons[client], "-I", str(PROBE), address, MODEL_NAME, key, str(given)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    print(f"{client}: version {report['version']}, checks {report['checks']}, refusals {report['refusals']}")
    assert report["version"].startswith(client.split("-")[1])
    assert report["checks"] == {"server live, no key": True, "server ready, no key": True, "model ready": True}

    declared = [[name, datatype, [-1, *shape]] for name, datatype, shape in
                (*V2_OUTPUTS, *V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT)]
    assert report["metadata"]["outputs"] == declared
    assert report["metadata"]["versions"] == [MODEL_VERSION]

    refusals = report["refusals"]
    assert refusals["no key"][0] == refusals["wrong key"][0] == refusals["model ready, no key"][0] == "UNAUTHENTICATED"
    assert "Bearer" in refusals["no key"][1]
    assert refusals["FP32 raw, 7 bytes"] == ["INVALID_ARGUMENT",
                                             "input 'pixels': 7 bytes is not a whole number of FP32 values"]
    assert refusals["FP32 of 5 pixels"][0] == "INVALID_ARGUMENT" and refusals["FP32 of 5 pixels"][1]
    assert refusals["unknown model"] == ["NOT_FOUND", "model no-such-model is not served here"]

    assert set(report["cases"]) == {"BYTES raw", "BYTES contents", "FP32 raw", "FP32 contents"}
    for case, got in report["cases"].items():
        for name in ("label", "unknown", "neighbour_labels"):
            assert got[name] == rest_answer[name], (case, name)
        for name in ("distance", "confidence", "neighbour_distances"):
            np.testing.assert_allclose(np.array(got[name], dtype=float), np.array(rest_answer[name], dtype=float),
                                       atol=1e-4, err_msg=f"{case}: {name}")


@pytest.mark.parametrize("client", CLIENTS)
def test_kserve_grpc_client_through_kubeflows_ingress(client, pythons, predictor, digits, rest_answer, tmp_path):
    """gRPC as docs/kserve.md tells a caller behind Kubeflow's ingress: a Kubeflow JWT as the bearer (checked by
    the ingress stand-in's RequestAuthentications), the key in x-api-key (checked by the pod). Each wrong call is
    refused where the docs say, as the gRPC status Envoy maps it to."""
    _, address, key = predictor
    given = tmp_path / "digits.json"
    given.write_text(json.dumps({"pngs": [base64.b64encode(png_bytes(d)).decode() for d in digits]}))
    with kubeflow_grpc_ingress(address) as (ingress, dex, _):
        token = dex.token("user@example.com", email="user@example.com", groups=["team"])
        result = subprocess.run([pythons[client], "-I", str(PROBE), ingress, MODEL_NAME, key, str(given), token],
                                capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ready"] is True
    assert report["labels"] == rest_answer["label"]
    refusals = report["refusals"]
    assert refusals["key as the bearer"] == ["UNAUTHENTICATED", BAD_FORMAT]  # Istio: not a JWT
    assert refusals["nothing"] == refusals["server ready, nothing"] == ["PERMISSION_DENIED", DENIED]  # Istio
    for case in ("token without the key", "token with a wrong key"):  # past Istio; the pod's own check
        assert refusals[case][0] == "UNAUTHENTICATED" and "API key" in refusals[case][1], (case, refusals[case])
