"""What the training commands write where the user points them, and which existing paths they may replace.

An artifact folder (``python -m training --out``, ``training enroll --out``) replaces only a folder it made before:
one holding owned_paths' marker of ARTIFACTS_KIND (written into the staging folder, so it is published with the
build), or one from before the marker whose every entry is an artifact name (ARTIFACT_NAMES). Pages and JSON files
replace only a file with the command's own header. Never the current directory, home, a repository, or anything the
command reads from (owned_paths). Light imports only: the command line checks before torch is
loaded, and pipeline tasks read the file names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from handler.artifacts import INDEX_FILE, LABELS_FILE, METADATA_FILE, ONNX_FILE, SOURCES_FILE
from handler.metadata import MODEL_FILES
from settings import cache_root

from .data.sources import parse_source

#: The owned_paths kind of an artifact folder, and who writes its marker.
ARTIFACTS_KIND = "training-artifacts"
MADE_BY = "python -m training"
TRAIN_FILE = "train.json"
INDEX_INFO_FILE = "index.json"
METRICS_FILE = "metrics.json"
#: The plots training.evaluate.write_plots draws into an artifact folder.
PLOT_FILES = ("training_curve.png", "confusion_matrix.png", "embeddings_2d.png")
#: Every name an artifact folder of training or enroll holds: a folder holding only these (made before the marker
#: existed) may be replaced.
ARTIFACT_NAMES = (*MODEL_FILES.values(), ONNX_FILE, INDEX_FILE, LABELS_FILE, SOURCES_FILE, METADATA_FILE, TRAIN_FILE,
                  INDEX_INFO_FILE, METRICS_FILE, *PLOT_FILES)
#: Keys `training eval` writes into its JSON; a file holding them may be replaced by the next evaluation.
EVAL_KEYS = frozenset({"artifacts", "score", "threshold", "digits", "unknown"})


def artifacts_folder(path: Path, flag: str = "--out", reads: Iterable[Path | str | None] = ()) -> Path:
    """`path` if an artifact folder may be published there (owned_paths.replaceable_dir); UsageError otherwise.
    owned_paths is imported here: pipeline tasks import this module for the file names alone."""
    from owned_paths import replaceable_dir

    return replaceable_dir(Path(path), ARTIFACTS_KIND, flag, reads=reads, known=ARTIFACT_NAMES)


def source_reads(source: str | None, cache_dir: Path | None = None) -> list[Path]:
    """What loading `source` reads: its local folder, and the download cache for downloaded and remote sources."""
    if not source:
        return []
    parsed = parse_source(source)
    reads = [parsed.local_path] if parsed.local_path is not None else []
    if parsed.uses_cache:
        reads.append(Path(cache_dir) if cache_dir else cache_root())
    return reads


def is_eval_result(path: Path) -> bool:
    """True for a JSON file `training eval --out` wrote (an object holding its keys)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(value, dict) and EVAL_KEYS <= value.keys()
