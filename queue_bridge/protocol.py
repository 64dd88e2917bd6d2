"""Message formats. Requests carry an image as raw bytes or JSON {"data": base64}; answers are JSON.

Nothing here unpickles anything: a body is bytes, JSON or refused.
"""

from __future__ import annotations

import json
from typing import Any

from handler.answer import Refusal
from handler.requests import RequestError, decode_request

from .broker import MAX_BODY_BYTES

RAW_TYPES = ("application/octet-stream", "image/")
JSON_TYPE = "application/json"


def image_from_message(body: bytes, content_type: str | None) -> bytes:
    """Image bytes carried by a request message, or RequestError (becomes an error reply)."""
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(f"request body of {len(body)} bytes is over the {MAX_BODY_BYTES}-byte limit", 413)
    kind = (content_type or "application/octet-stream").split(";")[0].strip().lower()
    if kind == JSON_TYPE or kind.startswith(RAW_TYPES):  # decode_request parses JSON bodies itself
        return decode_request({"body": body}, {"body": kind})
    raise RequestError(f"content type {kind!r} is not accepted: send image bytes "
                       f"(application/octet-stream) or {JSON_TYPE} {{\"data\": \"<base64>\"}}", 415)


def error_answer(message: str, status: int) -> dict[str, Any]:
    """The handler's refusal (handler.answer.Refusal), so queue callers see the same errors as REST callers."""
    return Refusal(message, status).to_json()


def encode_answer(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer, separators=(",", ":")).encode()


def decode_answer(body: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return error_answer(f"reply is not JSON: {body[:100]!r}", 502)
    return answer if isinstance(answer, dict) else error_answer(f"reply is not a JSON object: {answer!r:.100}", 502)
