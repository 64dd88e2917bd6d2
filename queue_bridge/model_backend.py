"""How the bridge calls TorchServe, and which failures are the request's fault.

TorchServe is called through the project's `client.EmbeddingClient` (REST or gRPC, typed errors);
`ModelBackend` is the one place that does so. Everything else sees an `Outcome`: an answer to send
back (a prediction or the handler's 4xx error), or a transient reason to try again later.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client import AuthError, BadImageError, ClientError, EmbeddingClient
from client.api import default_url
from torchserve_api.tokens import Token, from_key_file
from settings import KEY_FILE, MODEL_NAME, REPO

from .protocol import error_answer

log = logging.getLogger(__name__)


def default_inference_url(protocol: str = "rest") -> str:
    """$EMBEDDING_INFERENCE_URL, else the address in the project's config.properties."""
    return os.environ.get("EMBEDDING_INFERENCE_URL") or default_url(protocol)


def default_model() -> str:
    return os.environ.get("EMBEDDING_MODEL") or MODEL_NAME


def default_key_file() -> Path:
    """$EMBEDDING_KEY_FILE, else key_file.json where `python -m serving start` writes it."""
    return Path(os.environ.get("EMBEDDING_KEY_FILE") or REPO / KEY_FILE)


class TokenSource:
    """The inference token: fixed ($EMBEDDING_TOKEN or an argument) or read from TorchServe's key file.

    TorchServe writes new keys on every start and they expire after 60 minutes, so a rejected key
    makes the bridge read the file again instead of failing every request until it is restarted.
    """

    def __init__(self, token: str | None = None, key_file: Path | None = None) -> None:
        self._fixed = token or os.environ.get("EMBEDDING_TOKEN") or None
        self.key_file = key_file or default_key_file()

    def read(self) -> Token:
        if self._fixed is not None:
            return Token(self._fixed, source="EMBEDDING_TOKEN")
        try:
            return from_key_file(self.key_file, "inference")
        except ClientError as exc:
            log.warning("no inference token (%s); calling without one", exc)
            return Token(None)


@dataclass(frozen=True)
class Outcome:
    """Either `answer` (send it back, ack) or `retry` (why the request should be tried again)."""

    answer: dict[str, Any] | None = None
    retry: str | None = None


def outcome_of(error: ClientError) -> Outcome:
    """A refused image is the request's fault: answer it. Anything else (TorchServe unreachable,
    busy, 5xx, timeout, token refused, model not loaded) is the deployment's: retry, and let the
    dead-letter queue keep the request if it persists."""
    if isinstance(error, BadImageError):
        return Outcome(answer=error_answer(error.message, error.status))
    return Outcome(retry=f"{type(error).__name__}: {error}")


class ModelBackend:
    """Calls the model with `EmbeddingClient`; thread-safe, never raises.

    The client's own retries are off: the queue redelivers instead, so attempts are counted in one
    place (`x-delivery-count`) and a failing request does not hold a bridge slot through two backoffs.
    """

    def __init__(self, url: str, model: str, tokens: TokenSource, protocol: str = "rest",
                 timeout: float = 30.0) -> None:
        self.url, self.model, self.protocol, self.timeout = url, model, protocol, timeout
        self.tokens = tokens
        self._lock = threading.Lock()
        self._client = self._new_client()
        self._retired: EmbeddingClient | None = None

    def _new_client(self) -> EmbeddingClient:
        return EmbeddingClient(self.url, protocol=self.protocol, model=self.model, token=self.tokens.read(),
                               timeout=self.timeout, retries=0)

    def _refresh_token(self, refused: EmbeddingClient) -> EmbeddingClient:
        """A client with the key file's current token (once per rejected client, whatever the thread count).

        The refused client may still be in use by other threads, so it is closed at the next refresh.
        """
        with self._lock:
            if self._client is refused:
                if self._retired is not None:
                    self._retired.close()
                self._retired, self._client = refused, self._new_client()
            return self._client

    def __call__(self, image: bytes) -> Outcome:
        client = self._client
        try:
            try:
                return Outcome(answer=client.predict(image))
            except AuthError:
                return Outcome(answer=self._refresh_token(client).predict(image))
        except ClientError as exc:
            return outcome_of(exc)
        except Exception as exc:  # a bug or an odd answer must not kill the worker thread
            log.exception("unexpected error calling TorchServe")
            return Outcome(retry=f"unexpected error calling TorchServe: {exc!r}")

    def close(self) -> None:
        for client in (self._client, self._retired):
            if client is not None:
                client.close()
