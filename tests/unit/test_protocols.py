"""KServe v1 and Open Inference v2 bodies through the real handler (TorchServe's Context, no server):
every format, pixel tensors equal to the PNG they came from, per-image failures, whole-request refusals."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from support.imagegen import png_bytes
from serving.samples import user_digit_png
from support.handler_context import run_batch

from handler.protocols import MAX_IMAGES, V2_EMBEDDING_OUTPUTS, V2_OUTPUTS, image_count

ANSWER_KEYS = {"pred", "dist", "confidence", "unknown", "reason", "nearest_label", "neighbours", "model_version",
               "model_digest"}
JSON_FORM = {"output_format": "json"}


@pytest.fixture(scope="module")
def canvases(prepared_sample) -> list[np.ndarray]:
    """One held-out 28x28 uint8 digit per class (light strokes on black, as MNIST stores them)."""
    return [prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == d)[0])] for d in range(10)]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def to_tensor(canvas: np.ndarray) -> list:
    """What torchvision's ToTensor gives for an MNIST image: [1, 28, 28] floats in [0, 1], as nested lists."""
    return (canvas.astype(np.float32) / 255.0)[None].tolist()


def ask(loaded, body: dict) -> tuple[int, dict]:
    handler, context = loaded
    answers, statuses = run_batch(handler, context, [{"body": body}])
    return statuses[0], answers[0]


def same(got: list[dict], expected: list[dict]) -> bool:
    """Equal answers; distances within 1e-5 (a batch of several images rounds differently in the last digit)."""
    def rounded(answer: dict) -> dict:
        if "error" in answer:
            return answer
        return {**answer, "dist": round(answer["dist"], 4), "confidence": round(answer["confidence"], 4),
                "neighbours": [{**n, "dist": round(n["dist"], 4)} for n in answer["neighbours"]]}
    assert [rounded(a) for a in got] == [rounded(a) for a in expected]
    for g, e in zip(got, expected):
        if "error" not in e:
            assert abs(g["dist"] - e["dist"]) < 1e-5
    return True


def outputs_by_name(body: dict) -> dict[str, np.ndarray]:
    """The typed outputs as numpy reads them (kserve's and tritonclient's as_numpy do the same)."""
    types = {"BYTES": object, "FP32": np.float32, "BOOL": bool, "INT64": np.int64}
    return {o["name"]: np.array(o["data"], dtype=types[o["datatype"]]).reshape(o["shape"]) for o in body["outputs"]}


def typed_equal_plain(body: dict, plain: list[dict]) -> bool:
    """Each row of the typed outputs holds the plain answer of the same image (floats as float32)."""
    out = outputs_by_name(body)
    assert list(out["label"]) == [a["pred"] or "" for a in plain]
    assert list(out["unknown"]) == [a["unknown"] for a in plain]
    assert list(out["reason"]) == [a["reason"] or "" for a in plain]
    assert list(out["nearest_label"]) == [a["nearest_label"] for a in plain]
    np.testing.assert_allclose(out["distance"], [a["dist"] for a in plain], atol=1e-5)
    np.testing.assert_allclose(out["confidence"], [a["confidence"] for a in plain], atol=1e-5)
    assert out["neighbour_labels"].tolist() == [[n["label"] for n in a["neighbours"]] for a in plain]
    np.testing.assert_allclose(out["neighbour_distances"], [[n["dist"] for n in a["neighbours"]] for a in plain],
                               atol=1e-5)
    return True


def plain_answer(loaded, image: bytes) -> dict:
    handler, context = loaded
    answers, statuses = run_batch(handler, context, [{"body": bytearray(image)}])
    assert statuses == [200]
    return answers[0]


def test_v1_instances_in_every_spelling_equal_the_plain_answers(loaded, canvases):
    pngs = [user_digit_png(c) for c in canvases[:3]]
    status, body = ask(loaded, {"instances": [{"data": b64(pngs[0])}, {"b64": b64(pngs[1])}, b64(pngs[2])]})
    assert status == 200 and set(body) == {"predictions"}
    assert same(body["predictions"], [plain_answer(loaded, png) for png in pngs])
    assert set(body["predictions"][0]) == ANSWER_KEYS


def test_v2_bytes_input_of_several_images_gives_typed_outputs(loaded, canvases):
    pngs = [user_digit_png(c) for c in canvases[:4]]
    status, body = ask(loaded, {"id": "req-42", "inputs": [
        {"name": "images", "datatype": "BYTES", "shape": [4], "data": [b64(p) for p in pngs]}]})
    assert status == 200
    assert body["id"] == "req-42" and body["model_name"] == "embedding" and body["model_version"] == "1.0"
    assert [(o["name"], o["datatype"]) for o in body["outputs"]] == [(n, t) for n, t, _ in V2_OUTPUTS]
    shapes = {o["name"]: o["shape"] for o in body["outputs"]}
    k = len(plain_answer(loaded, pngs[0])["neighbours"])
    assert shapes["label"] == shapes["unknown"] == [4] and shapes["neighbour_distances"] == [4, k]
    assert typed_equal_plain(body, [plain_answer(loaded, p) for p in pngs])


def test_v2_typed_rows_follow_the_inputs_in_request_order(loaded, canvases):
    pngs = [user_digit_png(c) for c in canvases[:3]]
    pixels = (canvases[3].astype(np.float32) / 255.0).reshape(1, 784).tolist()
    status, body = ask(loaded, {"inputs": [
        {"name": "a", "datatype": "BYTES", "shape": [2], "data": [b64(p) for p in pngs[:2]]},
        {"name": "b", "datatype": "FP32", "shape": [1, 784], "data": pixels},
        {"name": "c", "datatype": "BYTES", "shape": [1], "data": [b64(pngs[2])]}]})
    assert status == 200
    plain = [plain_answer(loaded, p) for p in (pngs[0], pngs[1], png_bytes(canvases[3]), pngs[2])]
    assert typed_equal_plain(body, plain)


def test_v2_requested_outputs_pick_and_order_and_embedding_by_name(loaded, canvases):
    pngs = [user_digit_png(c) for c in canvases[:2]]
    tensor = {"name": "x", "datatype": "BYTES", "shape": [2], "data": [b64(p) for p in pngs]}
    status, body = ask(loaded, {"inputs": [tensor], "outputs": [{"name": "unknown"}, {"name": "label"}]})
    assert status == 200 and [o["name"] for o in body["outputs"]] == ["unknown", "label"]
    status, body = ask(loaded, {"inputs": [tensor], "outputs": [{"name": "embedding"}, {"name": "neighbour_ids"}]})
    assert status == 200 and [(o["name"], o["datatype"]) for o in body["outputs"]] == \
        [(n, t) for n, t, _ in V2_EMBEDDING_OUTPUTS]
    out = outputs_by_name(body)
    status, json_form = ask(loaded, {"inputs": [tensor], "parameters": {"embedding": True, **JSON_FORM}})
    answers = [json.loads(t) for t in json_form["outputs"][0]["data"]]
    assert out["embedding"].shape == (2, len(answers[0]["embedding"]))
    np.testing.assert_allclose(out["embedding"], [a["embedding"] for a in answers], atol=1e-6)
    assert out["neighbour_ids"].tolist() == [[n["id"] for n in a["neighbours"]] for a in answers]
    status, body = ask(loaded, {"inputs": [tensor]})
    assert {o["name"] for o in body["outputs"]}.isdisjoint({"embedding", "neighbour_ids", "error"})


def test_v2_json_form_one_output_per_input_named_after_it(loaded, canvases):
    pngs = [user_digit_png(c) for c in canvases[:2]]
    status, body = ask(loaded, {"parameters": JSON_FORM, "inputs": [
        {"name": f"image-{i}", "datatype": "BYTES", "shape": [-1], "data": [b64(p)]} for i, p in enumerate(pngs)]})
    assert status == 200 and "id" not in body
    assert [o["name"] for o in body["outputs"]] == ["image-0", "image-1"]
    assert same([json.loads(o["data"][0]) for o in body["outputs"]], [plain_answer(loaded, p) for p in pngs])


@pytest.mark.parametrize("layout", ["1x28x28", "Nx1x28x28", "Nx784", "Nx28x28"])
def test_v2_pixel_tensor_equals_the_png_it_came_from(loaded, canvases, layout):
    pixels = np.stack([c.astype(np.float32) / 255.0 for c in canvases])  # (10, 28, 28)
    if layout == "1x28x28":
        pixels, shape = pixels[:1], [1, 28, 28]
    elif layout == "Nx1x28x28":
        shape = [10, 1, 28, 28]
    elif layout == "Nx784":
        shape = [10, 784]
    else:
        shape = [10, 28, 28]
    data = pixels.reshape(shape).tolist() if layout != "Nx784" else pixels.reshape(-1).tolist()  # nested or flat
    status, body = ask(loaded, {"parameters": JSON_FORM,
                                "inputs": [{"name": "input-0", "shape": shape, "datatype": "FP32", "data": data}]})
    assert status == 200
    got = [json.loads(t) for t in body["outputs"][0]["data"]]
    assert same(got, [plain_answer(loaded, png_bytes(c)) for c in canvases[:len(got)]])


@pytest.mark.parametrize("shape", [[10, 28, 28], [10, 1, 28, 28], [10, 784]])
def test_v2_uint8_tensor_equals_the_png_it_came_from(loaded, canvases, shape):
    data = np.stack(canvases).reshape(shape).tolist()
    status, body = ask(loaded, {"inputs": [{"name": "u", "shape": shape, "datatype": "UINT8", "data": data}]})
    assert status == 200
    assert typed_equal_plain(body, [plain_answer(loaded, png_bytes(c)) for c in canvases])


def test_v2_tensor_like_pytorch_serve_example(loaded, canvases):
    """The shape, name and id layout of pytorch/serve's mnist_v2_tensor.json (values of our own digit)."""
    status, body = ask(loaded, {"id": "d3b15cad", "inputs": [
        {"name": "input-0", "shape": [1, 28, 28], "datatype": "FP32", "data": to_tensor(canvases[0])}]})
    assert status == 200 and outputs_by_name(body)["label"].tolist() == ["0"]


@pytest.mark.parametrize("pixels, message", [
    (np.full((28, 28), np.nan), "values must be finite"),
    (np.full((28, 28), 255.0), r"values must lie in \[0, 1\].*found 255\.\.255"),
    (np.full((28, 28), -0.5), r"found -0\.5\.\.-0\.5"),
])
def test_a_bad_image_in_a_tensor_fails_only_itself(loaded, canvases, pixels, message):
    good = canvases[3].astype(np.float64) / 255.0
    data = [good.tolist(), pixels.tolist()]
    body = {"inputs": [{"name": "x", "shape": [2, 28, 28], "datatype": "FP32", "data": data}]}
    text = json.dumps(body, allow_nan=True)
    status, answer = ask(loaded, json.loads(text))
    assert status == 200
    out = outputs_by_name(answer)
    assert out["error"][0] == "" and re.search(message, out["error"][1])
    assert typed_equal_plain({"outputs": [{**o, "shape": [1, *o["shape"][1:]], "data": o["data"][:len(o["data"]) // 2]}
                                          for o in answer["outputs"]]}, [plain_answer(loaded, png_bytes(canvases[3]))])
    assert out["label"][1] == "" and np.isnan(out["distance"][1]) and out["unknown"][1]
    assert np.isnan(out["neighbour_distances"][1]).all() and set(out["neighbour_labels"][1]) == {""}
    status, answer = ask(loaded, {**json.loads(text), "parameters": JSON_FORM})
    first, second = (json.loads(t) for t in answer["outputs"][0]["data"])
    assert first == plain_answer(loaded, png_bytes(canvases[3]))
    assert second["status"] == 400 and re.search(message, second["error"])


def test_v1_bad_instance_fails_only_itself_and_all_bad_is_a_400(loaded, canvases):
    png = user_digit_png(canvases[5])
    status, body = ask(loaded, {"instances": [{"data": b64(png)}, {"data": b64(b"garbage")}, {"data": "%%%"},
                                              {"nodata": 1}]})
    assert status == 200
    ok, garbage, not_b64, no_data = body["predictions"]
    assert ok == plain_answer(loaded, png)
    assert garbage == {"error": "not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, TIFF)", "status": 400}
    assert not_b64 == {"error": "instance 2 is not valid base64", "status": 400}
    assert no_data["status"] == 400 and "instance 3" in no_data["error"]
    status, body = ask(loaded, {"instances": [{"data": b64(b"garbage")}]})
    assert status == 400 and body["error"].startswith("not an image") and len(body["predictions"]) == 1


@pytest.mark.parametrize("body, status, message", [
    ({"instances": "abc"}, 400, '"instances" must be a list'),
    ({"instances": []}, 400, "no image"),
    ({"instances": [{"data": "aGk="}] * (MAX_IMAGES + 1)}, 413, "too many images"),
    ({"inputs": []}, 400, '"inputs" must be a non-empty list'),
    ({"inputs": [{"datatype": "BYTES", "shape": [1], "data": ["aGk="]}]}, 400, "input 0 has no name"),
    ({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1, 28, 28], "data": [0] * 784}]}, 400,
     "datatype 'INT8' is not supported"),
    ({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, 784], "data": [256] * 784}]}, 400,
     r"UINT8 data must be integers in 0\.\.255"),
    ({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, 784], "data": [0.5] * 784}]}, 400,
     r"UINT8 data must be integers"),
    ({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["aGk="]}], "outputs": [{"name": "y"}]},
     400, "unknown output 'y': this model's outputs are label, distance"),
    ({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["aGk="]}], "outputs": "label"},
     400, '"outputs" must be a list'),
    ({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["aGk="]}],
      "parameters": {"output_format": "xml"}}, 400,
     "invalid value 'xml' for \"output_format\": use one of tensors, json"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 3], "data": [0.0] * 9}]}, 400,
     r"FP32 shape \[3, 3\] is not one of"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 784], "data": [0.0] * 784}]}, 400,
     "needs 1568 values, got 784"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784], "data": ["a"] * 784}]}, 400,
     "FP32 data must be numbers"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": "1,784", "data": [0.0] * 784}]}, 400,
     "shape must be a list of integers"),
    ({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [2], "data": ["aGk="]}]}, 400,
     r"shape \[2\] does not match its 1 elements"),
    ({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["aGk="]},
                 {"name": "x", "datatype": "BYTES", "shape": [1], "data": ["aGk="]}]}, 400, "used twice"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [MAX_IMAGES + 1, 784], "data": []}]}, 413,
     "too many images"),
])
def test_malformed_requests_are_refused_whole(loaded, body, status, message):
    got_status, answer = ask(loaded, body)
    assert got_status == status and set(answer) == {"error", "status"}
    assert re.search(message, answer["error"]), answer["error"]


def test_protocol_body_sent_as_json_bytes_is_read_too(loaded, canvases):
    """TorchServe parses only exactly application/json; with a charset the body arrives as bytes."""
    handler, context = loaded
    png = user_digit_png(canvases[8])
    raw = json.dumps({"instances": [{"data": b64(png)}]}).encode()
    answers, statuses = run_batch(handler, context, [{"body": bytearray(raw)}],
                                  headers=[{"Host": "127.0.0.1:8080",
                                            "body": {"content-type": "application/json; charset=utf-8"}}])
    assert statuses == [200] and answers[0]["predictions"] == [plain_answer(loaded, png)]


def test_protocol_requests_batch_with_plain_requests(loaded, canvases):
    """Frontend batching stays on: a batch mixing a plain image, a v1 and a v2 request answers each in kind."""
    handler, context = loaded
    pngs = [user_digit_png(c) for c in canvases[:3]]
    rows = [{"body": bytearray(pngs[0])}, {"body": {"instances": [{"data": b64(pngs[1])}]}},
            {"body": {"inputs": [{"name": "a", "datatype": "BYTES", "shape": [1], "data": [b64(pngs[2])]}]}}]
    answers, statuses = run_batch(handler, context, rows)
    assert statuses == [200, 200, 200]
    assert answers[0] == plain_answer(loaded, pngs[0])
    assert same(answers[1]["predictions"], [plain_answer(loaded, pngs[1])])
    assert typed_equal_plain(answers[2], [plain_answer(loaded, pngs[2])])


@pytest.mark.parametrize("shape, count", [([28, 28], 1), ([1, 28, 28], 1), ([5, 28, 28], 5), ([5, 1, 28, 28], 5),
                                          ([784], 1), ([5, 784], 5), ([5, 3, 28, 28], None), ([0, 784], None),
                                          ([2, 2, 784], None), ([28], None)])
def test_accepted_tensor_shapes(shape, count):
    assert image_count(shape) == count


def test_v2_parameters_embedding_adds_the_embedding_and_gallery_ids(loaded, canvases, tiny_artifacts):
    from handler.service import EmbeddingService

    pngs = [user_digit_png(c) for c in canvases[:3]]
    tensor = {"name": "images", "datatype": "BYTES", "shape": [3], "data": [b64(p) for p in pngs]}
    status, body = ask(loaded, {"id": "r1", "inputs": [tensor], "parameters": {"embedding": True, **JSON_FORM}})
    assert status == 200 and body["id"] == "r1"
    answers = [json.loads(t) for t in body["outputs"][0]["data"]]
    service = EmbeddingService.from_dir(tiny_artifacts)
    expected, _ = service.answer(pngs, [True] * 3)
    np.testing.assert_allclose([a["embedding"] for a in answers], [e["embedding"] for e in expected], atol=1e-6)
    assert [[n["id"] for n in a["neighbours"]] for a in answers] == \
        [[n["id"] for n in e["neighbours"]] for e in expected]
    assert all(isinstance(n["dataset_index"], int) for a in answers for n in a["neighbours"])
    plain = [json.loads(t) for t in ask(loaded, {"inputs": [tensor], "parameters": JSON_FORM})[1]["outputs"][0]["data"]]
    assert all("embedding" not in a and set(a["neighbours"][0]) == {"label", "dist"} for a in plain)
    status, typed = ask(loaded, {"inputs": [tensor], "parameters": {"embedding": True}})
    out = outputs_by_name(typed)
    np.testing.assert_allclose(out["embedding"], [e["embedding"] for e in expected], atol=1e-6)
    assert out["neighbour_ids"].tolist() == [[n["id"] for n in e["neighbours"]] for e in expected]


def test_v1_parameters_embedding(loaded, canvases):
    png = user_digit_png(canvases[4])
    status, body = ask(loaded, {"instances": [{"data": b64(png)}], "parameters": {"embedding": "true"}})
    (answer,) = body["predictions"]
    assert status == 200 and len(answer["embedding"]) == 32 and "id" in answer["neighbours"][0]


@pytest.mark.parametrize("body", [
    {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["AA=="]}], "parameters": {"embedding": 3}},
    {"instances": [{"data": "AA=="}], "parameters": "embedding"},
])
def test_invalid_embedding_parameter_is_a_400_for_the_whole_request(loaded, body):
    status, answer = ask(loaded, body)
    assert status == 400 and set(answer) == {"error", "status"} and answer["status"] == 400
