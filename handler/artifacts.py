"""Artifact names, checksums and the metadata contract between training and serving, and the two helpers that
let training and ./archive.sh publish their output atomically and say truthfully what an interrupt left."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .metadata import METADATA_FILE, MODEL_FILES, SWITCH_SECTION, ArtifactError, ModelMetadata, read_metadata

if TYPE_CHECKING:
    from .search import EnrolledSwitch

#: The float network (TorchScript); the int8 one is model.pt2 (metadata.MODEL_FILES, ModelMetadata.model_file).
MODEL_FILE = MODEL_FILES["torchscript"]
INDEX_FILE = "index.faiss"
LABELS_FILE = "labels.json"
#: Per gallery item, where training took it from: {"kind": "file" | "dataset_index", "ids": [...]}.
SOURCES_FILE = "sources.json"
#: The same network as model.pt exported to ONNX, for the optional onnxruntime runtime (handler.runtime).
ONNX_FILE = "model.onnx"
#: Files whose SHA-256 metadata.json records and the handler verifies before loading anything, besides the network's
#: own file (required_files).
CHECKSUMMED = (INDEX_FILE, LABELS_FILE)
#: Checksummed when present: artifacts trained before sources.json existed load and serve without it, and
#: model.onnx is only written when training had onnx/onnxruntime installed.
OPTIONAL_CHECKSUMMED = (SOURCES_FILE, ONNX_FILE)
#: What a neighbour's source id is called in answers, per kind of sources.json.
SOURCE_KEYS = {"file": "file", "dataset_index": "dataset_index"}


def path_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path`, None if absent: publishing by rename puts a new inode there, so this changes."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def remove_tree(path: Path) -> None:
    """rmtree that finishes even when Ctrl-C arrives during it, so no half-deleted directory is left."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except KeyboardInterrupt:
        shutil.rmtree(path, ignore_errors=True)
        raise


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def open_set_settings(metadata: ModelMetadata) -> dict[str, Any]:
    """The served open-set rule: {"score", "kth", "threshold", "prototypes"} from metadata.json's "open_set".

    Artifacts trained before that section existed carry only "threshold", a top-1 distance: they are served as
    before. A score this handler does not implement, or a malformed section, is an ArtifactError.
    """
    from .search import OPEN_SET_SCORES

    section = metadata.open_set
    score, kth, threshold = section.get("score"), section.get("kth", 1), section.get("threshold")
    if score not in OPEN_SET_SCORES:
        raise ArtifactError(f"{METADATA_FILE}: open-set score {score!r} is not one this handler implements "
                            f"({', '.join(OPEN_SET_SCORES)})")
    if not isinstance(kth, int) or isinstance(kth, bool) or kth < 1:
        raise ArtifactError(f"{METADATA_FILE}: open_set.kth must be a positive integer, got {kth!r}")
    if threshold is not None and (not isinstance(threshold, (int, float)) or isinstance(threshold, bool)):
        raise ArtifactError(f"{METADATA_FILE}: open_set.threshold must be a number, got {threshold!r}")
    prototypes = None
    if score == "prototype_distance":
        import numpy as np

        try:
            prototypes = np.asarray(section["prototypes"]["vectors"], dtype=np.float32)
        except (KeyError, TypeError, ValueError):
            raise ArtifactError(f"{METADATA_FILE}: open_set.prototypes.vectors must be a list of equal-length "
                                "number lists for prototype_distance") from None
        if prototypes.ndim != 2 or not prototypes.size or not np.isfinite(prototypes).all():
            raise ArtifactError(f"{METADATA_FILE}: open_set.prototypes.vectors must be a non-empty finite matrix")
    return {"score": score, "kth": kth, "threshold": None if threshold is None else float(threshold),
            "prototypes": prototypes}


def required_files(metadata: ModelMetadata) -> tuple[str, ...]:
    """The checksummed files every build holds: the network in the format metadata.json names, index, labels."""
    return (metadata.model_file, *CHECKSUMMED)


def verify_artifacts(directory: Path) -> ModelMetadata:
    """Check every checksummed file against metadata.json; return the metadata when all match."""
    directory = Path(directory)
    metadata = read_metadata(directory)
    recorded = metadata.sha256
    for name in required_files(metadata):
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
    for name in MODEL_FILES.values():
        if name != metadata.model_file and (directory / name).exists():
            raise ArtifactError(f"{directory / name}: present, but {METADATA_FILE} names {metadata.model_file} "
                                f"({metadata.model_format}) as the network (mixed from another build?)")
    for name in OPTIONAL_CHECKSUMMED:
        path = directory / name
        if name in recorded:
            if not path.is_file():
                raise ArtifactError(f"{path}: missing ({METADATA_FILE} records its SHA-256)")
            if sha256_file(path) != recorded[name]:
                raise ArtifactError(f"{name}: SHA-256 does not match the one recorded in {METADATA_FILE} "
                                    "(artifact tampered with or mixed from another run)")
        elif path.exists():
            raise ArtifactError(f"{path}: present but {METADATA_FILE} records no SHA-256 for it "
                                "(added after training?)")
    return metadata


def quantization(metadata: ModelMetadata) -> str:
    """``int8`` when the network is quantized (``python -m training --quantize int8``), else ``none``."""
    return str(metadata.quantization.get("scheme", "none"))


def artifact_files(metadata: ModelMetadata) -> tuple[str, ...]:
    """The checksummed files these artifacts hold: the required ones, and the optional ones they record."""
    recorded = metadata.sha256
    return (*required_files(metadata), *(name for name in OPTIONAL_CHECKSUMMED if name in recorded))


def read_sources(directory: Path, metadata: ModelMetadata, size: int) -> tuple[str, list[str | int]] | None:
    """(kind, one id per gallery item) from a verified sources.json; None for artifacts without one."""
    if SOURCES_FILE not in metadata.sha256:
        return None
    path = Path(directory) / SOURCES_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: cannot read ({exc})") from None
    kind = data.get("kind") if isinstance(data, dict) else None
    ids = data.get("ids") if isinstance(data, dict) else None
    if kind not in SOURCE_KEYS or not isinstance(ids, list):
        raise ArtifactError(f'{path}: expected {{"kind": "file" | "dataset_index", "ids": [...]}}')
    if len(ids) != size:
        raise ArtifactError(f"{path}: {len(ids)} ids for a gallery of {size} items")
    wanted = str if kind == "file" else int
    if not all(isinstance(i, wanted) and not isinstance(i, bool) for i in ids):
        raise ArtifactError(f"{path}: {kind} ids must all be {wanted.__name__}s")
    return kind, ids


def enrolled_switch(metadata: ModelMetadata) -> EnrolledSwitch | None:
    """The enrolled-class switch metadata.json records, or None (galleries without enrolled classes, and those
    enrolled before the switch existed: they answer by the vote alone). A malformed section is an ArtifactError."""
    import numpy as np

    from .search import SWITCH_RULE, EnrolledSwitch

    section = metadata.enrolled_switch
    if section is None:
        return None
    where = f"{METADATA_FILE}: {SWITCH_SECTION}"
    if section.get("rule") != SWITCH_RULE:
        raise ArtifactError(f"{where}.rule {section.get('rule')!r} is not one this handler implements ({SWITCH_RULE})")
    labels, enrolled, tau = section.get("labels"), section.get("enrolled"), section.get("tau")
    if not (isinstance(labels, list) and isinstance(enrolled, list)
            and all(isinstance(x, str) for x in [*labels, *enrolled])):
        raise ArtifactError(f"{where}.labels and .enrolled must be lists of class names")
    if not isinstance(tau, (int, float)) or isinstance(tau, bool):
        raise ArtifactError(f"{where}.tau must be a number, got {tau!r}")
    try:
        means = np.asarray(section.get("means"), dtype=np.float64)
        whitening = np.asarray(section.get("whitening"), dtype=np.float64)
        return EnrolledSwitch(tuple(labels), tuple(enrolled), means, whitening, float(tau))
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: {' '.join(str(exc).split())}") from None
