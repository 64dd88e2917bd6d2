"""The gateway's side of Open Inference v2 REST: the binary tensor extension in and out, refusals as 4xx."""

from __future__ import annotations

import base64
import json
import math
import struct

import numpy as np
import pytest

from serving.open_inference import ProtocolError, binary_outputs, json_object, read_v2, write_v2


def framed(*elements: bytes) -> bytes:
    """A raw BYTES tensor as KServe's and Triton's clients write one."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def request(inputs: list[dict], raws: list[bytes], **extra) -> tuple[bytes, str]:
    head = json.dumps({"inputs": inputs, **extra}).encode()
    return head + b"".join(raws), str(len(head))


def test_binary_inputs_become_json_data_the_handler_reads():
    pixels = np.linspace(0, 1, 2 * 784, dtype=np.float32).reshape(2, 784)
    uint8 = (np.arange(784) % 256).astype(np.uint8)
    images = [b"\x89PNG first", b"second\x00\xff"]
    body, length = request([
        {"name": "a", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(framed(*images))}},
        {"name": "b", "datatype": "FP32", "shape": [2, 784], "parameters": {"binary_data_size": pixels.nbytes}},
        {"name": "c", "datatype": "UINT8", "shape": [1, 784], "data": uint8.tolist()},
        {"name": "d", "datatype": "UINT8", "shape": [1, 784], "parameters": {"binary_data_size": 784, "x": 1}},
    ], [framed(*images), pixels.tobytes(), uint8.tobytes()], parameters={"binary_data_output": True})
    parsed, converted = read_v2(body, length)
    a, b, c, d = parsed["inputs"]
    assert converted and [base64.b64decode(t) for t in a["data"]] == images
    assert np.array_equal(np.array(b["data"], dtype=np.float32).reshape(2, 784), pixels)
    assert c["data"] == d["data"] == uint8.tolist() and d["parameters"] == {"x": 1}
    assert parsed["parameters"] == {"binary_data_output": True}


def test_json_body_is_read_whatever_it_claims_to_be():
    body = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["aGk="]}]}).encode()
    assert read_v2(body, None) == (json.loads(body), False)


@pytest.mark.parametrize("inputs, raws, length, message", [
    ([{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}], [], None,
     "no Inference-Header-Content-Length header"),
    ([{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 8}}], [b"\0" * 4], "",
     "binary_data_size 8 runs past the end"),
    ([{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}], [b"\0" * 6], "",
     "2 bytes after the JSON"),
    ([{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 3}}], [b"\0" * 3], "",
     "3 bytes is not a whole number of FP32 values"),
    ([{"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": -1}}], [], "",
     "must be a non-negative integer"),
    ([{"name": "x", "datatype": "FP32", "shape": [1], "data": [0.5], "parameters": {"binary_data_size": 4}}],
     [b"\0" * 4], "", "both data and binary_data_size"),
    ([{"name": "x", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}],
     [struct.pack("<I", 9) + b"ab"], "", "runs past the tensor's end"),
    ([{"name": "x", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 2}}], [b"ab"], "",
     "ends inside an element's 4-byte length"),
    ([{"name": "x", "datatype": "COMPLEX", "shape": [1], "parameters": {"binary_data_size": 2}}], [b"ab"], "",
     "datatype 'COMPLEX' has no binary form"),
])
def test_malformed_binary_requests_are_refused(inputs, raws, length, message):
    body, header = request(inputs, raws)
    with pytest.raises(ProtocolError, match=message) as caught:
        read_v2(body, header if length == "" else length)
    assert caught.value.status == 400


@pytest.mark.parametrize("header, message", [("12x", "must be a non-negative integer"),
                                             ("²", "must be a non-negative integer"),
                                             ("99999", "has only")])
def test_bad_header_length_is_refused(header, message):
    with pytest.raises(ProtocolError, match=message):
        read_v2(b'{"inputs": []}', header)


def test_a_body_that_is_not_json_is_a_400_naming_the_protocol():
    with pytest.raises(ProtocolError, match="KServe v1 body is not JSON"):
        json_object(b"\x89PNG\r\n", "KServe v1")
    with pytest.raises(ProtocolError, match="must be a JSON object"):
        json_object(b"[1, 2]", "KServe v1")


def test_binary_output_choice():
    assert binary_outputs({"parameters": {"binary_data_output": True}}) == (True, {})
    assert binary_outputs({"outputs": [{"name": "label", "parameters": {"binary_data": True}},
                                       {"name": "unknown", "parameters": {"binary_data": False}}, {"name": "x"}]}) \
        == (False, {"label": True, "unknown": False})
    assert binary_outputs({"parameters": "nonsense", "outputs": "nonsense"}) == (False, {})


def test_binary_outputs_round_trip_as_clients_read_them():
    answer = {"model_name": "m", "id": "7", "outputs": [
        {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["7", ""]},
        {"name": "distance", "datatype": "FP32", "shape": [2], "data": [0.25, None]},
        {"name": "unknown", "datatype": "BOOL", "shape": [2], "data": [False, True]},
        {"name": "neighbour_ids", "datatype": "INT64", "shape": [2, 2], "data": [[3, 4], [-1, -1]]},
    ]}
    body, length = write_v2(answer, True, {"unknown": False})
    head = json.loads(body[:length])
    assert head["id"] == "7" and head["outputs"][2] == answer["outputs"][2]
    raw, offset = body[length:], 0
    got = {}
    for output in head["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            continue
        assert "data" not in output
        got[output["name"]] = raw[offset:offset + size]
        offset += size
    assert offset == len(raw)
    assert got["label"] == framed(b"7", b"")
    distance = np.frombuffer(got["distance"], dtype="<f4")
    assert distance[0] == np.float32(0.25) and math.isnan(distance[1])
    assert np.frombuffer(got["neighbour_ids"], dtype="<i8").tolist() == [3, 4, -1, -1]


def test_no_binary_output_leaves_plain_json():
    answer = {"model_name": "m", "outputs": [{"name": "label", "datatype": "BYTES", "shape": [1], "data": ["1"]}]}
    body, length = write_v2(answer, False, {})
    assert length is None and json.loads(body) == answer


def test_large_bodies_are_parsed_off_the_event_loop():
    """A multi-megabyte body parsed on the loop would stall probes and every other request meanwhile."""
    import asyncio
    import threading

    from serving.gateway.app import OFF_LOOP_BYTES, off_loop as _off_loop

    async def threads() -> tuple[int, int, int]:
        small = await _off_loop(OFF_LOOP_BYTES - 1, threading.get_ident)
        large = await _off_loop(OFF_LOOP_BYTES, threading.get_ident)
        return threading.get_ident(), small, large

    loop_thread, small, large = asyncio.run(threads())
    assert small == loop_thread and large != loop_thread
