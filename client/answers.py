"""The handler's answer schema (handler.answer, the one declaration), checked the same way whatever protocol
carried it."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from handler.answer import Answer, AnswerError

from .errors import BadImageError, ClientError


def as_answer(item: Any, embedding: bool = False) -> dict[str, Any]:
    """One answer dict from a decoded JSON object or a JSON text (KServe envelopes carry answers as text).

    Raises BadImageError for the handler's ``{"error", "status"}`` answers and ClientError for anything
    that is neither. ``embedding``: the embedding option was sent, so the answer must carry the vector.
    """
    if isinstance(item, (bytes, bytearray)):
        item = item.decode("utf-8", errors="replace")
    if isinstance(item, str):
        try:
            item = json.loads(item)
        except json.JSONDecodeError:
            raise ClientError(f"unexpected answer (not JSON): {item[:120]!r}") from None
    if not isinstance(item, dict):
        raise ClientError(f"unexpected answer (not an object): {str(item)[:120]!r}")
    if "error" in item:
        status = item.get("status")
        raise BadImageError(str(item["error"]), status if isinstance(status, int) else 400)
    try:
        typed = Answer.from_json(item)
    except AnswerError as exc:
        raise ClientError(f"unexpected answer ({exc}): {json.dumps(item)[:120]}") from None
    if embedding and typed.embedding is None:
        raise ClientError("the server answered without an embedding: its handler predates the embedding option")
    return item


Result = dict[str, Any] | BadImageError


def predict_each(predict: Callable[[bytes], dict[str, Any]], images: list[bytes]) -> list[Result]:
    """One request per image, in order; a refused image becomes its BadImageError instead of stopping the rest."""
    out: list[Result] = []
    for image in images:
        try:
            out.append(predict(image))
        except BadImageError as exc:
            out.append(exc)
    return out


def predict_grouped(images: list[bytes], groups: Iterable[list[int]],
                    send_many: Callable[[list[bytes]], list[Result]],
                    predict: Callable[[bytes], dict[str, Any]]) -> list[Result]:
    """Each group of image indexes in one request (`send_many`), a group of one with `predict`.

    A group the server refuses as a whole (a 4xx for the request, so no image's own answer) is sent again one image
    per request, so that the image at fault is named and the others are answered.
    """
    out: list[Result] = []
    for group in groups:
        chosen = [images[i] for i in group]
        if len(chosen) == 1:
            out.extend(predict_each(predict, chosen))
            continue
        try:
            out.extend(send_many(chosen))
        except BadImageError:
            out.extend(predict_each(predict, chosen))
    return out
