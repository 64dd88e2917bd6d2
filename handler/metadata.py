"""metadata.json, the contract between training and serving, read and written through one typed class.

Standard library only: it ships inside the .mar. Training writes it (training.steps, training.enroll), the handler,
the archive builders, the pipeline and the report read it, all through :class:`ModelMetadata`.

Schema versions: 1 is every file written before the field existed (the open-set threshold also at the top level,
"threshold"); 2 records ``schema_version`` and the threshold once, in "open_set"; 3 records ``model_format``, the
form the network is stored in (MODEL_FILES; files of schema 1 and 2 hold a TorchScript model.pt). Old files load; a
file of a newer schema than this code reads is refused with a message that says so, rather than half-understood.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METADATA_FILE = "metadata.json"
SCHEMA_VERSION = 3
#: The network's file per format: the float model is TorchScript; the int8 model an AOTInductor package
#: (torch.export + torchao PT2E, compiled ahead of time: training.quantize).
MODEL_FILES = {"torchscript": "model.pt", "aotinductor": "model.pt2"}
DEFAULT_MODEL_FORMAT = "torchscript"
#: The section holding an enrolled gallery's class switch (handler.search.EnrolledSwitch), written by
#: ``python -m training enroll`` for a gallery with classes the network was not trained on.
SWITCH_SECTION = "enrolled_switch"


class ArtifactError(Exception):
    """Artifacts are missing, inconsistent or tampered with; the message is one line."""


@dataclass(frozen=True)
class Metrics:
    """What training measured on the held-out split and the synthetic non-digits."""

    accuracy: float
    open_set_rejection: float | None = None


@dataclass(frozen=True)
class ModelMetadata:
    """One model's metadata.json. Sections whose shape their own parser checks (open_set: artifacts.
    open_set_settings, preprocessing: profiles.profile_of, drift_baseline: metric_names, enrolled_switch:
    artifacts.enrolled_switch) stay JSON objects here; keys this code does not know are kept in `extra` and written
    back, so nothing a newer minor writer added is lost by a rewrite."""

    k: int
    metrics: Metrics
    sha256: dict[str, str] = field(default_factory=dict)
    created: str = ""
    dataset: dict[str, Any] = field(default_factory=dict)
    embedding_dim: int | None = None
    preprocessing: dict[str, Any] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    open_set: dict[str, Any] = field(default_factory=dict)
    drift_baseline: dict[str, Any] | None = None
    training: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    enrollment: tuple[dict[str, Any], ...] = ()
    enrolled_switch: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    #: How the network is stored (a key of MODEL_FILES).
    model_format: str = DEFAULT_MODEL_FORMAT

    @property
    def model_file(self) -> str:
        """The network's file name in the artifacts directory and the .mar (model.pt or model.pt2)."""
        return MODEL_FILES[self.model_format]

    @property
    def threshold(self) -> float | None:
        """The open-set threshold the model was calibrated with (None: answers are never unknown)."""
        value = self.open_set.get("threshold")
        return None if value is None else float(value)

    @property
    def quantization(self) -> dict[str, Any]:
        """training.quantization: {"scheme": "int8", ...} for a quantized network, else {}."""
        return dict(self.training.get("quantization") or {})

    @property
    def seed(self) -> int:
        return int((self.training.get("config") or {}).get("seed", 0) or 0)

    @property
    def dataset_name(self) -> str:
        return str(self.dataset.get("name", ""))

    @property
    def classes(self) -> list[str]:
        """The classes the network was trained on (enrolled labels are not among them)."""
        return [str(c) for c in self.dataset.get("classes", [])]

    def replace(self, **changes: Any) -> ModelMetadata:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_json(cls, data: object, where: str = METADATA_FILE) -> ModelMetadata:
        """Parse a decoded metadata.json of any schema up to SCHEMA_VERSION; ArtifactError names what is wrong."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{where}: expected a JSON object")
        data = dict(data)
        version = data.pop("schema_version", 1)
        if not _is_int(version) or version < 1:
            raise ArtifactError(f"{where}: schema_version must be a positive integer, got {version!r}")
        if version > SCHEMA_VERSION:
            raise ArtifactError(f"{where}: schema version {version} is newer than this code reads "
                                f"({SCHEMA_VERSION}): serve or read it with the release that trained it")
        legacy_threshold = data.pop("threshold", None)
        open_set = _section(data, "open_set", where)
        if open_set is None:  # schema 1 before the open-set section: a top-1 distance threshold
            open_set = {"score": "top1_distance", "kth": 1, "threshold": legacy_threshold}
        k = data.pop("k", None)
        if not _is_int(k) or k < 1:
            raise ArtifactError(f"{where}: k must be a positive integer, got {k!r}")
        sha256 = _section(data, "sha256", where) or {}
        if not all(isinstance(v, str) for v in sha256.values()):
            raise ArtifactError(f"{where}: sha256 must map file names to hex digests")
        metrics = _section(data, "metrics", where) or {}
        accuracy, rejection = metrics.get("accuracy"), metrics.get("open_set_rejection")
        if not _is_number(accuracy) or not (rejection is None or _is_number(rejection)):
            raise ArtifactError(f"{where}: metrics.accuracy (and open_set_rejection) must be numbers")
        enrollment = data.pop("enrollment", [])
        if not isinstance(enrollment, list) or not all(isinstance(e, dict) for e in enrollment):
            raise ArtifactError(f"{where}: enrollment must be a list of objects")
        dim = data.pop("embedding_dim", None)
        model_format = data.pop("model_format", DEFAULT_MODEL_FORMAT)
        if model_format not in MODEL_FILES:
            raise ArtifactError(f"{where}: model_format must be one of {', '.join(MODEL_FILES)}, got {model_format!r}")
        return cls(
            k=k, metrics=Metrics(float(accuracy), None if rejection is None else float(rejection)), sha256=sha256,
            created=str(data.pop("created", "")), dataset=_section(data, "dataset", where) or {},
            embedding_dim=dim if _is_int(dim) else None, preprocessing=_section(data, "preprocessing", where) or {},
            index=_section(data, "index", where) or {}, open_set=open_set,
            drift_baseline=_section(data, "drift_baseline", where),
            training=_section(data, "training", where) or {}, versions=_section(data, "versions", where) or {},
            enrollment=tuple(enrollment), enrolled_switch=_section(data, SWITCH_SECTION, where), extra=data,
            schema_version=version, model_format=model_format)

    def to_json(self) -> dict[str, Any]:
        """The file's content, schema SCHEMA_VERSION, in a stable key order."""
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION, "created": self.created, "model_format": self.model_format,
            "dataset": self.dataset,
            "embedding_dim": self.embedding_dim, "preprocessing": self.preprocessing, "index": self.index,
            "k": self.k, "open_set": self.open_set, "metrics": dataclasses.asdict(self.metrics),
            "drift_baseline": self.drift_baseline, "training": self.training, "versions": self.versions,
        }
        if self.enrollment:
            out["enrollment"] = list(self.enrollment)
        if self.enrolled_switch is not None:
            out[SWITCH_SECTION] = self.enrolled_switch
        return {**out, **self.extra, "sha256": self.sha256}

    @classmethod
    def read(cls, directory: Path) -> ModelMetadata:
        path = Path(directory) / METADATA_FILE
        if not path.is_file():
            raise ArtifactError(f"{path}: missing")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{path}: not valid JSON ({' '.join(str(exc).split())})") from None
        return cls.from_json(data, str(path))

    def write(self, directory: Path) -> Path:
        """Write metadata.json into `directory` (a staging directory: training publishes it whole)."""
        path = Path(directory) / METADATA_FILE
        path.write_text(json.dumps(self.to_json(), indent=2))
        return path


def read_metadata(directory: Path) -> ModelMetadata:
    """The metadata.json of an artifacts directory (ArtifactError when missing or malformed)."""
    return ModelMetadata.read(directory)


def _section(data: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = data.pop(key, None)
    if value is not None and not isinstance(value, dict):
        raise ArtifactError(f"{where}: {key!r} must be an object")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
