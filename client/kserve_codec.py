"""Request bodies and answers of KServe's v1 and Open Inference v2 protocols, as the client sends and reads them.

v1 request ``{"instances": [{"data": "<base64 image>"}, ...]}``, answer ``{"predictions": [answer, ...]}``.
Both protocols carry the embedding option in the request's ``parameters`` (``{"embedding": true}``). The
handler reads v1 bodies on TorchServe's own ``/predictions`` route too, which is how the REST transport sends
several images in one request.

v2 request: one BYTES input tensor of shape [1] per image, named ``image-<i>``, whose element is the
image's base64 text, with the request parameter ``output_format: json``; answer: output tensors of
datatype BYTES whose elements are the answers as JSON text (or objects). The JSON form, not the typed
outputs the server gives by default (label, distance, ...: for KServe's and Triton's own clients), because
it carries every field of the REST answer with its exact floats. One tensor per image, not one tensor of
shape [n]: TorchServe's ``kservev2`` envelope hands the handler only the first element of each BYTES input
and names each output after its input, so this layout is the one that works behind KServe's TorchServe
runtime and with any server that follows the spec. Outputs are matched to inputs by name when they carry
the input names, else taken in order.

Answers come back as the same dicts as TorchServe's REST API; a per-image refusal comes back as a
``BadImageError`` in that image's place.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any, Iterator, Sequence

from handler.requests import EMBEDDING_OPTION
from handler.v2_schema import OUTPUT_FORMAT

from .answers import Result, as_answer
from .errors import BadImageError, ClientError

#: The most images the handler takes in one request (it answers 413 to more).
MAX_IMAGES_PER_REQUEST = 256
#: Image bytes per request: base64 makes 4/3 of it, well below TorchServe's max_request_size (8 MiB by default).
MAX_REQUEST_BYTES = 4 * 1024 * 1024


def _b64(image: bytes) -> str:
    return base64.b64encode(image).decode("ascii")


def _item(item: Any, embedding: bool = False) -> Result:
    try:
        return as_answer(item, embedding)
    except BadImageError as exc:
        return exc


def _parameters(embedding: bool, **more: Any) -> dict[str, Any]:
    parameters = {**({EMBEDDING_OPTION: True} if embedding else {}), **more}
    return {"parameters": parameters} if parameters else {}


def encode_v1(images: Sequence[bytes], embedding: bool = False) -> dict[str, Any]:
    return {"instances": [{"data": _b64(image)} for image in images], **_parameters(embedding)}


def decode_v1(body: Any, count: int, embedding: bool = False) -> list[Result]:
    predictions = body.get("predictions") if isinstance(body, dict) else None
    if not isinstance(predictions, list):
        raise ClientError(f"not a KServe v1 answer (no predictions list): {str(body)[:120]}")
    if len(predictions) != count:
        raise ClientError(f"KServe v1 answer holds {len(predictions)} predictions for {count} instances")
    return [_item(item, embedding) for item in predictions]


def input_names(count: int) -> list[str]:
    return [f"image-{i}" for i in range(count)]


def encode_v2(images: Sequence[bytes], request_id: str | None = None, embedding: bool = False) -> dict[str, Any]:
    return {
        "id": request_id or str(uuid.uuid4()),
        "inputs": [{"name": name, "shape": [1], "datatype": "BYTES", "data": [_b64(image)]}
                   for name, image in zip(input_names(len(images)), images, strict=True)],
        **_parameters(embedding, **{OUTPUT_FORMAT: "json"}),
    }


def decode_v2(body: Any, count: int, embedding: bool = False) -> list[Result]:
    outputs = body.get("outputs") if isinstance(body, dict) else None
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise ClientError(f"not an Open Inference v2 answer (no outputs list): {str(body)[:120]}")
    for output in outputs:
        if output.get("datatype") != "BYTES" or not isinstance(output.get("data"), list):
            raise ClientError(f"v2 output {output.get('name')!r} is not a BYTES tensor of answers")
    names = input_names(count)
    by_name = {output.get("name"): output for output in outputs}
    if len(outputs) == count and set(by_name) == set(names):
        items = [element for name in names for element in by_name[name]["data"]]
    else:
        items = [element for output in outputs for element in output["data"]]
    if len(items) != count:
        raise ClientError(f"v2 answer holds {len(items)} answers for {count} images")
    return [_item(item, embedding) for item in items]


def request_groups(images: Sequence[bytes], max_images: int = MAX_IMAGES_PER_REQUEST,
                   max_bytes: int = MAX_REQUEST_BYTES) -> Iterator[list[int]]:
    """Consecutive indexes of `images`, grouped so that no request holds more than `max_images` images or
    `max_bytes` image bytes (an image larger than that goes alone)."""
    group: list[int] = []
    size = 0
    for index, image in enumerate(images):
        if group and (len(group) >= max_images or size + len(image) > max_bytes):
            yield group
            group, size = [], 0
        group.append(index)
        size += len(image)
    if group:
        yield group
