"""Which token to send, and where it came from (so a refusal can say "missing" or "expired").

Order: an explicit token, then the environment (``EMBEDDING_TOKEN`` for inference,
``EMBEDDING_MANAGEMENT_TOKEN`` for management), then TorchServe's key_file.json (the ``inference``
or ``management`` entry; ``./key_file.json`` by default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Mapping

from settings import KEY_FILE
from torchserve_api.tokens import Token, from_key_file

__all__ = ["Kind", "ENV", "DEFAULT_KEY_FILE", "Token", "from_key_file", "resolve"]

Kind = Literal["inference", "management"]
ENV = {"inference": "EMBEDDING_TOKEN", "management": "EMBEDDING_MANAGEMENT_TOKEN"}
DEFAULT_KEY_FILE = Path(KEY_FILE)


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
