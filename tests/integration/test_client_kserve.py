"""The client's KServe v1 / Open Inference v2 encodings against a spec-following server (kserve_standin)
that runs the real EmbeddingService on the tiny artifacts: same answers as the service itself."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from serving.samples import user_digit_png
from support.kserve_standin import KServeStandin

from client import BadImageError, EmbeddingClient, ModelNotFoundError, UsageError
from handler.service import EmbeddingService
from settings import REPO

NOT_AN_IMAGE = "not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, TIFF)"


@pytest.fixture(scope="module")
def digits(prepared_sample) -> list[bytes]:
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    return [user_digit_png(prepared_sample.test_images[i]) for i in picks]


@pytest.fixture(scope="module")
def service(tiny_artifacts) -> EmbeddingService:
    return EmbeddingService.from_dir(tiny_artifacts)


@pytest.fixture(scope="module")
def standin(service):
    server = KServeStandin(service, model="embedding", version="1.0")
    with server as url:
        yield url, server


@pytest.mark.parametrize("protocol", ["v1", "v2"])
def test_answers_equal_the_service_answers(standin, service, digits, protocol):
    url, _ = standin
    expected, _ = service.answer(digits)
    with EmbeddingClient(url, protocol=protocol) as client:
        assert client.predict(digits[7]) == expected[7]
        assert client.predict_batch(digits) == expected


@pytest.mark.parametrize("protocol", ["v1", "v2"])
def test_a_refused_image_is_reported_in_its_place(standin, digits, protocol):
    url, _ = standin
    with EmbeddingClient(url, protocol=protocol) as client:
        first, bad, last = client.predict_batch([digits[1], b"garbage", digits[2]])
        assert first["pred"] and last["pred"]
        assert isinstance(bad, BadImageError) and bad.message == NOT_AN_IMAGE and bad.status == 400
        with pytest.raises(BadImageError, match="not an image"):
            client.predict(b"garbage")


def test_v2_calls_a_version_by_its_path(standin, digits):
    url, server = standin
    with EmbeddingClient(url, protocol="v2", version="1.0") as client:
        assert client.predict(digits[3])["pred"]
        assert client.ping() == "ready"
    assert ("POST", "/v2/models/embedding/versions/1.0/infer") in server.requests
    with pytest.raises(ModelNotFoundError, match="version '9.9' is not loaded") as caught:
        EmbeddingClient(url, protocol="v2", version="9.9").predict(digits[3])
    assert caught.value.exit_code == 4


@pytest.mark.parametrize("protocol", ["v1", "v2"])
def test_unknown_model_is_not_found(standin, digits, protocol):
    url, _ = standin
    with pytest.raises(ModelNotFoundError, match="model 'other'"):
        EmbeddingClient(url, protocol=protocol, model="other").predict(digits[0])
    with pytest.raises(ModelNotFoundError):
        EmbeddingClient(url, protocol=protocol, model="other").ping()


def test_v1_has_no_versions(standin):
    url, _ = standin
    with pytest.raises(UsageError, match="KServe v1 has no model versions"):
        EmbeddingClient(url, protocol="v1", version="1.0")


def test_cli_speaks_v1_to_a_kserve_endpoint(standin, digits, tmp_path):
    url, _ = standin
    folder = tmp_path / "images"
    folder.mkdir()
    for i in (4, 9):
        (folder / f"digit_{i}.png").write_bytes(digits[i])
    (folder / "zz_broken.png").write_bytes(b"garbage")
    result = subprocess.run([sys.executable, "-m", "client", "predict", str(folder), "--protocol", "v1", "--url", url,
                             "--no-progress"], capture_output=True, text=True, cwd=tmp_path,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 5, result.stderr
    assert [line["image"].rsplit("/", 1)[1] for line in lines] == ["digit_4.png", "digit_9.png", "zz_broken.png"]
    assert lines[0]["neighbours"] and lines[2]["error"] == NOT_AN_IMAGE and lines[2]["status"] == 400
