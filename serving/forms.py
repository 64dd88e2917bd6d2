"""What a body labelled ``application/x-www-form-urlencoded`` is, decided once for every front of the handler.

``curl -d @digit.png`` and ``--data-binary @digit.png`` label any body a URL-encoded form. TorchServe's frontend
parses such a body with Netty's form decoder before the handler runs and answers 500, with the body's bytes in the
message, to much of what it cannot decode. The fronts before it (the gateway of the container and of the python
runtime, and the local TorchServe's front, :mod:`serving.front`) apply two rules first:

- a form-labelled body that is not ASCII is image bytes (a URL-encoded form is ASCII): it goes on as
  ``application/octet-stream`` (:func:`relabelled`);
- an ASCII form that does not decode (a ``%`` that is no ``%XX`` escape, a field without a name) is the caller's
  error: 400 with :class:`FormError`'s reason.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote_to_bytes

FORM = "application/x-www-form-urlencoded"
OCTET_STREAM = "application/octet-stream"
_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
#: (field name, value, the content type TorchServe's frontend gives a form field: none)
Param = tuple[str, bytes, str]


class FormError(ValueError):
    """A form body that cannot be decoded (answered 400 with this message)."""


def refusal(exc: FormError) -> bytes:
    """The 400 body for `exc`, shaped as the handler's own refusals."""
    return json.dumps({"error": str(exc), "status": 400}).encode()


def checked(content_type: str, body: bytes) -> str | None:
    """The Content-Type to send `body` on with (:func:`relabelled`: None keeps the client's); FormError for a
    form that cannot be decoded."""
    relabel = relabelled(content_type, body)
    if relabel is None and is_form(content_type) and body:
        urlencoded_params(body)
    return relabel


def is_form(content_type: str) -> bool:
    """Whether a Content-Type header labels the body a URL-encoded form (parameters ignored)."""
    return content_type.split(";")[0].strip().lower() == FORM


def relabelled(content_type: str, body: bytes) -> str | None:
    """The Content-Type to send `body` on with: application/octet-stream for bytes labelled as a form that no form
    can be; None to keep the client's."""
    return OCTET_STREAM if is_form(content_type) and not body.isascii() else None


def _form_decode(text: bytes) -> bytes:
    if _ESCAPE.search(text):
        raise FormError("the URL-encoded body holds a % that is no %XX escape: send images as "
                        "application/octet-stream (curl -T image.png) or as -F data=@image.png")
    return unquote_to_bytes(text.replace(b"+", b" "))


def urlencoded_params(body: bytes) -> list[Param]:
    """The fields of an ``application/x-www-form-urlencoded`` body as TorchServe's frontend gives them (``+`` and
    ``%XX`` decoded to bytes; a trailing field without ``=`` dropped, one before it kept with an empty value);
    FormError where TorchServe's decoder would answer 500."""
    segments = body.split(b"&")
    params: list[Param] = []
    for position, segment in enumerate(segments):
        name, equals, value = segment.partition(b"=")
        if not equals and position == len(segments) - 1:
            continue
        if not name:
            raise FormError("the URL-encoded body has a field without a name")
        params.append((_form_decode(name).decode("latin-1"), _form_decode(value), ""))
    return params
