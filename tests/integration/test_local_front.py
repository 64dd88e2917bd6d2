"""The local TorchServe's front (serving.front): what curl sends is answered by the handler or refused with a
JSON 4xx, never TorchServe's form decoder's 500; everything else passes through unchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request

import numpy as np
import psutil
import pytest

from serving.server import private_instance, start, stop
from support.hostile import FORM, Assets, digit_png, form_decoder_fails, post, post_oversized
from support.torchserve import torchserve_processes

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def failing_png(prepared_sample) -> bytes:
    """A PNG of a held-out 7 that TorchServe's form decoder answers 500 when it is labelled a form."""
    seven = prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == 7)[0])]
    return digit_png(Assets(seven, seven), form_decoder_fails)


@pytest.fixture(scope="module")
def endpoint(torchserve) -> tuple[str, str]:
    return f"{torchserve.endpoints.inference}/predictions/{torchserve.model_name}", torchserve.keys()["inference"]


def curl(url: str, token: str, *args: str) -> tuple[int, dict]:
    assert shutil.which("curl"), "curl is needed: apt-get install curl"
    out = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {token}",
                          *args, url], capture_output=True, text=True, timeout=60, check=True).stdout
    body, _, status = out.rpartition("\n")
    return int(status), json.loads(body)


def test_curl_data_binary_of_an_image_is_answered(endpoint, failing_png, tmp_path):
    """`curl --data-binary @digit.png` labels the image a form; without the front TorchServe answered it 500."""
    url, token = endpoint
    image = tmp_path / "digit.png"
    image.write_bytes(failing_png)
    status, answer = curl(url, token, "--data-binary", f"@{image}")
    assert status == 200 and answer["pred"] == "7"
    assert answer == curl(url, token, "-T", str(image))[1]


def test_curl_d_of_an_image_is_refused_with_a_json_4xx(endpoint, failing_png, tmp_path):
    """`curl -d @digit.png` drops the file's CR and LF bytes: the bytes are no image any more, and the answer
    says so instead of a 500."""
    url, token = endpoint
    image = tmp_path / "digit.png"
    image.write_bytes(failing_png)
    status, answer = curl(url, token, "-d", f"@{image}")
    assert status == 400 and "not an image" in answer["error"]


def test_a_form_that_does_not_decode_is_refused_with_the_reason(endpoint):
    url, token = endpoint
    outcome = post(url, b"data=%zz", {"Content-Type": FORM}, token)
    assert outcome.status == 400 and outcome.body == {
        "error": "the URL-encoded body holds a % that is no %XX escape: send images as application/octet-stream "
                 "(curl -T image.png) or as -F data=@image.png", "status": 400}


@pytest.mark.parametrize("token", ["wrong", ""])
def test_the_key_is_checked_before_the_form(endpoint, token):
    """Without the inference key the caller learns nothing about the body: TorchServe's own refusal of the key."""
    url, _ = endpoint
    outcome = post(url, b"data=%zz", {"Content-Type": FORM}, token or None)
    assert outcome.status == 400 and "Token Authorization failed" in outcome.message


def test_an_oversized_body_is_refused_from_its_length_with_a_json_reason(endpoint):
    url, token = endpoint
    outcome = post_oversized(url, {"Content-Type": "application/octet-stream"}, token, 9 * 1024 * 1024)
    assert outcome.status == 413 and outcome.body == {"error": "request body larger than 8388608 bytes"}


def test_torchserve_headers_and_its_own_errors_pass_through(endpoint, torchserve):
    url, token = endpoint
    missing = post(url.replace(f"/{torchserve.model_name}", "/nosuchmodel"), b"x", {}, token)
    assert missing.status == 404 and missing.body["type"] == "ModelNotFoundException"
    request = urllib.request.Request(f"{torchserve.endpoints.inference}/ping",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as ping:
        assert json.loads(ping.read()) == {"status": "Healthy"} and ping.headers["X-Request-ID"]


def test_stop_stops_the_front_and_a_start_after_a_crash_frees_the_port(model_store, tmp_path):
    instance = private_instance(tmp_path / "ts")
    start(instance, model_store)
    front = psutil.Process(instance.front_pid())
    assert front in torchserve_processes(instance.workdir)
    frontend = psutil.Process(instance.pid())
    workers = frontend.children(recursive=True)
    frontend.kill()  # TorchServe dies; its front still holds the inference port
    frontend.wait(10)
    psutil.wait_procs(workers, timeout=20)
    start(instance, model_store)
    assert not front.is_running() and instance.front_pid() not in (None, front.pid)
    key = instance.keys()["inference"]
    url = f"{instance.endpoints.inference}/predictions/{instance.model_name}"
    assert post(url, b"data=%zz", {"Content-Type": FORM}, key).status == 400
    assert stop(instance) is True
    psutil.wait_procs(torchserve_processes(instance.workdir), timeout=20)
    assert torchserve_processes(instance.workdir) == [] and instance.front_pid() is None
