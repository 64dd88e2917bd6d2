"""Which token to send, and where it came from (so a refusal can say "missing" or "expired").

Order: an explicit token, then the environment (``EMBEDDING_TOKEN`` for inference,
``EMBEDDING_MANAGEMENT_TOKEN`` for management), then a key file: the one given, else that of the server at the
URL when a project command started it on this machine (torchserve_api.instances, from any directory), else
``./key_file.json``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Literal, Mapping

from settings import KEY_FILE
from torchserve_api.instances import for_address
from torchserve_api.tokens import Token, from_key_file

__all__ = ["Kind", "ENV", "GATEWAY_ENV", "DEFAULT_KEY_FILE", "Token", "from_key_file", "key_file_for", "resolve"]

Kind = Literal["inference", "management"]
ENV = {"inference": "EMBEDDING_TOKEN", "management": "EMBEDDING_MANAGEMENT_TOKEN"}
#: A gateway's bearer token for calls through Kubeflow's ingress (docs/kserve.md).
GATEWAY_ENV = "EMBEDDING_GATEWAY_TOKEN"
DEFAULT_KEY_FILE = Path(KEY_FILE)


def key_file_for(url: str | None) -> Path | None:
    """The key file of the server at `url` on this machine: the one its start recorded, else ./key_file.json when
    there is one. None when the recorded server runs without tokens, or nothing is found."""
    record = for_address(url) if url else None
    if record is not None:
        return Path(record.key_file) if record.key_file else None
    return DEFAULT_KEY_FILE if DEFAULT_KEY_FILE.is_file() else None


def resolve(kind: Kind = "inference", token: str | None = None, key_file: Path | None = None,
            env: Mapping[str, str] | None = None, default_key_file: bool = True, url: str | None = None,
            gateway: str | None = None) -> Token:
    """The token to send; a missing default key file means no token, a missing explicit one is an error.

    `default_key_file`: whether a key file nobody named may be read (only for a server on this machine); `url`:
    the server's address, whose recorded key file comes before ./key_file.json; `gateway`: a gateway's bearer
    token (a Kubeflow JWT; default $EMBEDDING_GATEWAY_TOKEN), which moves the key to X-API-Key."""
    env = os.environ if env is None else env
    found = _key(kind, token, key_file, env, default_key_file, url)
    gateway = gateway or env.get(GATEWAY_ENV) or None
    return replace(found, gateway=gateway) if gateway else found


def _key(kind: Kind, token: str | None, key_file: Path | None, env: Mapping[str, str], default_key_file: bool,
         url: str | None) -> Token:
    if token:
        return Token(token, source="--token")
    if env.get(ENV[kind]):
        return Token(env[ENV[kind]], source=ENV[kind])
    if key_file is not None:
        return from_key_file(key_file, kind)
    found = key_file_for(url) if default_key_file else None
    return from_key_file(found, kind) if found is not None else Token(None)
