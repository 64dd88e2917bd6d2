"""Open an embedding.mar as TorchServe does: unpack it into a private directory, read its manifest
(``MAR-INF/MANIFEST.json``) and the model-config.yaml it packs. The handler core verifies its artifacts' checksums
when it loads them (:func:`handler.artifacts.verify_artifacts`), exactly as under TorchServe.

Only archives of this project's handler are served: the runtime runs the handler core the archive packs
(``handler/``), not an arbitrary handler module.
"""

from __future__ import annotations

import hashlib
import json
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

MANIFEST = "MAR-INF/MANIFEST.json"
#: The handler entry this project's archiver writes into the manifest (serving.archive.HANDLER_ENTRY).
HANDLER_ENTRY = "embedding_handler.py"
#: The handler core's package inside the archive.
HANDLER_PACKAGE = "handler"
#: Modules of the archive's handler package the workers import. An archive packed before handler/metric_names.py
#: existed would import TorchServe's ``ts`` for the metric names, which this runtime does not need installed; one
#: packed before handler/metadata.py hands its metadata.json around as a dict, not the typed ModelMetadata.
RUNTIME_MODULES = ("answer.py", "protocols.py", "service.py", "metric_names.py", "metadata.py")


class ArchiveError(Exception):
    """The archive cannot be served; the message (one line) says why."""


@dataclass(frozen=True)
class Archive:
    """An unpacked model archive: where it is, what its manifest says, and its model-config.yaml."""

    path: Path
    model_dir: Path
    name: str
    version: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def handler_settings(self) -> dict[str, Any]:
        """model-config.yaml's ``handler:`` section (max_image_pixels, threads, device, runtime)."""
        return dict(self.config.get("handler") or {})

    @property
    def batch_size(self) -> int:
        """Most requests one batch answers (model-config.yaml batchSize, as TorchServe batches)."""
        return max(int(self.config.get("batchSize", 1)), 1)

    @property
    def workers(self) -> int | None:
        """model-config.yaml minWorkers, when it names it."""
        value = self.config.get("minWorkers")
        return int(value) if value else None

    def code_digest(self) -> str:
        """SHA-256 over the handler package's files (names and contents): versions that share it run in one
        process."""
        digest = hashlib.sha256()
        package = self.model_dir / HANDLER_PACKAGE
        for path in sorted(p for p in package.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
        return digest.hexdigest()


def _members(archive: zipfile.ZipFile, mar: Path) -> list[zipfile.ZipInfo]:
    """The archive's entries, refused when one would land outside the directory or is a link."""
    members = archive.infolist()
    for info in members:
        parts = PurePosixPath(info.filename).parts
        if info.filename.startswith("/") or ".." in parts or "\\" in info.filename:
            raise ArchiveError(f"{mar}: entry {info.filename!r} would be written outside the model directory")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise ArchiveError(f"{mar}: entry {info.filename!r} is a symbolic link")
    return members


def _manifest(model_dir: Path, mar: Path) -> dict[str, Any]:
    try:
        model = json.loads((model_dir / MANIFEST).read_text())["model"]
        if not isinstance(model, dict):
            raise TypeError
    except FileNotFoundError:
        raise ArchiveError(f"{mar}: no {MANIFEST}: not a model archive (build it with ./archive.sh)") from None
    except (ValueError, KeyError, TypeError):
        raise ArchiveError(f"{mar}: {MANIFEST} is not a model manifest") from None
    if model.get("handler") != HANDLER_ENTRY or not (model_dir / HANDLER_PACKAGE).is_dir():
        raise ArchiveError(f"{mar}: handler {model.get('handler')!r} is not this project's ({HANDLER_ENTRY} with "
                           f"its {HANDLER_PACKAGE}/ package): serve it with TorchServe")
    missing = [name for name in RUNTIME_MODULES if not (model_dir / HANDLER_PACKAGE / name).is_file()]
    if missing:
        raise ArchiveError(f"{mar}: its {HANDLER_PACKAGE}/ package has no {', '.join(missing)}: packed before this "
                           "runtime could serve it; rebuild it with ./archive.sh")
    for key in ("modelName", "modelVersion"):
        if not isinstance(model.get(key), str) or not model[key]:
            raise ArchiveError(f"{mar}: {MANIFEST} names no {key}")
    return model


def open_archive(mar: Path, into: Path) -> Archive:
    """Unpack `mar` into the new directory `into` and read it; ArchiveError (one line) when it cannot be served."""
    mar = Path(mar)
    try:
        with zipfile.ZipFile(mar) as archive:
            members = _members(archive, mar)
            into.mkdir(mode=0o700, parents=True)
            archive.extractall(into, members)
    except FileNotFoundError:
        raise ArchiveError(f"{mar}: no such file") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{mar}: not a readable model archive ({exc})") from None
    model = _manifest(into, mar)
    config: dict[str, Any] = {}
    if model.get("configFile"):
        try:
            config = yaml.safe_load((into / model["configFile"]).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ArchiveError(f"{mar}: its {model['configFile']} cannot be read: {' '.join(str(exc).split())}") \
                from None
        if not isinstance(config, dict):
            raise ArchiveError(f"{mar}: its {model['configFile']} is not a mapping")
    return Archive(mar, into, model["modelName"], model["modelVersion"], config)
