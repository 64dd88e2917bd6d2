"""Turn one TorchServe request row into image bytes, or a RequestError that becomes a 4xx answer.

Accepted forms:
- raw image bytes as the body (``curl --data-binary @digit.png`` or ``curl -T digit.png``),
- a multipart form with the image in a file field (``curl -F data=@digit.png``),
- JSON ``{"data": "<base64 image>"}`` with ``Content-Type: application/json``,
- a row ``{"data": "<base64 image>"}`` as KServe's v1/v2 envelopes pass each instance.

The request option :data:`EMBEDDING_OPTION` (off by default) adds the embedding and the neighbours' gallery
ids to the answer. It travels as a JSON field beside ``data``, a multipart text field, a gRPC input field,
or in KServe's ``parameters``; TorchServe 0.12 does not hand query-string parameters to the handler.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Mapping

#: Field names tried first in multipart forms; any single file field is accepted otherwise.
FORM_FIELDS = ("data", "file", "image", "body")

#: The one name of the request option that returns the embedding and the neighbours' gallery ids.
EMBEDDING_OPTION = "embedding"
_TRUE, _FALSE = ("true", "1"), ("false", "0")


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
        # curl -d and --data-binary label a body a URL-encoded form, which TorchServe empties when it holds no "=".
        raise RequestError('empty request: send an image as the body, a form file or JSON (with curl -d or '
                           '--data-binary, add -H "Content-Type: application/octet-stream" for image bytes, '
                           '-H "Content-Type: application/json" for JSON)')
    if files:
        raise RequestError(f"form has several files ({', '.join(ascii(n) for n in sorted(files))}); "
                           "send one, named 'data'")
    raise RequestError(_without_file(row))


def _without_file(row: Mapping[str, Any]) -> str:
    """Why a form with no file field is refused. `curl -d` and `--data-binary` label any body a URL-encoded form,
    which TorchServe's frontend splits into fields at "&" and "=": a JSON body arrives as fields named "{...",
    image bytes as fields with unprintable names. Name the call that sends each."""
    names = [str(name) for name in row]
    if names and names[0].lstrip().startswith(("{", "[")):
        return ('a JSON body arrived as a URL-encoded form (what curl -d sends without a Content-Type): add '
                '-H "Content-Type: application/json" (here or on /v1/models/<model>:predict), or send the image '
                'file with -F data=@image.png')
    if any("\ufffd" in name or not name.isprintable() for name in names):
        return ("image bytes arrived as a URL-encoded form (what curl -d and --data-binary send without a "
                "Content-Type): send the file with curl -T image.png, or add -H \"Content-Type: "
                "application/octet-stream\", or use -F data=@image.png")
    return "form has no image file field: use -F data=@image.png"


def parse_option(value: Any) -> bool:
    """The option's value: JSON true/false (or 1/0), or the text true/false/1/0 (any case) of a form or gRPC
    field; anything else is a RequestError (400)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = bytes(value).decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value
    if isinstance(text, str) and text.strip().lower() in _TRUE + _FALSE:
        return text.strip().lower() in _TRUE
    shown = ascii(text)[:40] if isinstance(text, (str, int, float)) else f"of type {type(value).__name__}"
    raise RequestError(f'invalid value {shown} for "{EMBEDDING_OPTION}": use true or false')


def split_option(row: Mapping[str, Any]) -> tuple[dict[str, Any], bool | None]:
    """The row without the option's field, and the field's value (None when absent)."""
    if EMBEDDING_OPTION not in row:
        return dict(row), None
    rest = {name: value for name, value in row.items() if name != EMBEDDING_OPTION}
    return rest, parse_option(row[EMBEDDING_OPTION])


def _non_empty(data: bytes, field: str) -> bytes:
    if not data:
        raise RequestError(f"form field {ascii(field)} is empty")
    return data
