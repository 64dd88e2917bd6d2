"""A request to TorchServe's inference API as the .mar's handler receives it: the row and the content types that
TorchServe 0.12's frontend (Netty) and its Python worker make of it.

The handler (:func:`handler.protocols.read_row`) reads rows, not HTTP requests; for its answers to be TorchServe's,
the row must be TorchServe's. Measured against TorchServe 0.12 (tests/integration/test_runtime_conformance.py):

- the body becomes one parameter ``body`` whose content type is the Content-Type's media type (parameters cut);
- a ``multipart/form-data`` body with a boundary becomes one parameter per part: a part with a filename keeps its
  bytes and media type (``application/octet-stream`` when it names none), a text field becomes its UTF-8 text as
  bytes with the content type ``""``; a body without the boundary holds no part;
- an ``application/x-www-form-urlencoded`` body becomes one ``""``-typed parameter per ``name=value``
  (:func:`serving.forms.urlencoded_params`);
- the worker then parses an ``application/json`` parameter's UTF-8 text as JSON and decodes a ``text/*`` one to
  ``str``, keeping the bytes when that fails; a later parameter of the same name replaces an earlier one;
- the handler reads a parameter's content type only when no request header has the parameter's name.

Where TorchServe's form decoder answers 500 (a %-escape that is none, an empty field name), this runtime answers
400 with the reason (:class:`FormError`): bad input is the caller's error.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from serving.forms import FormError, Param, is_form, urlencoded_params
from serving.gateway.backend import InferenceCall

#: Header names TorchServe's worker sees beside the client's: what the gateway's HTTP client adds, and TorchServe's.
ADDED_HEADERS = ("Host", "Accept", "Accept-Encoding", "User-Agent", "Content-Length", "explain", "url_path")
DEFAULT_FILE_TYPE = "application/octet-stream"


def header(headers: Mapping[str, str], name: str) -> str:
    """A header's value, its name matched case-insensitively; "" when absent."""
    wanted = name.lower()
    return next((value for key, value in headers.items() if key.lower() == wanted), "")


def multipart_boundary(content_type: str) -> str | None:
    """The boundary of a ``multipart/form-data`` Content-Type; None for any other type or without one."""
    media, *params = (part.strip() for part in content_type.split(";"))
    if media.lower() != "multipart/form-data":
        return None
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "boundary" and value.strip().strip('"'):
            return value.strip().strip('"')
    return None


def _disposition(lines: list[bytes]) -> tuple[str, str | None, str]:
    """(field name, filename or None, media type) from a part's header lines."""
    fields: dict[str, str] = {}
    media = ""
    for line in lines:
        name, _, value = line.decode("utf-8", "replace").partition(":")
        if name.strip().lower() == "content-disposition":
            for item in value.split(";")[1:]:
                key, _, val = item.strip().partition("=")
                fields[key.strip().lower()] = val.strip().strip('"')
        elif name.strip().lower() == "content-type":
            media = value.split(";")[0].strip()
    if "name" not in fields:
        raise FormError("a multipart part names no field (Content-Disposition: form-data; name=...)")
    return fields["name"], fields.get("filename"), media


def multipart_params(body: bytes, boundary: str) -> list[Param]:
    """The parts of a multipart body as TorchServe's frontend gives them to the worker."""
    delimiter = b"--" + boundary.encode("latin-1", "replace")
    start = body.find(delimiter)
    params: list[Param] = []
    while start >= 0 and not body.startswith(b"--", start + len(delimiter)):
        head_start = body.find(b"\r\n", start) + 2
        head_end = body.find(b"\r\n\r\n", head_start - 2)
        if head_start < 2 or head_end < 0:
            raise FormError("a multipart part has no blank line after its headers")
        end = body.find(b"\r\n" + delimiter, head_end + 4)
        if end < 0:
            raise FormError("a multipart part does not end with the boundary")
        name, filename, media = _disposition(body[head_start:head_end].split(b"\r\n"))
        content = body[head_end + 4:end]
        if filename is None:
            params.append((name, content.decode("utf-8", "replace").encode("utf-8"), ""))
        else:
            params.append((name, content, media or DEFAULT_FILE_TYPE))
        start = end + 2
    return params


def worker_value(value: bytes, content_type: str) -> Any:
    """What TorchServe's Python worker hands the handler for a parameter of this content type."""
    if content_type == "application/json":
        try:
            return json.loads(value.decode("utf-8"))
        except Exception:  # the worker forwards the bytes on any failure (RecursionError included)
            return value
    if content_type.startswith("text"):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def request_row(call: InferenceCall) -> tuple[dict[str, Any], dict[str, str]]:
    """(row, content types) of `call` as the handler receives them under TorchServe; FormError for a form body
    that cannot be decoded."""
    content_type = header(call.headers, "Content-Type")
    media = content_type.split(";")[0].strip()
    boundary = multipart_boundary(content_type)
    if boundary is not None:
        params = multipart_params(call.body, boundary)
    elif is_form(media):
        params = urlencoded_params(call.body)
    else:
        params = [("body", call.body, media)]
    row: dict[str, Any] = {}
    types: dict[str, str] = {}
    for name, value, param_type in params:
        row[name] = worker_value(value, param_type)
        types[name] = param_type
    hidden = {*call.headers, *ADDED_HEADERS}
    return row, {name: value for name, value in types.items() if name not in hidden}
