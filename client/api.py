"""``EmbeddingClient``: one interface over TorchServe REST, TorchServe gRPC and KServe v1/v2."""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence
from urllib.parse import urlsplit

from settings import CONFIG_FILE, MODEL_NAME
from torchserve_api.retry import RetryPolicy
from torchserve_api.transport import default_endpoints

from .answers import Result
from .errors import ClientError, UsageError
from .tokens import Token

PROTOCOLS = ("rest", "grpc", "v1", "v2")
Image = bytes | str | Path


class Transport(Protocol):
    def predict(self, image: bytes, embedding: bool = False) -> dict[str, Any]: ...
    def predict_batch(self, images: list[bytes], embedding: bool = False) -> list[Result]: ...
    def ping(self) -> str: ...
    def close(self) -> None: ...


def default_url(protocol: str, config: Path = CONFIG_FILE) -> str:
    """The inference address in `config` for `protocol` (host:port for gRPC)."""
    endpoints = default_endpoints(config)
    if protocol == "grpc":
        return f"127.0.0.1:{endpoints.grpc_inference_port}"
    return endpoints.inference


def check_address(url: str, protocol: str) -> str:
    """`url` if the protocol can use it (``host:port`` for gRPC, an http(s) URL otherwise); UsageError if not."""
    if protocol != "grpc":
        from .rest import check_url

        return check_url(url)
    target = url
    for prefix in ("grpc://", "http://", "https://"):
        target = target.removeprefix(prefix)
    try:
        parts = urlsplit(f"//{target.rstrip('/')}")
        port, host, path = parts.port, parts.hostname, parts.path
    except ValueError:  # a bad port, or a malformed [IPv6] host
        port, host, path = None, None, ""
    if not host or not port or path:
        raise UsageError(f"--url {url!r}: a gRPC address is host:port (e.g. 127.0.0.1:7070)")
    return url


def read_image(image: Image) -> bytes:
    if isinstance(image, bytes):
        return image
    try:
        return Path(image).read_bytes()
    except OSError as exc:
        raise UsageError(f"{image}: cannot read ({exc.strerror})") from None


class EmbeddingClient:
    """Classify images with the served embedding model.

    ``protocol``: ``rest`` (TorchServe /predictions), ``grpc`` (TorchServe gRPC), ``v1``/``v2``
    (KServe). ``url``: the inference base URL (``host:port`` for gRPC); defaults come from
    config.properties. Failures raise the typed errors of :mod:`client.errors`; connection failures
    and 503 are retried ``retries`` times with exponential backoff (``backoff`` seconds; see :mod:`torchserve_api.retry`).
    ``config``: the config.properties whose addresses a wrong-port error names. ``gateway_token``: behind
    Kubeflow's ingress, your Kubeflow token (it becomes the bearer value and the key moves to X-API-Key).
    """

    def __init__(self, url: str | None = None, *, protocol: str = "rest", model: str = MODEL_NAME,
                 version: str | None = None, token: Token | str | None = None, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.2, config: Path = CONFIG_FILE,
                 gateway_token: str | None = None) -> None:
        if protocol not in PROTOCOLS:
            raise UsageError(f"unknown protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")
        if timeout <= 0:
            raise UsageError("timeout must be positive")
        self.protocol = protocol
        self.url = check_address(url or default_url(protocol, config), protocol)
        self.model = model
        self.version = version
        self.token = token if isinstance(token, Token) else Token(token, source="the token argument")
        if gateway_token:  # behind Kubeflow's ingress: the JWT is the bearer, the key goes in X-API-Key
            self.token = replace(self.token, gateway=gateway_token)
        retry = RetryPolicy(retries=max(0, retries), backoff=backoff)
        self.transport: Transport
        if protocol == "grpc":
            from .grpc_client import GrpcTransport

            self.transport = GrpcTransport(self.url, model, version, self.token, timeout, retry, config)
        else:
            from .rest import Http, is_loopback

            http = Http(timeout, retry, trust_env=not is_loopback(self.url))
            if protocol == "rest":
                from .rest import RestTransport

                self.transport = RestTransport(self.url, model, version, self.token, http, config)
            else:
                from .rest import KServeTransport

                self.transport = KServeTransport(protocol, self.url, model, version, self.token, http)

    def predict(self, image: Image, *, embedding: bool = False) -> dict[str, Any]:
        """The answer for one image (bytes or a path).

        ``embedding=True`` sends the request option: the answer also carries ``embedding`` (the vector)
        and each neighbour's gallery ``id`` (plus ``file`` or ``dataset_index`` when training recorded it).
        """
        return self.transport.predict(read_image(image), embedding)

    def predict_batch(self, images: Sequence[Image], *, embedding: bool = False) -> list[Result]:
        """Each image's answer, or its BadImageError, in order. REST (as a v1 body) and KServe send several images per
        request, gRPC one per call; a request refused as a whole is sent again one image per request, so a bad image
        costs only its own answer."""
        return self.transport.predict_batch([read_image(image) for image in images], embedding)

    def predict_many(self, images: Sequence[Image], concurrency: int = 4,
                     on_done: Callable[[], None] | None = None, *, embedding: bool = False
                     ) -> Iterator[tuple[int, dict[str, Any] | ClientError]]:
        """(index, answer or error) for each image, in completion order, ``concurrency`` requests in flight.

        Per-image errors are yielded, not raised, so the caller decides what stops the run; leaving
        the loop early cancels the requests not yet sent.
        """
        def one(image: Image) -> dict[str, Any] | ClientError:
            try:
                return self.predict(image, embedding=embedding)
            except ClientError as exc:
                return exc

        pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="predict")
        try:
            pending: dict[Future, int] = {}
            queue: Iterator[tuple[int, Image]] = iter(enumerate(images))
            for index, image in queue:  # submit at most `concurrency` at a time, so early exits send no more
                pending[pool.submit(one, image)] = index
                if len(pending) >= max(1, concurrency):
                    break
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    index = pending.pop(future)
                    if on_done is not None:
                        on_done()
                    yield index, future.result()
                    nxt = next(queue, None)
                    if nxt is not None:
                        pending[pool.submit(one, nxt[1])] = nxt[0]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def ping(self) -> str:
        return self.transport.ping()

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "EmbeddingClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
