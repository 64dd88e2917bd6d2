"""The serving image as the ServingRuntime runs it (command, arguments, environment, user and probes read from
deploy/kserve/servingruntime.yaml), with /mnt/models laid out by pipeline.kserve_deploy.stage_layout: the cluster's
own config.properties (runtime_properties) and the .mar.

- Metrics: after traffic, the container's metrics port (scraped from outside, without a key) carries every
  series, with every label, that the shipped alert and recording rules select: TorchServe's, the handler's
  Embedding* (model_metrics_auto_detect) and the gateway's request histogram, labelled with the model version.
- Handler precedence: a .mar built from a patched copy of handler/ is served by its own handler, not by the
  image's handler/ package (which is on the gateway's PYTHONPATH).
"""

from __future__ import annotations

import re
import secrets
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from support.containers import (Container, build_images, engine_or_reason, http_get, post, predictor_container,
                                wait_for_probe)
from serving.samples import user_digit_png

from pipeline.kserve_deploy import METRICS_PORT, inference_service, stage_layout
from serving import archive
from serving import prometheus as prom
from serving.gateway_metrics import REQUEST_SECONDS
from serving.server import free_ports

ENGINE, WHY_NOT = engine_or_reason()
pytestmark = [pytest.mark.containers, pytest.mark.skipif(ENGINE is None, reason=WHY_NOT)]

#: Appended to the copy's handler/search.py: every answer names the copy that produced it, as its nearest_label
#: (a field the answer's JSON carries, answered or not).
PATCH = '''

import dataclasses

_IMAGE_ANSWER = GallerySearcher.answer


def _answer_from_this_copy(self, *args, **kwargs):
    return dataclasses.replace(_IMAGE_ANSWER(self, *args, **kwargs), nearest_label="{marker}")


GallerySearcher.answer = _answer_from_this_copy
'''


@pytest.fixture(scope="module")
def images() -> dict:
    return build_images(ENGINE, only="serving")


def mnt_models(mar: Path, out: Path) -> Path:
    """/mnt/models as the storage initializer leaves it, readable by the image's uid."""
    stage_layout(mar, "embedding", "1.0", out)
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)
    return out


def run_predictor(images: dict, models_dir: Path, name: str) -> tuple[Container, str, str, str]:
    """The predictor container with its KServe port and its metrics port published; (container, url,
    metrics url, key) once the readiness probe passes."""
    key = secrets.token_hex(16)
    manifest = inference_service("embedding", "models", "s3://models/embedding/1.0", "v1", "embedding", "1.0")
    spec = predictor_container(manifest)  # the runtime's container merged with the InferenceService's, as KServe does
    env = {e["name"]: e["value"] if "value" in e else key for e in spec.get("env", [])}  # the Secret's key
    (port,) = [p["containerPort"] for p in spec["ports"]]
    http_port, metrics_port = free_ports(2)
    container = Container.run(images, images["serving"]["ref"], name, spec["command"] + spec["args"], env,
                              {models_dir: "/mnt/models"}, {http_port: port, metrics_port: METRICS_PORT},
                              user=spec.get("securityContext", {}).get("runAsUser"))
    try:
        wait_for_probe(f"http://127.0.0.1:{http_port}", spec["readinessProbe"], 180, container)
    except BaseException:
        container.remove()
        raise
    return container, f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{metrics_port}/metrics", key


@pytest.fixture(scope="module")
def pngs(prepared_sample) -> list[bytes]:
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    return [user_digit_png(prepared_sample.test_images[i]) for i in picks]


def predict(url: str, key: str, images: list[bytes]) -> tuple[int, dict]:
    import base64

    body = {"instances": [{"data": base64.b64encode(p).decode()} for p in images]}
    return post(f"{url}/v1/models/embedding:predict", body, key)


# ----------------------------------------------------------------------------------------------- metrics
def rule_selectors() -> dict[str, set[str]]:
    """{series: labels} the shipped rules select, recorded series and Prometheus's own `up` left out."""
    documents = prom.rule_documents()
    recorded = {rule["record"] for rules in documents.values() for rule in rules if "record" in rule}
    wanted: dict[str, set[str]] = {}
    for rules in documents.values():
        for rule in rules:
            for name, labels in prom.rule_selectors(rule["expr"]):
                if name not in recorded and name not in prom.PROMETHEUS_SERIES:
                    wanted.setdefault(name, set()).update(labels - prom.TARGET_LABELS)
    return wanted


SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+\S+(?:\s+\S+)?$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:\\.|[^"\\])*)"')


def scrape(metrics_url: str) -> tuple[dict[str, list[dict[str, str]]], dict[str, str]]:
    """({series name: label sets of its samples}, {declared family: type}) of the metrics page, no key sent.
    Read as Prometheus stores it (prometheus_client's parser renames counter samples to *_total)."""
    status, body = http_get(metrics_url, timeout=10)
    assert status == 200, body[:300]
    samples: dict[str, list[dict[str, str]]] = {}
    families: dict[str, str] = {}
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = kind.strip()
        elif line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, line
            samples.setdefault(match.group(1), []).append(dict(LABEL.findall(match.group(2) or "")))
    return samples, families


@pytest.fixture(scope="module")
def predictor(images, model_store, tmp_path_factory):
    models = mnt_models(model_store / "embedding.mar", tmp_path_factory.mktemp("mnt-models"))
    container, url, metrics_url, key = run_predictor(images, models, f"embedding-ops-{uuid.uuid4().hex[:6]}")
    try:
        yield container, url, metrics_url, key
    finally:
        container.remove()


def test_every_series_the_rules_use_is_on_the_pods_metrics_port(predictor, pngs):
    container, url, metrics_url, key = predictor
    wanted = rule_selectors()
    assert {"EmbeddingAnsweredImages", "ts_inference_requests_total", f"{REQUEST_SECONDS}_bucket"} <= set(wanted)
    for _ in range(3):
        status, body = predict(url, key, pngs)
        assert status == 200 and len(body["predictions"]) == len(pngs)
    assert predict(url, key, [b"not an image"])[0] == 400
    deadline = time.monotonic() + 60
    while True:  # the workers' metrics reach the frontend through their logs, a moment after the answers
        samples, families = scrape(metrics_url)
        missing = {name for name in wanted if name not in samples}
        # A labelled counter has no sample until its first event (no 5xx here); its family is declared.
        undeclared = {name for name in missing if families.get(name) != "counter"}
        if not undeclared and "EmbeddingAnsweredImages" in samples or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not undeclared, (sorted(undeclared), sorted(samples), container.logs()[-3000:])
    assert missing <= {"Requests5XX"}, sorted(missing)
    for name, labels in wanted.items():
        for sample_labels in samples.get(name, []):
            assert labels <= set(sample_labels), (name, labels, sample_labels)
    answered = [s for s in samples["EmbeddingAnsweredImages"] if s.get("ModelName") == "embedding"]
    assert answered and all(s["ModelVersion"] == "1.0" for s in answered), answered
    histogram = [s for s in samples[f"{REQUEST_SECONDS}_count"] if s["code"] == "200"]
    assert histogram == [{"model_name": "embedding", "model_version": "1.0", "code": "200"}], histogram
    refused = [s for s in samples[f"{REQUEST_SECONDS}_count"] if s["code"] == "400"]
    assert refused, samples[f"{REQUEST_SECONDS}_count"]


def test_the_histogram_counts_what_callers_sent(predictor, pngs):
    """Counts from the gateway's histogram match the requests of this test (deltas: the module shares it)."""
    _, url, metrics_url, key = predictor

    def count() -> float:
        status, body = http_get(metrics_url, timeout=10)
        total = 0.0
        for line in body.decode().splitlines():
            match = SAMPLE.match(line)
            if match and match.group(1) == f"{REQUEST_SECONDS}_count" and 'code="200"' in (match.group(2) or ""):
                total += float(line.rsplit(maxsplit=1)[1])
        return total

    before = count()
    for _ in range(5):
        assert predict(url, key, pngs[:2])[0] == 200
    assert http_get(url + "/v2/health/ready")[0] == 200  # probes are not inference: not counted
    assert count() - before == 5


# ------------------------------------------------------------------------------------- handler precedence
@pytest.fixture(scope="module")
def patched_mar(tiny_artifacts, tmp_path_factory) -> tuple[Path, str]:
    """A .mar whose handler/search.py differs from the image's: every answer's nearest_label is the marker."""
    marker = uuid.uuid4().hex
    work = tmp_path_factory.mktemp("patched-handler")
    copy = work / "handler"
    subprocess.run(["cp", "-r", str(archive.HANDLER_PACKAGE), str(copy)], check=True)
    search = copy / "search.py"
    search.write_text(search.read_text() + PATCH.replace("{marker}", marker))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(archive, "HANDLER_PACKAGE", copy)
        patch.setattr(archive, "HANDLER_ENTRY", copy / archive.HANDLER_ENTRY.name)
        mar = archive.build_mar(tiny_artifacts, work / "store")
    return mar, marker


def test_the_mars_own_handler_answers_not_the_images(images, patched_mar, pngs, tmp_path):
    mar, marker = patched_mar
    models = mnt_models(mar, tmp_path / "mnt-models")
    container, url, _, key = run_predictor(images, models, f"embedding-handler-{uuid.uuid4().hex[:6]}")
    try:
        status, body = predict(url, key, pngs[:3])
        assert status == 200, body
        assert [answer.get("nearest_label") for answer in body["predictions"]] == [marker] * 3, body
        image_copy = container.exec_python("import handler.search, inspect; "
                                           "print('_answer_from_this_copy' in inspect.getsource(handler.search))")
        assert image_copy.strip() == "False"  # the image's own handler/ is unchanged: the .mar's one answered
    finally:
        container.remove()
