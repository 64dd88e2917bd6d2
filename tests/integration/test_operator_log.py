"""What reaches TorchServe's standard output, the pod's log on KServe (#37): one line per refused request with its
reason and each worker's model load (or refusal to load) whatever the console level, the frontend's lifecycle lines (model loaded,
workers) at TS_FRONTEND_CONSOLE_LEVEL=info (the serving image's setting), and never the handler's per-batch lines
or request bytes. Read from a real TorchServe started with the shipped log4j2.xml."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from support.torchserve import running_instance

from serving.samples import write_samples

pytestmark = pytest.mark.serving

SECRET = b"\x89PNG\r\n\x1a\n" + b"do-not-log-me" * 8  # a corrupt PNG: refused, and its bytes must stay out of the log


def post(instance, body: bytes) -> int:
    request = urllib.request.Request(f"{instance.endpoints.inference}/predictions/embedding", data=body,
                                     method="POST", headers={"Content-Type": "application/octet-stream",
                                                             "Authorization": f"Bearer {instance.keys()['inference']}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            json.loads(response.read())
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


#: What each worker writes once it has loaded the model.
WORKER_LOADED = "MODEL_LOG - loaded embedding on cpu (torch: model.pt): gallery "  # model_store: the float model


def console(instance, needles: dict[str, int], timeout: float = 20.0) -> list[str]:
    """The lines of logs/torchserve.out once each of `needles` is in as many lines as asked (the frontend relays each
    worker's output asynchronously, in no fixed order)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = instance.log_file.read_text(errors="replace").splitlines()
        if all(sum(needle in line for line in lines) >= n for needle, n in needles.items()) \
                or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


@pytest.mark.parametrize("frontend_level", ["info", None], ids=["image", "local-default"])
def test_refusals_reach_standard_output_and_batches_do_not(model_store, tmp_path, monkeypatch, frontend_level):
    if frontend_level is None:
        monkeypatch.delenv("TS_FRONTEND_CONSOLE_LEVEL", raising=False)
    else:
        monkeypatch.setenv("TS_FRONTEND_CONSOLE_LEVEL", frontend_level)
    monkeypatch.delenv("TS_CONSOLE_LEVEL", raising=False)
    digit = write_samples(tmp_path / "samples")[7].read_bytes()
    with running_instance(tmp_path / "ts", model_store) as instance:
        assert post(instance, SECRET) == 400
        assert post(instance, digit) == post(instance, digit) == 200
        lines = console(instance, {"refused request ": 1, WORKER_LOADED: 2})
    refused = [line for line in lines if "refused request " in line]
    assert len(refused) == 1, lines[-20:]
    assert refused[0].rstrip().endswith(": 400 not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, TIFF)")
    text = "\n".join(lines)
    assert "do-not-log-me" not in text and "batch=" not in text
    workers = [line for line in lines if WORKER_LOADED in line]
    assert len(workers) == 2, lines[-20:]  # one per worker, whatever the level
    loaded = [line for line in lines if "Model embedding loaded" in line]
    assert bool(loaded) == (frontend_level == "info"), lines[-20:]
