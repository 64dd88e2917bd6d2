"""Hostile and unusual requests against a real TorchServe, and properties of request decoding.

The corpus (tests/support/hostile.py) classifies every request as must-reject (4xx JSON error naming the problem)
or must-accept (200, the same answer as the offline service); test ids say which.
"""

from __future__ import annotations

import base64
import io
import json
import string
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support.hostile import (
    CASES,
    Assets,
    HostileRequest,
    Outcome,
    build_corpus,
    form_decoder_fails,
    multipart,
    png_chunks,
    post,
    ready_pids,
    send,
    wait_for_workers,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from serving.samples import user_digit_png
from PIL import Image

from handler.requests import RequestError, decode_request
from handler.service import EmbeddingService

serving = pytest.mark.serving
OCTET = {"Content-Type": "application/octet-stream"}


@dataclass
class CorpusRun:
    """The corpus sent once, sequentially, with the worker pids seen before and after."""

    outcomes: dict[str, Outcome]
    pids_before: dict[str, int]
    pids_after: dict[str, int]


@pytest.fixture(scope="session")
def hostile_corpus(prepared_sample) -> dict[str, HostileRequest]:
    """The corpus built from two real held-out digits (a 7, and a 1 for the GIF's second frame)."""
    seven = prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == 7)[0])]
    one = prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == 1)[0])]
    return {item.id: item for item in build_corpus(Assets(seven, one))}


@pytest.fixture(scope="module")
def offline(tiny_artifacts) -> EmbeddingService:
    return EmbeddingService.from_dir(tiny_artifacts)


@pytest.fixture(scope="module")
def endpoint(torchserve) -> tuple[str, str]:
    return f"{torchserve.endpoints.inference}/predictions/{torchserve.model_name}", torchserve.keys()["inference"]


@pytest.fixture(scope="module")
def corpus_run(torchserve, endpoint, hostile_corpus) -> CorpusRun:
    url, token = endpoint
    wait_for_workers(torchserve, 2)  # start() returns when the first worker is READY
    before = ready_pids(torchserve)
    outcomes = {item_id: send(url, token, item) for item_id, item in hostile_corpus.items()}
    return CorpusRun(outcomes, before, ready_pids(torchserve))


@pytest.fixture(scope="module")
def good_digits(prepared_sample) -> list[bytes]:
    picks = [int(np.flatnonzero(prepared_sample.test_labels == d)[0]) for d in range(10)]
    return [user_digit_png(prepared_sample.test_images[i]) for i in picks]


def assert_same_answer(served: dict, expected: dict) -> None:
    assert served["pred"] == expected["pred"]
    assert served["unknown"] == expected["unknown"]
    assert [n["label"] for n in served["neighbours"]] == [n["label"] for n in expected["neighbours"]]
    np.testing.assert_allclose([n["dist"] for n in served["neighbours"]],
                               [n["dist"] for n in expected["neighbours"]], atol=1e-5)


def offline_answer(service: EmbeddingService, image: bytes) -> dict:
    answers, _ = service.answer([image])
    assert "error" not in answers[0], answers[0]
    return answers[0]




def test_corpus_is_large_and_classified():
    assert len(CASES) >= 40
    assert {case.expect for case in CASES} == {"reject", "accept"}
    assert all(400 <= case.status < 500 for case in CASES if case.expect == "reject")


@serving
@pytest.mark.parametrize("item_id", [case.id for case in CASES])
def test_corpus_item_is_answered_as_classified(corpus_run, hostile_corpus, offline, item_id):
    item, outcome = hostile_corpus[item_id], corpus_run.outcomes[item_id]
    if item.expect == "accept":
        assert outcome.status == 200, outcome.raw[:300]
        assert_same_answer(outcome.body, offline_answer(offline, item.image))
        return
    assert outcome.status < 500, f"server error for a bad request: {outcome.raw[:300]!r}"
    assert outcome.status == item.status, outcome.raw[:300]
    if item.raw_socket:
        return  # the front's own 413 (see test_oversized_body_413_is_answered_early_with_a_json_error)
    assert outcome.from_handler and set(outcome.body) == {"error", "status"}, outcome.raw[:300]
    assert outcome.body["status"] == outcome.status
    assert outcome.message and "\n" not in outcome.message
    assert item.fragment in outcome.message.lower()


@serving
def test_worker_pids_are_unchanged_after_the_whole_corpus(corpus_run):
    assert len(corpus_run.pids_before) == 2
    assert corpus_run.pids_after == corpus_run.pids_before


@serving
def test_next_good_request_after_the_corpus_is_answered_correctly(corpus_run, endpoint, good_digits, offline):
    url, token = endpoint
    for png in good_digits[:3]:
        outcome = post(url, png, OCTET, token)
        assert outcome.status == 200
        assert_same_answer(outcome.body, offline_answer(offline, png))


@serving
def test_concurrent_batches_mixing_good_and_bad_items_answer_the_good_ones(
        corpus_run, endpoint, hostile_corpus, good_digits, offline, torchserve):
    """Every request of the corpus interleaved with good digits, 16 at a time: batches mix both."""
    url, token = endpoint
    bad = [item for item in hostile_corpus.values() if not item.raw_socket]
    jobs: list[tuple[str, bytes, dict[str, str]]] = []
    for i, item in enumerate(bad):
        png = good_digits[i % len(good_digits)]
        jobs += [("good", png, OCTET), (item.id, item.body, item.headers)]
    log = Path(torchserve.workdir) / "logs" / "model_log.log"
    offset = log.stat().st_size
    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(lambda job: post(url, job[1], job[2], token), jobs))
    expected = {png: offline_answer(offline, png) for png in good_digits}
    for (kind, body, _), outcome in zip(jobs, outcomes, strict=True):
        if kind == "good":
            assert outcome.status == 200, outcome.raw[:200]
            assert_same_answer(outcome.body, expected[body])
        else:
            assert outcome.status == corpus_run.outcomes[kind].status, (kind, outcome.raw[:200])
    batches = [line.split("batch=")[1].split()[:2] for line in log.read_text(errors="replace")[offset:].splitlines()
               if "batch=" in line]
    mixed = [b for b in batches if 0 < int(b[1].split("=")[1]) < int(b[0])]
    assert mixed, f"no batch mixed good and bad requests: {batches[:20]}"
    assert ready_pids(torchserve) == corpus_run.pids_before


@serving
def test_oversized_body_413_is_answered_early_with_a_json_error(corpus_run):
    """The front answers 413 from Content-Length alone, with the reason (TorchServe's own 413 has no body)."""
    outcome = corpus_run.outcomes["reject-body-over-max-request-size"]
    assert outcome.status == 413 and outcome.message == "request body larger than 8388608 bytes"


# Which content types reach the handler. With a PNG body: "handler" = our handler answered
# (it saw the bytes), "frontend" = TorchServe answered without calling the handler.
CONTENT_TYPES = [
    (None, 200, "handler"),
    ("", 200, "handler"),
    ("application/octet-stream", 200, "handler"),
    ("image/png", 200, "handler"),
    ("image/jpeg; charset=utf-8", 200, "handler"),
    ("text/plain", 200, "handler"),  # the worker keeps non-UTF-8 text bodies as bytes
    ("text/html", 200, "handler"),
    ("application/xml", 200, "handler"),
    ("multipart/mixed", 200, "handler"),
    ("multipart/form-data", 200, "handler"),  # no boundary: passed through as the body
    ("application/json", 400, "handler"),  # "body is not valid JSON"
    ("multipart/form-data; boundary=zz", 400, "handler"),  # parsed: no parts -> "empty request"
    ("application/x-www-form-urlencoded", 200, "handler"),  # curl --data-binary: relabelled by the front
]
# application/x-www-form-urlencoded: the front relabels image bytes (serving.forms); the corpus sends forms.


@serving
@pytest.mark.parametrize("content_type,status,origin", CONTENT_TYPES)
def test_which_content_types_reach_the_handler(endpoint, good_digits, content_type, status, origin):
    url, token = endpoint
    outcome = post(url, good_digits[7], {} if content_type is None else {"Content-Type": content_type}, token)
    assert outcome.status == status
    assert ("handler" if outcome.from_handler else "frontend") == origin
    assert outcome.status < 500, "a 5xx for a client mistake"


@serving
@pytest.mark.parametrize("body,headers", [
    multipart([("note", None, None, b"a seven")]),
    (b"digit=7", {"Content-Type": "application/x-www-form-urlencoded"}),
], ids=["multipart-text-field", "urlencoded-field"])
def test_form_without_a_file_says_so(endpoint, body, headers):
    url, token = endpoint
    outcome = post(url, body, headers, token)
    assert outcome.status == 400 and "no image file field" in outcome.message


@serving
def test_json_with_a_mixed_case_content_type_is_decoded(endpoint, good_digits):
    url, token = endpoint
    body = json.dumps({"data": base64.b64encode(good_digits[7]).decode()}).encode()
    assert post(url, body, {"Content-Type": "Application/JSON"}, token).status == 200


@serving
def test_blank_image_is_answered_unknown(corpus_run):
    answer = corpus_run.outcomes["accept-png-1x1"].body
    assert answer["unknown"] is True


# --- properties of request decoding (no server) ---------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(["body", "data", "file", "image", "note", ""]) | st.text(max_size=10)
field_values = st.binary(max_size=64) | st.binary(max_size=64).map(bytearray) | st.text(max_size=64) | json_values
content_types = st.sampled_from(["", "application/json", "application/json; charset=utf-8", "text/plain",
                                 "application/octet-stream", "image/png", "multipart/form-data"]) | st.text(max_size=30)
base64ish = st.text(alphabet=string.ascii_letters + string.digits + "+/=\n -_:;,", max_size=80)


def decoded_or_request_error(row, types) -> bytes | None:
    try:
        out = decode_request(row, types)
    except RequestError as exc:
        assert exc.status in (400, 413, 415)
        assert str(exc)
        return None
    assert type(out) is bytes and out
    return out


@settings(max_examples=300, deadline=None, database=None)
@given(st.dictionaries(field_names, field_values, max_size=4),
       st.none() | st.dictionaries(field_names, content_types, max_size=4))
def test_random_rows_raise_only_request_error(row, types):
    out = decoded_or_request_error(row, types)
    if out is not None and "body" not in row and not isinstance(row.get("data"), str):  # else base64 of "data"
        assert out in [bytes(v) for v in row.values() if isinstance(v, (bytes, bytearray))]


@settings(max_examples=300, deadline=None, database=None)
@given(json_values | st.dictionaries(st.just("data"), json_values | base64ish, max_size=1), content_types)
def test_random_json_bodies_raise_only_request_error(payload, content_type):
    decoded_or_request_error({"body": payload}, {"body": content_type})


@settings(max_examples=200, deadline=None, database=None)
@given(st.binary(max_size=256), content_types)
def test_random_raw_bytes_are_passed_through_or_refused(data, content_type):
    out = decoded_or_request_error({"body": data}, {"body": content_type})
    assert out is None or out == data


@settings(max_examples=150, deadline=None, database=None)
@given(st.binary(min_size=1, max_size=200), st.integers(1, 76), st.booleans(), field_names)
def test_image_bytes_round_trip_through_every_request_form(image, wrap, data_uri, field):
    """Raw body, JSON base64 (wrapped at any column, optionally a data URI) and a lone form file all give the bytes."""
    text = base64.b64encode(image).decode()
    text = "\n".join(text[i : i + wrap] for i in range(0, len(text), wrap))
    if data_uri:
        text = "data:image/png;base64," + text
    assert decode_request({"body": image}, {"body": "application/octet-stream"}) == image
    assert decode_request({"body": {"data": text}}, {"body": "application/json"}) == image
    if field != "body":
        assert decode_request({field: bytearray(image)}) == image


def test_corpus_images_are_what_the_cases_claim(hostile_corpus):
    """Guards the corpus itself: the legitimate items really are the unusual images they are named after."""

    def opened(item_id: str) -> Image.Image:
        return Image.open(io.BytesIO(hostile_corpus[item_id].image))

    assert opened("accept-png-16-bit").mode == "I;16"
    assert opened("accept-jpeg-cmyk").mode == "CMYK"
    assert Image.open(io.BytesIO(hostile_corpus["accept-animated-gif-first-frame"].body)).n_frames == 2
    assert opened("accept-png-1x1").size == (1, 1) and opened("accept-png-1x10000").size == (1, 10000)
    assert opened("accept-png-4000x4000-at-pixel-limit").size == (4000, 4000)
    assert b"%" not in hostile_corpus["accept-png-as-form-urlencoded"].body
    assert b"=" in hostile_corpus["reject-json-as-form-urlencoded"].body
    assert b"=" not in hostile_corpus["reject-json-without-equals-as-form-urlencoded"].body
    assert form_decoder_fails(hostile_corpus["accept-png-failing-the-form-decoder"].body)
    bomb = hostile_corpus["reject-png-bomb-30000x30000"].body
    assert len(bomb) < 200_000 and struct.unpack(">II", bomb[16:24]) == (30000, 30000)
    idat = next(data for _, kind, data in png_chunks(bomb) if kind == b"IDAT")
    assert len(zlib.decompressobj().decompress(idat, 50_000_000)) == 50_000_000  # a genuine bomb, not just a header


@pytest.mark.parametrize("row,types", [
    ({"a\nb": b"", "note": b""}, None),
    ({"\u00e9": b""}, None),
    ({"body": "hello"}, {"body": "text/\u00e9"}),
], ids=["newline-in-field-name", "non-ascii-field-name", "non-ascii-content-type"])
def test_error_messages_are_one_ascii_line_whatever_the_client_sends(row, types):
    with pytest.raises(RequestError) as excinfo:
        decode_request(row, types)
    message = str(excinfo.value)
    assert message.isascii() and message.isprintable()


# --- the handler's answers in TorchServe's worker protocol (no server) ------------------------------------------


def parse_predict_frame(frame: bytes) -> list[tuple[str, int, str, bytes]]:
    """Decode a worker's predict response as the Java frontend does: (request id, status, phrase, body) per item."""
    pos = 0

    def take_int() -> int:
        nonlocal pos
        (value,) = struct.unpack("!i", frame[pos : pos + 4])
        pos += 4
        return value

    def take(n: int) -> bytes:
        nonlocal pos
        assert 0 <= n <= len(frame) - pos, f"length {n} at offset {pos} runs past the frame"
        pos += n
        return frame[pos - n : pos]

    take_int()
    take(take_int())
    items = []
    while (length := take_int()) != -1:
        request_id = take(length).decode()
        take(take_int())  # content type
        status = take_int()
        phrase = take(take_int()).decode("utf-8", errors="replace")
        for _ in range(take_int()):  # headers
            take(take_int())
            take(take_int())
        items.append((request_id, status, phrase, take(take_int())))
    assert pos == len(frame), "bytes left after the end-of-list marker"
    return items




@pytest.mark.parametrize("row,headers", [
    pytest.param({"front": b"x", "back": b"y"}, {}, id="ascii-field-names"),
    pytest.param({"body": "hello"}, {"body": {"content-type": "text/plain"}}, id="ascii-content-type"),
    pytest.param({"\u00e9": b""}, {}, id="non-ascii-empty-field"),
    pytest.param({"r\u00e9sum\u00e9": b"x", "\u00fc": b"y"}, {}, id="non-ascii-field-names"),
    pytest.param({"body": "hello"}, {"body": {"content-type": "text/\u00e9"}}, id="non-ascii-content-type"),
])
def test_error_answers_survive_torchserve_framing(loaded, prepared_sample, row, headers):
    """A bad item and a good one in one batch, encoded as the worker encodes them and decoded as the frontend does."""
    from ts.context import RequestProcessor
    from ts.protocol.otf_message_handler import create_predict_response

    handler, context = loaded
    good = user_digit_png(prepared_sample.test_images[0])
    rows = [row, {"body": good}]
    context.request_processor = [RequestProcessor(headers), RequestProcessor({"body": {"content-type": "image/png"}})]
    context.request_ids = {0: "bad-request", 1: "good-request"}
    out = handler.handle(rows, context)
    items = parse_predict_frame(bytes(create_predict_response(out, context.request_ids, "Prediction success", 200,
                                                              context)))
    assert [(i[0], i[1]) for i in items] == [("bad-request", 400 if "body" not in row else 415),
                                             ("good-request", 200)]
    assert json.loads(items[0][3])["error"] and json.loads(items[1][3])["pred"]
