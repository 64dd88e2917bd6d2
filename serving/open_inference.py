"""The transport side of KServe v1 and Open Inference v2 REST, as KServe's and Triton's clients speak it.

The handler (:mod:`handler.protocols`) reads and writes the JSON bodies; this module, used by the gateway
(:mod:`serving.gateway.app`), makes what clients actually send into such a body and back:

- the body of ``/v1/models/<m>:predict`` and ``/v2/models/<m>/infer`` is the protocol's JSON whatever its
  ``Content-Type`` (KServe's ``InferenceRESTClient`` sends none, which TorchServe would take for image
  bytes), as KServe's own model server reads it;
- Open Inference's binary tensor extension: with an ``Inference-Header-Content-Length: n`` header the body is
  n bytes of JSON followed by the raw tensors of the inputs whose ``parameters`` give ``binary_data_size``,
  in input order. Raw tensors become JSON ``data`` for the handler: BYTES elements (each a little-endian
  uint32 length, then the bytes: here the image file) become base64 text, numbers become lists;
- binary outputs on request: the request parameter ``binary_data_output`` (all outputs) and an output's
  own ``binary_data`` parameter (that output, overriding it) move the answer's tensors out of the JSON into
  raw bytes after it, with ``binary_data_size`` and the ``Inference-Header-Content-Length`` header set.

Only the standard library: the gateway process stays small.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from typing import Any, Mapping

HEADER_LENGTH = "Inference-Header-Content-Length"
#: struct codes of the fixed-size Open Inference datatypes (little-endian on the wire).
STRUCT_CODES = {"BOOL": "?", "UINT8": "B", "UINT16": "H", "UINT32": "I", "UINT64": "Q", "INT8": "b",
                "INT16": "h", "INT32": "i", "INT64": "q", "FP16": "e", "FP32": "f", "FP64": "d"}


class ProtocolError(Exception):
    """A body the protocol cannot carry; ``status`` is the HTTP code of the refusal."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def json_object(data: bytes, what: str) -> dict[str, Any]:
    """A JSON object body, or a ProtocolError saying what was expected."""
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise ProtocolError(f"{what} body is not JSON: send the protocol's JSON (any Content-Type), or for v2 "
                            f"the binary tensor extension with an {HEADER_LENGTH} header") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} body must be a JSON object")
    return body


def _header_length(value: str, size: int) -> int:
    if not re.fullmatch(r"[0-9]+", value.strip()):  # str.isdigit also takes "²", which int() refuses
        raise ProtocolError(f"{HEADER_LENGTH} must be a non-negative integer, got {ascii(value)[:40]}")
    length = int(value)
    if length > size:
        raise ProtocolError(f"{HEADER_LENGTH} is {length} but the body has only {size} bytes")
    return length


def _bytes_elements(raw: bytes, where: str) -> list[bytes]:
    """A raw BYTES tensor: each element a little-endian uint32 length followed by that many bytes."""
    elements, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise ProtocolError(f"input {where}: raw BYTES tensor ends inside an element's 4-byte length")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ProtocolError(f"input {where}: raw BYTES element of {length} bytes runs past the tensor's end")
        elements.append(raw[offset:offset + length])
        offset += length
    return elements


def _raw_to_data(raw: bytes, datatype: Any, where: str) -> list:
    """Raw tensor bytes -> the JSON ``data`` list the handler reads (BYTES elements as base64 text)."""
    if datatype == "BYTES":
        return [base64.b64encode(e).decode("ascii") for e in _bytes_elements(raw, where)]
    code = STRUCT_CODES.get(datatype) if isinstance(datatype, str) else None
    if code is None:
        raise ProtocolError(f"input {where}: datatype {ascii(datatype)[:40]} has no binary form")
    size = struct.calcsize(code)
    if len(raw) % size:
        raise ProtocolError(f"input {where}: {len(raw)} bytes is not a whole number of {datatype} values")
    return list(struct.unpack(f"<{len(raw) // size}{code}", raw))


def read_v2(data: bytes, header_length: str | None) -> tuple[dict[str, Any], bool]:
    """A v2 request body -> (its JSON with every input's ``data`` inline, whether anything was converted).

    Without ``header_length`` the body is all JSON (whatever its Content-Type) and no input may name a
    ``binary_data_size``; with it, the raw tensors after the JSON must add up exactly to the rest of the body.
    """
    length = len(data) if header_length is None else _header_length(header_length, len(data))
    body = json_object(data[:length], "Open Inference v2")
    inputs = body.get("inputs")
    if not isinstance(inputs, list):
        return body, False  # the handler refuses it with its own message
    offset, converted = length, False
    for position, tensor in enumerate(inputs):
        parameters = tensor.get("parameters") if isinstance(tensor, dict) else None
        if not isinstance(parameters, dict) or "binary_data_size" not in parameters:
            continue
        where = ascii(tensor.get("name", position))[:60]
        size = parameters["binary_data_size"]
        if header_length is None:
            raise ProtocolError(f"input {where} gives binary_data_size but the request has no {HEADER_LENGTH} "
                                "header")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProtocolError(f"input {where}: binary_data_size must be a non-negative integer")
        if "data" in tensor:
            raise ProtocolError(f"input {where} has both data and binary_data_size")
        if offset + size > len(data):
            raise ProtocolError(f"input {where}: binary_data_size {size} runs past the end of the body")
        tensor["data"] = _raw_to_data(data[offset:offset + size], tensor.get("datatype"), where)
        tensor["parameters"] = {k: v for k, v in parameters.items() if k != "binary_data_size"}
        offset += size
        converted = True
    if offset != len(data):
        raise ProtocolError(f"the body has {len(data) - offset} bytes after the JSON that no input's "
                            "binary_data_size accounts for")
    return body, converted


def binary_outputs(request: Mapping[str, Any]) -> tuple[bool, dict[str, bool]]:
    """(all outputs binary by default, per-output choice) from ``binary_data_output`` and ``binary_data``."""
    parameters = request.get("parameters")
    default = parameters.get("binary_data_output", False) if isinstance(parameters, dict) else False
    chosen: dict[str, bool] = {}
    outputs = request.get("outputs")
    for output in outputs if isinstance(outputs, list) else []:
        own = output.get("parameters") if isinstance(output, dict) else None
        if isinstance(own, dict) and "binary_data" in own and isinstance(output.get("name"), str):
            chosen[output["name"]] = own["binary_data"] is True
    return default is True, chosen


def _flat(data: Any) -> list:
    out: list = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _to_raw(values: list, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for value in values:
            element = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            parts += [struct.pack("<I", len(element)), element]
        return b"".join(parts)
    code = STRUCT_CODES[datatype]
    if code in "efd":
        values = [math.nan if v is None else v for v in values]
    return struct.pack(f"<{len(values)}{code}", *values)


def tensor_data(raw: bytes, datatype: Any, where: str) -> list:
    """One raw tensor (the binary extension's, or Open Inference gRPC's ``raw_input_contents``) -> JSON ``data``."""
    return _raw_to_data(raw, datatype, where)


def tensor_bytes(data: Any, datatype: Any, where: str) -> bytes:
    """An answer's JSON ``data`` (nested or flat) -> the raw tensor: row-major, little-endian, BYTES elements
    length-prefixed (what binary outputs and Open Inference gRPC's ``raw_output_contents`` carry)."""
    if datatype != "BYTES" and datatype not in STRUCT_CODES:
        raise ProtocolError(f"output {where}: datatype {ascii(datatype)[:40]} has no binary form")
    try:
        return _to_raw(_flat(data), datatype)
    except (struct.error, TypeError, ValueError) as exc:
        raise ProtocolError(f"output {where}: data does not fit datatype {datatype}: {exc}", 500) from None


def write_v2(answer: Mapping[str, Any], default: bool, chosen: Mapping[str, bool]) -> tuple[bytes, int | None]:
    """A v2 answer -> (body, JSON length) with the chosen outputs as raw bytes after the JSON.

    The JSON length is None when no output went binary (then the body is plain JSON).
    """
    outputs = answer.get("outputs")
    if not isinstance(outputs, list):
        return json.dumps(answer).encode(), None
    raws: list[bytes] = []
    written = []
    for output in outputs:
        if chosen.get(output.get("name"), default) and output.get("datatype") in (*STRUCT_CODES, "BYTES"):
            raw = _to_raw(_flat(output.get("data", [])), output["datatype"])
            output = {k: v for k, v in output.items() if k != "data"}
            output["parameters"] = {**output.get("parameters", {}), "binary_data_size": len(raw)}
            raws.append(raw)
        written.append(output)
    head = json.dumps({**answer, "outputs": written}).encode()
    if not raws:
        return head, None
    return head + b"".join(raws), len(head)
