"""TorchServe request rows -> image bytes or a RequestError with the HTTP status (handler/requests.py)."""

from __future__ import annotations

import base64

import pytest

from handler.requests import RequestError, decode_request

IMAGE = b"\x89PNG\r\n\x1a\n fake image bytes \x00\xff"
OTHER = b"GIF89a other image bytes"


def refused(row, content_types=None) -> RequestError:
    with pytest.raises(RequestError) as excinfo:
        decode_request(row, content_types)
    assert "\n" not in str(excinfo.value)
    return excinfo.value


@pytest.mark.parametrize("body", [IMAGE, bytearray(IMAGE)], ids=["bytes", "bytearray"])
@pytest.mark.parametrize("content_type", [None, "application/octet-stream", "image/png"])
def test_raw_body_is_returned_as_bytes(body, content_type):
    types = None if content_type is None else {"body": content_type}
    out = decode_request({"body": body}, types)
    assert out == IMAGE and type(out) is bytes


def test_json_with_base64_data_is_decoded():
    row = {"body": {"data": base64.b64encode(IMAGE).decode()}}
    assert decode_request(row, {"body": "application/json"}) == IMAGE


@pytest.mark.parametrize(
    "payload",
    [{}, {"image": base64.b64encode(IMAGE).decode()}, {"data": None}, {"data": 123}, {"data": ["aGk="]},
     {"data": base64.b64encode(IMAGE)}],
    ids=["empty-object", "wrong-key", "null", "number", "list", "bytes-not-str"],
)
def test_json_without_a_data_string_is_400_and_shows_the_expected_shape(payload):
    error = refused({"body": payload}, {"body": "application/json"})
    assert error.status == 400
    assert '{"data": "<base64-encoded image>"}' in str(error)


@pytest.mark.parametrize(
    "data", ["not base64!", "aGVsbG8", "aGVs*bG8="], ids=["punctuation", "bad-padding", "bad-character"]
)
def test_json_with_invalid_base64_is_400(data):
    error = refused({"body": {"data": data}}, {"body": "application/json"})
    assert error.status == 400
    assert "base64" in str(error)


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
def test_bytes_declared_as_json_mean_the_json_did_not_parse_400(content_type):
    error = refused({"body": b'{"data": "abc"'}, {"body": content_type})
    assert error.status == 400
    assert "not valid JSON" in str(error)


@pytest.mark.parametrize("content_type", ["text/plain", ""])
def test_text_body_is_415_and_says_what_to_send(content_type):
    error = refused({"body": "hello"}, {"body": content_type})
    assert error.status == 415
    assert (content_type or "text") in str(error)
    assert "image bytes" in str(error) and '{"data": "<base64>"}' in str(error)


@pytest.mark.parametrize("body", [b"", bytearray()], ids=["bytes", "bytearray"])
def test_empty_body_is_400(body):
    error = refused({"body": body})
    assert error.status == 400
    assert "empty body" in str(error)


@pytest.mark.parametrize("body", [None, 42, ["a", "b"]], ids=["none", "number", "json-list"])
def test_body_of_another_type_is_400(body):
    assert refused({"body": body}).status == 400


def test_multipart_data_field_is_returned():
    assert decode_request({"data": bytearray(IMAGE), "note": "a comment"}) == IMAGE


@pytest.mark.parametrize("field", ["file", "image", "upload", "digit.png"])
def test_multipart_single_file_under_any_name_is_returned(field):
    assert decode_request({field: bytearray(IMAGE), "label": "7"}) == IMAGE


@pytest.mark.parametrize("preferred", ["data", "file", "image"])
def test_multipart_preferred_field_wins_over_other_files(preferred):
    assert decode_request({"attachment": bytearray(OTHER), preferred: bytearray(IMAGE)}) == IMAGE


def test_multipart_data_wins_over_the_other_preferred_names():
    assert decode_request({"image": bytearray(OTHER), "file": bytearray(OTHER), "data": bytearray(IMAGE)}) == IMAGE


def test_multipart_with_several_files_and_none_named_data_is_400_naming_them():
    error = refused({"front": bytearray(IMAGE), "back": bytearray(OTHER)})
    assert error.status == 400
    assert "'back', 'front'" in str(error) and "'data'" in str(error)


def test_multipart_without_a_file_field_is_400_with_the_curl_hint():
    error = refused({"name": "seven", "comment": "no file here"})
    assert error.status == 400
    assert "no image file field" in str(error) and "-F data=@" in str(error)


@pytest.mark.parametrize("field", ["data", "upload"])
def test_multipart_empty_file_is_400_naming_the_field(field):
    error = refused({field: bytearray()})
    assert error.status == 400
    assert f"{field!r} is empty" in str(error)


def test_empty_row_is_400():
    error = refused({})
    assert error.status == 400
    assert "empty request" in str(error)


def test_request_error_defaults_to_400_and_keeps_its_message():
    error = RequestError("bad thing")
    assert error.status == 400 and str(error) == "bad thing"
    assert isinstance(error, ValueError)
    assert RequestError("too big", status=413).status == 413


def test_kserve_envelope_row_with_base64_string_is_decoded():
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 8
    assert decode_request({"data": base64.b64encode(png).decode()}) == png
    with pytest.raises(RequestError, match="base64"):
        decode_request({"data": "%%%"})


def test_a_form_text_field_is_never_taken_as_the_image():
    """TorchServe hands a form's text field (no filename) over as bytes with an empty content type."""
    with pytest.raises(RequestError, match="form has no image file field"):
        decode_request({"note": b"a seven"}, {"note": ""})
    png = b"\x89PNG\r\n\x1a\n..."
    assert decode_request({"note": b"a seven", "upload": png}, {"note": "", "upload": "image/png"}) == png


def as_urlencoded_form(body: bytes) -> tuple[dict, dict]:
    """The row and content types the worker gets for `body` sent as application/x-www-form-urlencoded (curl -d and
    --data-binary without -H): TorchServe's frontend splits it into text fields at "&" and "=" (parse_qsl reads it
    as Netty's form decoder does for bodies without a bad %-escape)."""
    from urllib.parse import parse_qsl

    fields = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: value.encode() for name, value in fields}, {name: "" for name, _ in fields}


@pytest.mark.parametrize("body", [
    b'{"data": "' + base64.b64encode(IMAGE) + b'"}',
    b'{"instances": [{"data": "' + base64.b64encode(IMAGE) + b'"}]}',
    b'  {"data": "abc"}',
], ids=["predictions-body", "v1-body", "no-equals-sign"])
def test_json_sent_as_a_urlencoded_form_is_told_to_send_the_json_content_type(body):
    error = refused(*as_urlencoded_form(body))
    assert error.status == 400 and str(error).isascii()
    assert 'a JSON body arrived as a URL-encoded form' in str(error)
    assert '-H "Content-Type: application/json"' in str(error) and "-F data=@image.png" in str(error)


@pytest.mark.parametrize("body", [IMAGE, b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01 jpeg", b"GIF89a\x1c\x00\x1c\x00\xf7"],
                         ids=["png", "jpeg", "gif"])
def test_image_bytes_sent_as_a_urlencoded_form_are_told_to_send_octet_stream(body):
    error = refused(*as_urlencoded_form(body))
    assert error.status == 400 and str(error).isascii()
    assert "image bytes arrived as a URL-encoded form" in str(error)
    assert "curl -T image.png" in str(error) and "application/octet-stream" in str(error)


def test_an_empty_row_names_the_headers_curl_needs():
    """What the worker gets for a URL-encoded body (curl -d or --data-binary without -H) holding no "=": TorchServe's
    form decoder keeps no field of it (checked against the real server by the hostile corpus)."""
    error = refused({})
    assert str(error).startswith("empty request") and str(error).isascii()
    assert '-H "Content-Type: application/octet-stream"' in str(error)
    assert '-H "Content-Type: application/json"' in str(error)


def test_a_plain_urlencoded_form_keeps_the_file_field_hint():
    error = refused(*as_urlencoded_form(b"digit=7&note=a+seven"))
    assert str(error) == "form has no image file field: use -F data=@image.png"
