"""KServe's inference protocols over TorchServe's own routes, without a request envelope.

TorchServe forwards ``/v1/models/<name>:predict`` and ``/v2/models/<name>/infer`` to the handler like
``/predictions/<name>``, one row per request with the JSON body already parsed. This module reads such a
body into the images it carries and writes the answers back in the same protocol, so every route takes
every format and TorchServe's frontend batching keeps working (its ``kserve``/``kservev2`` envelopes
answer only the first request of a batch).

- KServe v1: ``{"instances": [{"data": "<base64 image>"}, ...]}`` (also ``{"b64": ...}`` or a bare base64
  string per instance) -> ``{"predictions": [answer, ...]}``.
- Open Inference v2: ``{"id": ..., "inputs": [tensor, ...]}`` where a tensor is ``BYTES`` (each element a
  base64 image), ``FP32`` pixels in [0, 1] as torchvision's ``ToTensor`` gives for an MNIST image (light
  strokes on black) or ``UINT8`` pixels in 0..255 as MNIST stores them, shaped ``[28, 28]``,
  ``[N, 28, 28]``, ``[N, 1, 28, 28]``, ``[784]`` or ``[N, 784]`` -> ``{"model_name", "model_version", "id",
  "outputs"}`` with typed outputs holding one row per image, in request order across inputs
  (:data:`V2_OUTPUTS`): ``label`` BYTES, ``distance`` and ``confidence`` FP32, ``unknown`` BOOL,
  ``neighbour_labels`` BYTES and ``neighbour_distances`` FP32 ``[N, k]``; with the embedding option also
  ``embedding`` FP32 ``[N, D]`` and ``neighbour_ids`` INT64 ``[N, k]``. Missing values are JSON ``null``
  (NaN as numpy reads them), missing labels ``""``, missing ids -1. The request's ``outputs`` list picks
  outputs by name (naming ``embedding`` or ``neighbour_ids`` turns the option on). The request parameter
  ``{"output_format": "json"}`` asks for the JSON-text form instead: one BYTES output per input, of the same
  name, whose elements are the answers as JSON text (what the project's own client reads, floats exact).

A pixel tensor skips only decoding: it becomes the uint8 image a PNG of it would decode to and then takes
the same array path of :mod:`handler.preprocessing` that training uses.

Errors: a body that is not a well-formed request of its protocol fails the whole request (4xx,
``{"error": ...}``). An image that cannot be used fails only itself: its place in ``predictions`` (v1)
or its element of the output (v2) holds ``{"error": ..., "status": ...}`` and the others are answered.
The HTTP status is 200 when any image was answered, else the first image's error status. In the typed v2
form a failed image's row holds no answer (label ``""``, ``null`` numbers, ``unknown`` true) and an extra
``error`` BYTES output, present only when an image failed, holds each row's message (``""`` when answered).

The option :data:`handler.requests.EMBEDDING_OPTION` is read from a plain JSON body, a form or gRPC field,
and from the request's ``parameters`` object in v1 and v2; an invalid value refuses the whole request (400).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from .answer import COLUMNS, EMBEDDING_COLUMNS, Answer, Refusal, Result
from .preprocessing import CANVAS
from .v2_schema import OUTPUT_FORMAT, OUTPUT_FORMATS, V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT, V2_OUTPUTS
from .requests import (
    EMBEDDING_OPTION,
    RequestError,
    decode_base64,
    decode_request,
    json_body,
    parse_option,
    split_option,
)

#: Most images one request may carry (larger requests get 413): one request must not monopolise a worker.
MAX_IMAGES = 256
PIXELS = CANVAS * CANVAS
Item = bytes | np.ndarray | RequestError


@dataclass
class ProtocolRequest:
    """The images of one request row and how to write their answers back."""

    protocol: str  # "plain", "v1" or "v2"
    items: list[Item]
    #: v2: (input name, number of images) per input tensor, in request order.
    inputs: list[tuple[str, int]] = field(default_factory=list)
    request_id: str | None = None
    error: RequestError | None = None  # the whole request is refused
    #: Answers carry the embedding and the neighbours' gallery ids (the request option).
    embedding: bool = False
    #: v2: "tensors" (typed outputs) or "json" (one BYTES tensor of JSON answers per input).
    output_format: str = "tensors"
    #: v2: the output names the request asked for, in its order; None for all.
    requested: list[str] | None = None


def detect(body: Any) -> str:
    """'v1', 'v2' or 'plain' for a JSON body (or anything else)."""
    if isinstance(body, Mapping):
        if "instances" in body:
            return "v1"
        if "inputs" in body:
            return "v2"
    return "plain"


def read_row(row: Mapping[str, Any], content_types: Mapping[str, str] | None = None) -> ProtocolRequest:
    """One TorchServe request row -> its images, whatever the route and format (never raises for bad input)."""
    try:
        row, field_option = split_option(row)  # a form or gRPC field; never taken for the image
    except RequestError as exc:
        return ProtocolRequest("plain", [exc])
    body = json_body(row, content_types)
    if body is not None and detect(body) != "plain":
        request = parse(body)
        if request.error is None and field_option is not None:
            try:
                request.embedding = _combine(field_option, request_option(body))
            except RequestError as exc:
                request.error, request.items = exc, []
        return request
    try:
        body_option = parse_option(body[EMBEDDING_OPTION]) if body is not None and EMBEDDING_OPTION in body else None
        image = decode_request(row, content_types)
        return ProtocolRequest("plain", [image], embedding=_combine(field_option, body_option))
    except RequestError as exc:
        return ProtocolRequest("plain", [exc])


def _combine(*values: bool | None) -> bool:
    """The option given in one or more places; places that disagree are a 400."""
    given = {v for v in values if v is not None}
    if len(given) > 1:
        raise RequestError(f'"{EMBEDDING_OPTION}" is given twice with different values')
    return given.pop() if given else False


def request_option(body: Mapping[str, Any]) -> bool | None:
    """The option from a v1/v2 body's ``parameters`` object; None when it is not given."""
    parameters = body.get("parameters")
    if parameters is None:
        return None
    if not isinstance(parameters, Mapping):
        raise RequestError('"parameters" must be an object')
    return parse_option(parameters[EMBEDDING_OPTION]) if EMBEDDING_OPTION in parameters else None


def parse(body: Mapping[str, Any]) -> ProtocolRequest:
    """A parsed JSON body of protocol v1 or v2 -> its images (never raises for bad input)."""
    protocol = detect(body)
    try:
        embedding = bool(request_option(body))
        if protocol == "v1":
            return ProtocolRequest("v1", _v1_items(body), embedding=embedding)
        request_id = body.get("id")
        request_id = request_id if isinstance(request_id, str) else None
        output_format = _output_format(body)
        requested = _requested_outputs(body) if output_format == "tensors" else None
        if requested and {name for name, _, _ in V2_EMBEDDING_OUTPUTS} & set(requested):
            embedding = True
        items, inputs = _v2_items(body)
        return ProtocolRequest("v2", items, inputs, request_id, embedding=embedding, output_format=output_format,
                               requested=requested)
    except RequestError as exc:
        return ProtocolRequest(protocol, [], error=exc)


def _output_format(body: Mapping[str, Any]) -> str:
    parameters = body.get("parameters") or {}
    value = parameters.get(OUTPUT_FORMAT, "tensors") if isinstance(parameters, Mapping) else "tensors"
    if value not in OUTPUT_FORMATS:
        raise RequestError(f'invalid value {ascii(value)[:40]} for "{OUTPUT_FORMAT}": use one of '
                           f'{", ".join(OUTPUT_FORMATS)}')
    return value


def _requested_outputs(body: Mapping[str, Any]) -> list[str] | None:
    """The names in the request's ``outputs`` list (None when absent); unknown names are a 400."""
    outputs = body.get("outputs")
    if outputs is None:
        return None
    if not isinstance(outputs, list) or not all(isinstance(o, Mapping) and isinstance(o.get("name"), str)
                                                for o in outputs):
        raise RequestError('"outputs" must be a list of {"name": ...} objects')
    known = [name for name, _, _ in (*V2_OUTPUTS, *V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT)]
    names = [o["name"] for o in outputs]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise RequestError(f"unknown output {ascii(unknown[0])[:60]}: this model's outputs are {', '.join(known)}")
    return names


def _check_count(count: int) -> None:
    if count == 0:
        raise RequestError("the request carries no image")
    if count > MAX_IMAGES:
        raise RequestError(f"too many images in one request: {count} > {MAX_IMAGES}; split the request", 413)


def _v1_items(body: Mapping[str, Any]) -> list[Item]:
    instances = body["instances"]
    if not isinstance(instances, list):
        raise RequestError('"instances" must be a list of {"data": "<base64 image>"}')
    _check_count(len(instances))
    return [_v1_instance(instance, i) for i, instance in enumerate(instances)]


def _v1_instance(instance: Any, index: int) -> Item:
    if isinstance(instance, Mapping):
        value = instance.get("data", instance.get("b64"))
    else:
        value = instance
    if not isinstance(value, str):
        return RequestError(f'instance {index}: expected {{"data": "<base64 image>"}}')
    try:
        return decode_base64(value, f"instance {index}")
    except RequestError as exc:
        return exc


def _v2_items(body: Mapping[str, Any]) -> tuple[list[Item], list[tuple[str, int]]]:
    tensors = body["inputs"]
    if not isinstance(tensors, list) or not tensors:
        raise RequestError('"inputs" must be a non-empty list of tensors')
    items: list[Item] = []
    inputs: list[tuple[str, int]] = []
    for position, tensor in enumerate(tensors):
        if not isinstance(tensor, Mapping):
            raise RequestError(f"input {position} is not a tensor object")
        name = tensor.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(f"input {position} has no name")
        if name in dict(inputs):
            raise RequestError(f"input name {ascii(name)} is used twice")
        images = _v2_tensor(tensor, ascii(name))
        inputs.append((name, len(images)))
        items.extend(images)
        if len(items) > MAX_IMAGES:
            _check_count(len(items))
    _check_count(len(items))
    return items, inputs


def _shape(tensor: Mapping[str, Any], where: str) -> list[int]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise RequestError(f"input {where}: shape must be a list of integers")
    return shape


def _v2_tensor(tensor: Mapping[str, Any], where: str) -> list[Item]:
    datatype = tensor.get("datatype")
    data = tensor.get("data")
    shape = _shape(tensor, where)
    if not isinstance(data, list):
        raise RequestError(f"input {where}: data must be a list")
    if datatype == "BYTES":
        flat = _flatten(data, where)
        if any(d >= 0 for d in shape) and math.prod(max(d, 0) for d in shape) != len(flat):
            raise RequestError(f"input {where}: shape {shape} does not match its {len(flat)} elements")
        out: list[Item] = []
        for i, element in enumerate(flat):
            if not isinstance(element, str):
                out.append(RequestError(f"input {where} element {i}: expected base64 image text"))
                continue
            try:
                out.append(decode_base64(element, f"input {where} element {i}"))
            except RequestError as exc:
                out.append(exc)
        return out
    if datatype in ("FP32", "UINT8"):
        return _pixels(data, shape, where, datatype)
    raise RequestError(f"input {where}: datatype {ascii(datatype)} is not supported: send BYTES (images), "
                       "FP32 (pixels in [0, 1]) or UINT8 (pixels in 0..255)")


def _flatten(data: list, where: str) -> list:
    flat: list = []
    stack = [iter(data)]
    depth_limit = 8
    while stack:
        for element in stack[-1]:
            if isinstance(element, list):
                if len(stack) >= depth_limit:
                    raise RequestError(f"input {where}: data is nested too deeply")
                stack.append(iter(element))
                break
            flat.append(element)
        else:
            stack.pop()
    return flat


def image_count(shape: Sequence[int]) -> int | None:
    """Images in an FP32 or UINT8 pixel tensor of this shape, or None when the shape is not accepted."""
    shape = list(shape)
    if shape[-1:] == [PIXELS]:
        lead = shape[:-1]
    elif shape[-2:] == [CANVAS, CANVAS]:
        lead = shape[:-2]
        if len(lead) == 2 and lead[1] == 1:  # [N, 1, 28, 28]
            lead = lead[:1]
    else:
        return None
    if not lead:
        return 1
    if len(lead) == 1 and lead[0] >= 1:
        return lead[0]
    return None


def _pixels(data: list, shape: list[int], where: str, datatype: str = "FP32") -> list[Item]:
    count = image_count(shape)
    if count is None:
        raise RequestError(f"input {where}: {datatype} shape {shape} is not one of [28, 28], [N, 28, 28], "
                           "[N, 1, 28, 28], [784], [N, 784]")
    if count > MAX_IMAGES:
        _check_count(count)
    flat = _flatten(data, where)
    if len(flat) != count * PIXELS:
        raise RequestError(f"input {where}: shape {shape} needs {count * PIXELS} values, got {len(flat)}")
    if datatype == "UINT8":
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in flat):
            raise RequestError(f"input {where}: UINT8 data must be integers in 0..255")
        return list(np.asarray(flat, dtype=np.uint8).reshape(count, CANVAS, CANVAS))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise RequestError(f"input {where}: FP32 data must be numbers")
    pixels = np.asarray(flat, dtype=np.float64).reshape(count, CANVAS, CANVAS)
    return [_image_from_pixels(image, where, i) for i, image in enumerate(pixels)]


def _image_from_pixels(pixels: np.ndarray, where: str, index: int) -> Item:
    """ToTensor's [0, 1] floats -> the uint8 image they came from (what decoding a PNG of it gives)."""
    if not np.isfinite(pixels).all():
        return RequestError(f"input {where} image {index}: values must be finite (found NaN or infinity)")
    low, high = float(pixels.min()), float(pixels.max())
    if low < 0.0 or high > 1.0:
        return RequestError(f"input {where} image {index}: values must lie in [0, 1] (torchvision ToTensor "
                            f"convention), found {low:g}..{high:g}")
    return np.rint(pixels * 255.0).astype(np.uint8)


def encode(request: ProtocolRequest, answers: Sequence[Result], model_name: str,
           model_version: str | None) -> tuple[int, Any]:
    """(HTTP status, JSON body) for one request, given one answer per image in request order."""
    if request.error is not None:
        return request.error.status, Refusal.of(request.error).to_json()
    if request.protocol == "plain":
        (answer,) = answers
        return answer.status if isinstance(answer, Refusal) else 200, answer.to_json()
    failed = [a for a in answers if isinstance(a, Refusal)]
    status = failed[0].status if answers and len(failed) == len(answers) else 200
    if request.protocol == "v1":
        body: dict[str, Any] = {"predictions": [a.to_json() for a in answers]}
    else:
        if request.output_format == "json":
            outputs, start = [], 0
            for name, count in request.inputs:
                chunk = answers[start:start + count]
                start += count
                outputs.append({"name": name, "datatype": "BYTES", "shape": [count],
                                "data": [json.dumps(a.to_json(), separators=(",", ":")) for a in chunk]})
        else:
            outputs = typed_outputs(answers, request.embedding, request.requested)
        body = {"model_name": model_name, "model_version": model_version, "outputs": outputs}
        if request.request_id is not None:
            body["id"] = request.request_id
    if status != 200:
        body["error"] = failed[0].error
    return status, body


def encode_batch(requests: Sequence[ProtocolRequest], answers: Sequence[Result], model_name: str,
                 model_version: str | None) -> list[tuple[int, str]]:
    """(HTTP status, JSON text) per request of a batch, from the batch's answers in request order: each answer
    carries `model_version` (when the archive names one) and is encoded by :func:`encode`. TorchServe's handler
    and the python runtime answer with this one function."""
    if model_version:
        answers = [replace(a, model_version=model_version) if isinstance(a, Answer) else a for a in answers]
    replies, start = [], 0
    for request in requests:
        status, body = encode(request, answers[start:start + len(request.items)], model_name, model_version)
        start += len(request.items)
        replies.append((status, json.dumps(body)))
    return replies


def typed_outputs(answers: Sequence[Result], embedding: bool = False,
                  requested: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The typed v2 outputs (:data:`handler.answer.COLUMNS`) for answers in request order, data flattened
    row-major.

    ``requested``: output names to return, in that order (None: all); ``error`` is added whenever an image
    failed, asked for or not, so that a row without an answer is never read as one.
    """
    rows = len(answers)
    good = [a for a in answers if isinstance(a, Answer)]
    columns: dict[str, tuple[list, list[int]]] = {}
    for column in (*COLUMNS, *(EMBEDDING_COLUMNS if embedding else ())):
        if not column.shape:
            columns[column.name] = ([column.value(a) if isinstance(a, Answer) else column.missing
                                     for a in answers], [rows])
            continue
        values = [column.value(a) if isinstance(a, Answer) else [] for a in answers]
        width = max((len(v) for v, a in zip(values, answers) if isinstance(a, Answer)), default=0)
        columns[column.name] = ([x for v in values for x in v + [column.missing] * (width - len(v))],
                                [rows, width])
    names = list(requested) if requested is not None else list(columns)
    if len(good) < rows:
        columns["error"] = ([a.error if isinstance(a, Refusal) else "" for a in answers], [rows])
        if "error" not in names:
            names.append("error")
    datatypes = {name: datatype for name, datatype, _ in (*V2_OUTPUTS, *V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT)}
    return [{"name": name, "datatype": datatypes[name], "shape": columns[name][1], "data": columns[name][0]}
            for name in dict.fromkeys(names) if name in columns]
