"""The two HTTP transports of the client, TorchServe's own REST API and KServe's v1/v2 protocols, on the HTTP layer
of :mod:`torchserve_api.transport` (sessions, retries, typed errors), and the check of a --url.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import quote, urlsplit

from handler.requests import EMBEDDING_OPTION
from settings import CONFIG_FILE
from torchserve_api.management import check_refusal
from torchserve_api.transport import Http, auth_error, classify, is_loopback, parse_body

from .answers import Result, as_answer, predict_grouped
from .errors import BadImageError, ClientError, UsageError
from .kserve_codec import decode_v1, decode_v2, encode_v1, encode_v2, request_groups
from .tokens import Token

__all__ = ["Http", "KServeTransport", "RestTransport", "auth_error", "check_url", "classify", "is_loopback",
           "parse_body"]


def check_url(url: str, what: str = "--url") -> str:
    """`url` if it is an http(s) URL with a host (and a numeric port, if any); UsageError naming `what` otherwise."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # a bad port, or a malformed [IPv6] host
        parts, port_ok = urlsplit(""), False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise UsageError(f"{what} {url!r}: not an http:// or https:// URL with a host (e.g. http://127.0.0.1:8080)")
    return url


class RestTransport:
    """TorchServe's inference API: POST the image bytes to /predictions/<model>[/<version>]."""

    def __init__(self, base_url: str, model: str, version: str | None, token: Token, http: Http,
                 config: Path = CONFIG_FILE) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.version = version
        self.token = token
        self.http = http
        self.config = config
        path = f"/predictions/{quote(model)}" + (f"/{quote(version)}" if version else "")
        self.url = self.base_url + path

    @property
    def where(self) -> str:
        return urlsplit(self.base_url).netloc or self.base_url

    def _refusal(self, status: int, body: Any) -> ClientError:
        """The typed error for a refusal; a client pointed at the management or metrics port is told so."""
        return check_refusal(classify(status, body, self.token, self.where, self.model, self.version), self.http,
                             self.base_url, "inference", self.config)

    def predict(self, image: bytes, embedding: bool = False) -> dict[str, Any]:
        """The raw image as the body; with ``embedding``, a form of the image and the option's text field
        (TorchServe 0.12 does not pass query parameters to the handler)."""
        if embedding:
            request: dict[str, Any] = {"files": {"data": ("image", image, "application/octet-stream")},
                                       "data": {EMBEDDING_OPTION: "true"}, "headers": self.token.header()}
        else:
            request = {"data": image, "headers": {"Content-Type": "application/octet-stream", **self.token.header()}}
        response = self.http.request("POST", self.url, **request)
        body = parse_body(response)
        if response.status_code != 200:
            raise self._refusal(response.status_code, body)
        return as_answer(body, embedding)

    def predict_batch(self, images: list[bytes], embedding: bool = False) -> list[Result]:
        """Several images per request as a KServe v1 body, which the handler reads on this route too (within the
        limits of :func:`client.kserve_codec.request_groups`); one image alone as its raw bytes."""
        return predict_grouped(images, request_groups(images), lambda group: self._post_v1(group, embedding),
                               lambda image: self.predict(image, embedding))

    def _post_v1(self, images: list[bytes], embedding: bool) -> list[Result]:
        response = self.http.request("POST", self.url, json=encode_v1(images, embedding),
                                     headers={"Content-Type": "application/json", **self.token.header()})
        body = parse_body(response)
        if response.status_code != 200 and not (isinstance(body, dict) and "predictions" in body):
            raise self._refusal(response.status_code, body)
        return decode_v1(body, len(images), embedding)

    def ping(self) -> str:
        response = self.http.request("GET", f"{self.base_url}/ping", headers=self.token.header())
        body = parse_body(response)
        if response.status_code != 200:
            raise self._refusal(response.status_code, body)
        return body.get("status", json.dumps(body)) if isinstance(body, dict) else str(body)

    def close(self) -> None:
        self.http.close()


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
        """Each image's answer, or its BadImageError, in order: all in one request within the limits of
        :func:`client.kserve_codec.request_groups`, one image per request for a group refused as a whole."""
        images = list(images)
        return predict_grouped(images, request_groups(images), lambda group: self._send(group, embedding),
                               lambda image: self.predict(image, embedding))

    def _send(self, images: list[bytes], embedding: bool) -> list[Result]:
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
        (result,) = self._send([image], embedding)
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
