"""HTTP to TorchServe: sessions with timeouts and retries, and TorchServe's failures as typed errors.

TorchServe's frontend reports its own failures as ``{"code", "type", "message"}`` (the token check
answers 400 ``InvalidKeyException`` whether the token is missing, wrong or expired); the handler
reports a refused image as ``{"error", "status"}``. ``classify`` turns both into typed errors.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from settings import CONFIG_FILE, REQUEST_TIMEOUT_S, Endpoints, SettingsError, read_properties

from .errors import (AuthError, BadImageError, ClientError, ConnectionFailed, ModelNotFoundError, RequestTimeout,
                     ServerError, UsageError)
from .instances import for_address, is_loopback
from .retry import RetryPolicy
from .tokens import Token

CONNECT_TIMEOUT = 10.0


def default_endpoints(config: Path = CONFIG_FILE) -> Endpoints:
    """The addresses in `config` (the project's config.properties by default); UsageError if it cannot say."""
    try:
        return Endpoints.from_properties(read_properties(config))
    except OSError as exc:
        raise UsageError(f"{config}: cannot read ({exc.strerror}); pass --url or --config") from None
    except SettingsError as exc:
        where = "" if str(exc).startswith(str(config)) else f"{config}: "
        raise UsageError(f"{where}{exc}; pass --url") from None


def auth_error(token: Token, where: str) -> AuthError:
    """Say whether no token was sent, or which one was refused (and whether it is known to have expired)."""
    keys = _recorded_key_file(where)
    if not token.value:
        hint = (f"its keys are in {keys}: pass --key-file {keys}" if keys else "use --token, EMBEDDING_TOKEN or "
                "--key-file with the key_file.json that TorchServe writes in the directory it was started from")
        return AuthError(f"{where} refused the request: no token sent ({hint})", "missing")
    elsewhere = f"; its keys are in {keys}" if keys and keys != token.source else ""
    if token.expired():
        return AuthError(f"{where} refused the token from {token.source}: it expired at "
                         f"{token.expires:%Y-%m-%d %H:%M:%S} UTC (python -m client rotate-token inference, or "
                         f"management, gives a fresh key{elsewhere})",
                         "expired")
    return AuthError(f"{where} refused the token from {token.source}: wrong or expired (tokens expire after "
                     "60 min; the management API needs the management key, inference the inference key"
                     f"{elsewhere})", "refused")


def _recorded_key_file(where: str) -> str | None:
    """The key file of the server at `where` (host:port) when a project command started it on this machine."""

    record = for_address(where)
    return record.key_file if record is not None else None


def parse_body(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def classify(status: int, body: Any, token: Token, where: str, model: str = "", version: str | None = None
             ) -> ClientError:
    """The typed error for a non-2xx answer of TorchServe (frontend or handler) or of a KServe server."""
    body_dict = body if isinstance(body, dict) else {}
    kind = body_dict.get("type", "")
    message = str(body_dict.get("message") or body_dict.get("error") or (body if isinstance(body, str) else "")
                  ).strip().splitlines()[0:1]
    text = message[0][:300] if message else f"HTTP {status}"
    if kind == "InvalidKeyException" or (status in (401, 403) and kind != "InvalidModelVersionException"):
        return auth_error(token, where)
    if kind in ("ModelNotFoundException", "ModelVersionNotFoundException") or status == 404:
        what = f"model {model!r}" + (f" version {version!r}" if version else "")
        return ModelNotFoundError(f"{what} is not loaded on {where} ({text})", model, version)
    if "error" in body_dict and 400 <= status < 500:  # the handler's answer for this image
        item_status = body_dict.get("status")
        return BadImageError(str(body_dict["error"]), item_status if isinstance(item_status, int) else status)
    if status == 413:
        return BadImageError(f"request too large for {where} (max_request_size): {text}", 413)
    if 400 <= status < 500:
        return BadImageError(text, status)
    if status >= 500:
        return ServerError(f"{where} answered {status}: {text}", status)
    return ClientError(f"unexpected HTTP {status} from {where}: {text}")


class Http:
    """requests with one Session per thread (Sessions are not thread-safe), timeouts and retries."""

    def __init__(self, timeout: float = REQUEST_TIMEOUT_S, retry: RetryPolicy | None = None, trust_env: bool = True) -> None:
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.trust_env = trust_env
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.trust_env = self.trust_env
            adapter = HTTPAdapter(max_retries=self.retry.urllib3())
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            with self._lock:
                self._sessions.append(session)
        return session

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """One call, retried by the session's urllib3 Retry; failures become the typed errors."""
        where = urlsplit(url).netloc
        try:
            response = self.session().request(method, url, timeout=(min(CONNECT_TIMEOUT, self.timeout), self.timeout),
                                              **kwargs)
        except requests.exceptions.ConnectTimeout:
            raise ConnectionFailed(f"cannot connect to {where}: timed out") from None
        except requests.exceptions.ReadTimeout:
            raise RequestTimeout(f"no answer from {where} within {self.timeout:g}s") from None
        except requests.exceptions.ConnectionError as exc:
            reason = "connection refused" if "refused" in str(exc).lower() else f"connection failed ({_root(exc)})"
            raise ConnectionFailed(f"cannot connect to {where}: {reason}") from None
        if response.status_code == 503:
            body = parse_body(response)
            text = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
            raise ServerError(f"{where} unavailable (503): {text}".rstrip(": "), 503)
        return response

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()


def _root(exc: BaseException) -> str:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return type(exc).__name__ + (f": {exc}" if str(exc) else "")
