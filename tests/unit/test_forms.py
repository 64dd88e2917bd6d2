"""serving.forms: the two rules every front applies to a body labelled a URL-encoded form."""

from __future__ import annotations

import json

import pytest

from serving.forms import FORM, OCTET_STREAM, FormError, checked, is_form, refusal, relabelled, urlencoded_params

PNG_HEAD = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content_type", [FORM, "Application/X-WWW-Form-Urlencoded", f"{FORM}; charset=utf-8"])
def test_a_form_label_is_recognised_whatever_its_case_and_parameters(content_type):
    assert is_form(content_type)


@pytest.mark.parametrize("content_type", ["", "application/octet-stream", "multipart/form-data; boundary=x",
                                          "application/json", "text/plain"])
def test_other_labels_are_not_forms(content_type):
    assert not is_form(content_type)
    assert relabelled(content_type, PNG_HEAD) is None and checked(content_type, b"data=%zz") is None


def test_image_bytes_labelled_as_a_form_go_on_as_octet_stream():
    assert relabelled(FORM, PNG_HEAD + b"data=%zz") == OCTET_STREAM
    assert checked(FORM, PNG_HEAD + b"%") == OCTET_STREAM


@pytest.mark.parametrize("body", [b"digit=7", b"a=1&b=%41+c", b"", b"flag"])
def test_a_form_that_decodes_goes_on_unchanged(body):
    assert checked(FORM, body) is None


@pytest.mark.parametrize("body,reason", [(b"data=%zz", "no %XX escape"), (b"%g1=1", "no %XX escape"),
                                         (b"=7", "without a name"), (b"a=1&=2", "without a name")])
def test_a_form_that_does_not_decode_is_the_callers_error(body, reason):
    with pytest.raises(FormError, match=reason):
        checked(FORM, body)


def test_the_refusal_is_shaped_as_the_handlers():
    with pytest.raises(FormError) as caught:
        urlencoded_params(b"data=%zz")
    answer = json.loads(refusal(caught.value))
    assert answer == {"error": str(caught.value), "status": 400}
    assert "curl -T image.png" in answer["error"]


def test_fields_decode_as_torchserve_gives_them():
    assert urlencoded_params(b"a=1+2&b=%41&c&d") == [("a", b"1 2", ""), ("b", b"A", ""), ("c", b"", "")]
