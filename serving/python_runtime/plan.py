"""What the supervisor tells each worker process: the model, its unpacked versions, the limits and the listeners.

Written once as JSON into the runtime's private directory; every worker reads the same file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: A worker's exit code when it refused the model (the reason is on its stderr): the supervisor does not retry.
EXIT_LOAD_REFUSED = 3


@dataclass(frozen=True)
class VersionPlan:
    """One served version: its name in paths, where its archive is unpacked, and its handler settings."""

    version: str
    model_dir: str
    #: The archive's own version (its manifest's modelVersion), which answers carry.
    archive_version: str
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    model: str
    versions: tuple[VersionPlan, ...]
    default_version: str
    #: Put first on the worker's import path: the archive's own handler package, as TorchServe imports it.
    code_dir: str
    max_request_size: int
    response_timeout_s: float
    max_batch: int
    http_host: str
    http_port: int
    grpc_port: int | None
    grpc_required: bool
    shutdown_delay_s: float
    termination_grace_s: float

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> "Plan":
        data = json.loads(Path(path).read_text())
        data["versions"] = tuple(VersionPlan(**v) for v in data["versions"])
        return cls(**data)
