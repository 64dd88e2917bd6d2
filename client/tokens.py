"""Which token to send, and where it came from (so a refusal can say "missing" or "expired").

Order: an explicit token, then the environment (``EMBEDDING_TOKEN`` for inference,
``EMBEDDING_MANAGEMENT_TOKEN`` for management), then TorchServe's key_file.json (the ``inference``
or ``management`` entry; ``./key_file.json`` by default).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Mapping

from .errors import UsageError

Kind = Literal["inference", "management"]
ENV = {"inference": "EMBEDDING_TOKEN", "management": "EMBEDDING_MANAGEMENT_TOKEN"}
DEFAULT_KEY_FILE = Path("key_file.json")


@dataclass(frozen=True)
class Token:
    value: str | None
    source: str = ""
    expires: datetime | None = None

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.value}"} if self.value else {}

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.value}"),) if self.value else ()

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


def resolve(kind: Kind = "inference", token: str | None = None, key_file: Path | None = None,
            env: Mapping[str, str] | None = None, default_key_file: bool = True) -> Token:
    """The token to send; a missing default key file means no token, a missing explicit one is an error."""
    env = os.environ if env is None else env
    if token:
        return Token(token, source="--token")
    if env.get(ENV[kind]):
        return Token(env[ENV[kind]], source=ENV[kind])
    if key_file is not None:
        return from_key_file(key_file, kind)
    if default_key_file and DEFAULT_KEY_FILE.is_file():
        return from_key_file(DEFAULT_KEY_FILE, kind)
    return Token(None)
