"""TorchServe's API keys as sent on a request: the key, where it came from, and when it expires.

TorchServe writes ``key_file.json`` (keys ``inference``, ``management`` and ``API``, each with its expiry) into
the directory it was started from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .errors import UsageError


#: The header (gRPC: metadata key, lower case) a serving key travels in beside a gateway's own JWT: behind
#: Kubeflow's Istio ingress, Authorization must hold the Kubeflow token. serving/gateway/auth.py reads it (the
#: serving image holds no client code, so it names it too; tests/unit/test_gateway_auth.py checks both agree).
API_KEY_HEADER = "X-API-Key"


@dataclass(frozen=True)
class Token:
    """The key, and `gateway`: a gateway's bearer token (a Kubeflow JWT) that then takes Authorization, the key
    moving to X-API-Key."""

    value: str | None
    source: str = ""
    expires: datetime | None = None
    gateway: str | None = None

    def header(self) -> dict[str, str]:
        if self.gateway:
            return {"Authorization": f"Bearer {self.gateway}", **({API_KEY_HEADER: self.value} if self.value else {})}
        return {"Authorization": f"Bearer {self.value}"} if self.value else {}

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple((name.lower(), value) for name, value in self.header().items())

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires is not None and self.expires <= (now or datetime.now(timezone.utc))


def _parse_expiry(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def from_key_file(path: Path, kind: str) -> Token:
    """The ``kind`` key (inference, management or API) of a TorchServe key file, with its expiry time when the file
    records one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the key file ({exc.strerror})") from None
    except json.JSONDecodeError:
        raise UsageError(f"{path}: not a TorchServe key file (invalid JSON)") from None
    entry = data.get(kind) if isinstance(data, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        raise UsageError(f"{path}: no {kind!r} key in the key file")
    return Token(entry["key"], source=str(path), expires=_parse_expiry(entry.get("expiration time")))
