"""The handler's custom metrics on TorchServe's Prometheus endpoint, after known traffic.

Counters are compared as deltas (the session's TorchServe also serves other tests); gauges hold the
last batch's figures, so the traffic ends with one lone, well-formed request.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from typing import Callable

import numpy as np
import pytest
from support.imagegen import png_bytes
from serving.samples import user_digit_png

from client import BadImageError, EmbeddingClient
from handler.ts_metrics import METRIC_NAMES

pytestmark = pytest.mark.serving

SAMPLE = re.compile(r'^(\w+)\{([^}]*)\}\s+(\S+)$')
BAD_BODIES = [b"garbage", b"\x89PNG\r\n\x1a\n-truncated", b""]


def scrape(instance) -> dict[str, float]:
    """Embedding* samples of model 'embedding', without any token."""
    with urllib.request.urlopen(f"{instance.endpoints.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1).startswith("Embedding") and 'ModelName="embedding"' in match.group(2):
            values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(3))
    return values


def settled(instance, done: Callable[[dict[str, float]], bool] | None = None,
            timeout: float = 15.0) -> dict[str, float]:
    """Metrics reach the frontend through the workers' logs a moment after the answers: wait until ``done``
    holds (or, without it, until two scrapes agree); the caller asserts on what came last."""
    deadline = time.monotonic() + timeout
    last = scrape(instance)
    while time.monotonic() < deadline:
        if done is not None and done(last):
            return last
        time.sleep(0.3)
        now = scrape(instance)
        if done is None and now == last:
            return now
        last = now
    return last


@pytest.fixture(scope="module")
def images(prepared_sample) -> tuple[list[bytes], list[bytes]]:
    """Ten digits, and non-digit shapes (some land beyond the open-set threshold)."""
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    digits = [user_digit_png(prepared_sample.test_images[i]) for i in picks]
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:64, :64]
    shapes = [
        png_bytes((np.indices((64, 64)).sum(0) // 8 % 2 * 255).astype(np.uint8)),  # checkerboard
        png_bytes(np.pad(np.full((20, 20), 255, np.uint8), 22)),                   # filled square
        png_bytes((rng.random((64, 64)) * 255).astype(np.uint8)),                   # noise
        png_bytes((((np.hypot(yy - 32, xx - 32) < 25) & (np.hypot(yy - 32, xx - 32) > 15)) * 255).astype(np.uint8)),
    ]
    return digits, shapes


def test_prometheus_endpoint_needs_no_token_unlike_inference(torchserve):
    with urllib.request.urlopen(f"{torchserve.endpoints.metrics}/metrics", timeout=10) as response:
        assert response.status == 200 and b"# TYPE" in response.read()
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{torchserve.endpoints.inference}/ping", timeout=10)
    assert caught.value.code == 400


def test_custom_metrics_count_and_time_the_traffic(torchserve, images):
    digits, shapes = images
    with EmbeddingClient(torchserve.endpoints.inference, token=torchserve.keys()["inference"]) as client:
        client.predict(digits[0])  # the first answer registers every metric (model_metrics_auto_detect)
        before = settled(torchserve)
        for body in BAD_BODIES:
            with pytest.raises(BadImageError):
                client.predict(body)
        answers = [client.predict(image) for image in digits + shapes]
        last = client.predict(digits[6])  # alone in its batch: the gauges end on it
    unknown = sum(a["unknown"] for a in answers) + last["unknown"]

    def delta(values: dict[str, float], name: str) -> float:
        return values.get(name, 0.0) - before.get(name, 0.0)

    after = settled(torchserve, lambda v: delta(v, "EmbeddingRejectedInputs") >= len(BAD_BODIES)
                    and delta(v, "EmbeddingUnknownAnswers") >= unknown
                    and v.get("EmbeddingTop1Distance") == pytest.approx(last["dist"], abs=1e-5))

    assert set(METRIC_NAMES) <= set(after), sorted(after)
    assert delta(after, "EmbeddingRejectedInputs") == len(BAD_BODIES)
    assert delta(after, "EmbeddingUnknownAnswers") == unknown
    assert unknown >= 1, [a["dist"] for a in answers]
    assert after["EmbeddingBatchSize"] == 1
    assert after["EmbeddingTop1Distance"] == pytest.approx(last["dist"], abs=1e-5)
    for name in ("EmbeddingPreprocessMs", "EmbeddingInferenceMs", "EmbeddingSearchMs"):
        assert 0 < after[name] < 2000, (name, after[name])


def test_handler_metrics_carry_the_model_version(torchserve, images):
    """Every Embedding* sample of the model names the .mar's version (ModelVersion), as the rules can select."""
    digits, _ = images
    with EmbeddingClient(torchserve.endpoints.inference, token=torchserve.keys()["inference"]) as client:
        version = client.predict(digits[1])["model_version"]
    settled(torchserve, lambda v: "EmbeddingAnsweredImages" in v)
    with urllib.request.urlopen(f"{torchserve.endpoints.metrics}/metrics", timeout=10) as response:
        lines = [line for line in response.read().decode().splitlines()
                 if line.startswith("Embedding") and 'ModelName="embedding"' in line]
    assert {line.split("{")[0] for line in lines} >= set(METRIC_NAMES)
    assert all(f'ModelVersion="{version}"' in line for line in lines), lines
