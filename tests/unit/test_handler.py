"""The TorchServe handler against TorchServe's own Context class (no server process)."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
from support.imagegen import form_row, json_row, raw_row
from serving.samples import user_digit_png
from support.handler_context import make_context, run_batch

from handler.artifacts import LABELS_FILE, METADATA_FILE, ArtifactError, sha256_file
from handler.embedding_handler import EmbeddingHandler
from handler.preprocessing import preprocess
from handler.service import EmbeddingService

ANSWER_KEYS = {"pred", "dist", "confidence", "unknown", "reason", "nearest_label", "neighbours", "model_version",
               "model_digest"}


@pytest.fixture(scope="module")
def digits(prepared_sample):
    """One held-out digit canvas per class, as PNG bytes a user would send, with its true label."""
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    return [(user_digit_png(prepared_sample.test_images[i]), str(prepared_sample.test_labels[i])) for i in picks]


def test_single_raw_request_answers_with_documented_schema(loaded, digits):
    handler, context = loaded
    answers, statuses = run_batch(handler, context, [raw_row(digits[7][0])])
    assert statuses == [200]
    assert set(answers[0]) == ANSWER_KEYS
    assert len(answers[0]["neighbours"]) == 5
    assert answers[0]["dist"] == answers[0]["neighbours"][0]["dist"]
    assert 0.0 < answers[0]["confidence"] <= 1.0


def test_batch_answers_in_order_and_mostly_correct(loaded, digits):
    handler, context = loaded
    answers, statuses = run_batch(handler, context, [raw_row(png) for png, _ in digits])
    assert statuses == [200] * 10
    correct = sum(a["pred"] == label for a, (_, label) in zip(answers, digits))
    assert correct >= 8  # a 2-epoch model; order is what this test is about


def test_each_input_form_gives_the_same_answer(loaded, digits):
    handler, context = loaded
    png = digits[3][0]
    answers, statuses = run_batch(handler, context, [raw_row(png), json_row(png), form_row(png)])
    assert statuses == [200, 200, 200]
    assert answers[0] == answers[1] == answers[2]


def test_bad_items_fail_alone_in_a_mixed_batch(loaded, digits):
    handler, context = loaded
    rows = [raw_row(digits[1][0]), raw_row(b"not an image"), {"body": {"data": "%%%"}}, {},
            {"body": "hello"}, json_row(digits[2][0])]
    answers, statuses = run_batch(handler, context, rows)
    assert statuses == [200, 400, 400, 400, 415, 200]
    for i in (1, 2, 3, 4):
        assert set(answers[i]) == {"error", "status"} and answers[i]["error"]
    assert answers[0]["pred"] and answers[5]["pred"]


def test_answers_equal_offline_service(loaded, digits, tiny_artifacts):
    handler, context = loaded
    service = EmbeddingService.from_dir(tiny_artifacts)
    offline = service.searcher.classify(service.embed(np.stack([preprocess(png) for png, _ in digits])))
    served, _ = run_batch(handler, context, [raw_row(png) for png, _ in digits])
    assert [a.pop("model_version") for a in served] == ["1.0"] * len(digits)  # from the MAR manifest
    # the build that answered: metadata.json names every artifact's SHA-256
    assert {a.pop("model_digest") for a in served} == {f"sha256:{sha256_file(tiny_artifacts / METADATA_FILE)}"}
    assert served == offline


def test_served_k_is_the_trained_k_and_matches_offline_evaluation(prepared_sample, tmp_path, caplog):
    """Trained with k=7: the handler serves 7 neighbours (a handler.k in model-config.yaml is ignored) and its
    searcher reproduces the accuracy training reported."""
    from handler.preprocessing import normalize
    from training.steps import build_gallery, evaluate_and_finalize, train_and_export
    from training.train import TrainConfig

    out = tmp_path / "k7"
    out.mkdir()
    train_and_export(prepared_sample, TrainConfig(epochs=1, embedding_dim=16, width=8, seed=0), out, k=7,
                     log=lambda _: None)
    build_gallery(prepared_sample, out, log=lambda _: None)
    metadata = evaluate_and_finalize(prepared_sample, out, k=7, plots=False, log=lambda _: None)
    context = make_context(out, {"k": 3})
    handler = EmbeddingHandler()
    with caplog.at_level(logging.WARNING):
        handler.initialize(context)
    assert "handler.k=3 is ignored" in caplog.text
    png = user_digit_png(prepared_sample.test_images[0])
    answers, _ = run_batch(handler, context, [raw_row(png)])
    assert len(answers[0]["neighbours"]) == 7
    service = handler.service
    results = service.searcher.classify(service.embed(normalize(prepared_sample.test_images)))
    served = np.mean([r.nearest_label == str(y) for r, y in zip(results, prepared_sample.test_labels)])
    assert served == pytest.approx(metadata.metrics.accuracy, abs=1e-9)


def test_pixel_limit_from_model_config_gives_413(tiny_artifacts, digits):
    context = make_context(tiny_artifacts, {"max_image_pixels": 100})
    handler = EmbeddingHandler()
    handler.initialize(context)
    answers, statuses = run_batch(handler, context, [raw_row(digits[0][0])])
    assert statuses == [413]
    assert "too large" in answers[0]["error"]


@pytest.mark.parametrize("tamper", ["labels", "index", "model"])
def test_refuses_to_load_tampered_artifacts(tiny_artifacts, tmp_path, caplog, tamper):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_artifacts, model_dir)
    target = {"labels": LABELS_FILE, "index": "index.faiss", "model": "model.pt"}[tamper]
    if tamper == "labels":
        labels = json.loads((model_dir / LABELS_FILE).read_text())
        (model_dir / LABELS_FILE).write_text(json.dumps(labels[::-1]))
    else:
        data = bytearray((model_dir / target).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (model_dir / target).write_bytes(bytes(data))
    handler = EmbeddingHandler()
    with caplog.at_level(logging.ERROR), pytest.raises(ArtifactError, match=target):
        handler.initialize(make_context(model_dir))
    assert any("refusing to load model" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("version", "0", "digits preprocessing version '0'"),
    ("profile", "sketches", "preprocessing profile 'sketches'"),
])
def test_refuses_a_preprocessing_it_does_not_implement(tiny_artifacts, tmp_path, key, value, message):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_artifacts, model_dir)
    metadata = json.loads((model_dir / METADATA_FILE).read_text())
    metadata["preprocessing"][key] = value
    (model_dir / METADATA_FILE).write_text(json.dumps(metadata))
    with pytest.raises(ArtifactError, match=message):
        EmbeddingHandler().initialize(make_context(model_dir))
