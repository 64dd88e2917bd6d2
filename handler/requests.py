"""Turn one TorchServe request row into image bytes, or a RequestError that becomes a 4xx answer.

Accepted forms:
- raw image bytes as the body (``curl --data-binary @digit.png`` or ``curl -T digit.png``),
- a multipart form with the image in a file field (``curl -F data=@digit.png``),
- JSON ``{"data": "<base64 image>"}`` with ``Content-Type: application/json``,
- a row ``{"data": "<base64 image>"}`` as KServe's v1/v2 envelopes pass each instance.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Mapping

#: Field names tried first in multipart forms; any single file field is accepted otherwise.
FORM_FIELDS = ("data", "file", "image", "body")


class RequestError(ValueError):
    """A request the handler refuses; ``status`` is the HTTP code returned for that request only."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def decode_base64(text: str, what: str = '"data"') -> bytes:
    """Image bytes from base64 text (a data: URI prefix and line breaks allowed)."""
    if text.startswith("data:") and "," in text:  # a data URI: data:image/png;base64,....
        text = text.split(",", 1)[1]
    text = "".join(text.split())  # `base64` wraps its output at 76 columns
    if not text:
        raise RequestError(f"{what} is empty")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{what} is not valid base64") from None


def _from_json(payload: Mapping[str, Any]) -> bytes:
    data = payload.get("data")
    if not isinstance(data, str):
        raise RequestError('JSON body must be {"data": "<base64-encoded image>"}')
    return decode_base64(data)


def _parse_json(data: bytes) -> Mapping[str, Any]:
    """JSON that TorchServe's worker did not parse itself (it only parses exactly application/json)."""
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):
        raise RequestError("body is not valid JSON") from None
    if not isinstance(payload, Mapping):
        raise RequestError('JSON body must be {"data": "<base64-encoded image>"}')
    return payload


def json_body(row: Mapping[str, Any], content_types: Mapping[str, str] | None = None) -> Mapping[str, Any] | None:
    """The row's JSON object body, whether TorchServe parsed it or not; None for anything else."""
    value = row.get("body")
    if isinstance(value, Mapping):
        return value
    content_type = (content_types or {}).get("body", "")
    if isinstance(value, (bytes, bytearray)) and content_type.lower().startswith("application/json"):
        try:
            payload = json.loads(value)
        except (ValueError, RecursionError):
            return None
        return payload if isinstance(payload, Mapping) else None
    return None


def decode_request(row: Mapping[str, Any], content_types: Mapping[str, str] | None = None) -> bytes:
    """Image bytes carried by one request row (TorchServe gives each input field as a key)."""
    content_types = content_types or {}
    if "body" in row:
        value = row["body"]
        content_type = content_types.get("body", "")
        if isinstance(value, Mapping):
            return _from_json(value)
        if isinstance(value, str):
            raise RequestError(f"a {ascii(content_type or 'text')} body is not an image: send image bytes or "
                               'JSON {"data": "<base64>"}', status=415)
        if isinstance(value, (bytes, bytearray)):
            if content_type.lower().startswith("application/json"):
                return _from_json(_parse_json(bytes(value)))
            if not value:
                raise RequestError("empty body: send an image")
            return bytes(value)
        raise RequestError("unsupported request body")
    if isinstance(row.get("data"), str):  # KServe v1/v2 envelopes hand over {"data": "<base64>"}
        return _from_json(row)
    # A form's text fields (no filename) arrive as bytes with an empty content type: they are never the image.
    files = {name: value for name, value in row.items()
             if isinstance(value, (bytes, bytearray)) and content_types.get(name) != ""}
    for name in FORM_FIELDS:
        if name in files:
            return _non_empty(bytes(files[name]), name)
    if len(files) == 1:
        name, value = next(iter(files.items()))
        return _non_empty(bytes(value), name)
    if not row:
        raise RequestError("empty request: send an image as the body, a form file or JSON")
    if files:
        raise RequestError(f"form has several files ({', '.join(ascii(n) for n in sorted(files))}); "
                           "send one, named 'data'")
    raise RequestError("form has no image file field: use -F data=@image.png")


def _non_empty(data: bytes, field: str) -> bytes:
    if not data:
        raise RequestError(f"form field {ascii(field)} is empty")
    return data
