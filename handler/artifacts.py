"""Artifact names, checksums and the metadata contract between training and serving."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MODEL_FILE = "model.pt"
INDEX_FILE = "index.faiss"
LABELS_FILE = "labels.json"
METADATA_FILE = "metadata.json"
#: Files whose SHA-256 metadata.json records and the handler verifies before loading anything.
CHECKSUMMED = (MODEL_FILE, INDEX_FILE, LABELS_FILE)


class ArtifactError(Exception):
    """Artifacts are missing, inconsistent or tampered with; the message is one line."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_metadata(directory: Path) -> dict[str, Any]:
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        raise ArtifactError(f"{path}: missing")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None


def verify_artifacts(directory: Path) -> dict[str, Any]:
    """Check every checksummed file against metadata.json; return the metadata when all match."""
    directory = Path(directory)
    metadata = read_metadata(directory)
    recorded = metadata.get("sha256", {})
    for name in CHECKSUMMED:
        path = directory / name
        if not path.is_file():
            raise ArtifactError(f"{path}: missing")
        if name not in recorded:
            raise ArtifactError(f"{METADATA_FILE} records no SHA-256 for {name}")
        actual = sha256_file(path)
        if actual != recorded[name]:
            raise ArtifactError(
                f"{name}: SHA-256 {actual[:12]}… does not match {recorded[name][:12]}… recorded in {METADATA_FILE}"
                " (artifact tampered with or mixed from another run)"
            )
    return metadata
