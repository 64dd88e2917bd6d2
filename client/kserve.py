"""KServe's inference protocols: v1 (``:predict`` with instances) and Open Inference v2 (``/infer`` with tensors).

v1 request ``{"instances": [{"data": "<base64 image>"}, ...]}``, answer ``{"predictions": [answer, ...]}``.
Both protocols carry the embedding option in the request's ``parameters`` (``{"embedding": true}``).

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
from typing import Any, Sequence
from urllib.parse import quote, urlsplit

from handler.v2_schema import OUTPUT_FORMAT
from handler.requests import EMBEDDING_OPTION

from .answers import as_answer
from .errors import BadImageError, ClientError, UsageError
from .rest import Http, classify, parse_body
from .tokens import Token

Result = dict[str, Any] | BadImageError


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


class KServeTransport:
    """The same predict/ping interface as the TorchServe transports, over KServe v1 or v2 REST."""

    def __init__(self, protocol: str, base_url: str, model: str, version: str | None, token: Token,
                 http: Http) -> None:
        if protocol not in ("v1", "v2"):
            raise UsageError(f"unknown KServe protocol {protocol!r}: use v1 or v2")
        if protocol == "v1" and version:
            raise UsageError("KServe v1 has no model versions: drop --model-version or use --protocol v2")
        self.protocol = protocol
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.version = version
        self.token = token
        self.http = http
        model_path = f"/v2/models/{quote(model)}" + (f"/versions/{quote(version)}" if version else "")
        self.url = (f"{self.base_url}/v1/models/{quote(model)}:predict" if protocol == "v1"
                    else f"{self.base_url}{model_path}/infer")
        self.ready_url = (f"{self.base_url}/v1/models/{quote(model)}" if protocol == "v1"
                          else f"{self.base_url}{model_path}/ready")

    @property
    def where(self) -> str:
        return urlsplit(self.base_url).netloc or self.base_url

    def predict_batch(self, images: Sequence[bytes], embedding: bool = False) -> list[Result]:
        """All images in one request; each image's answer, or its BadImageError, in order."""
        payload = encode_v1(images, embedding) if self.protocol == "v1" else encode_v2(images, embedding=embedding)
        response = self.http.request("POST", self.url, json=payload,
                                     headers={"Content-Type": "application/json", **self.token.header()})
        body = parse_body(response)
        carries_answers = isinstance(body, dict) and ("predictions" in body or "outputs" in body)
        if response.status_code != 200 and not carries_answers:
            raise classify(response.status_code, body, self.token, self.where, self.model, self.version)
        if self.protocol == "v1":
            return decode_v1(body, len(images), embedding)
        return decode_v2(body, len(images), embedding)

    def predict(self, image: bytes, embedding: bool = False) -> dict[str, Any]:
        (result,) = self.predict_batch([image], embedding)
        if isinstance(result, BadImageError):
            raise result
        return result

    def ping(self) -> str:
        response = self.http.request("GET", self.ready_url, headers=self.token.header())
        body = parse_body(response)
        if response.status_code != 200:
            raise classify(response.status_code, body, self.token, self.where, self.model, self.version)
        if isinstance(body, dict) and body.get("ready") is False:
            return "not ready"
        return "ready"

    def close(self) -> None:
        self.http.close()
