"""Enrollment: new classes and more examples in an existing gallery, without retraining.

`python -m training enroll --artifacts DIR --data-source folder:NEW --out DIR2 [--new-only] [--holdout 0.2]`

1. DIR is verified as served (every SHA-256 against metadata.json, the preprocessing version and constants of
   this code, the model's embedding size against the index); DIR is only ever read.
2. NEW/<label>/*.png is read by the folder loader (training/data/folder.py), each image through the serving
   preprocessing (decode_image + to_canvas, as a request with those bytes; then normalize). Per class, ``--holdout`` of the images (the folder loader's deterministic split, at least one, never
   all; none for a class of one image) is held out for calibration, the rest is embedded by DIR's model and
   added to the gallery: a flat or HNSW index gets the new vectors appended; an IVF index is rebuilt from all
   vectors (its centroids were trained without the new images).
3. Class prototypes (handler.search.class_prototypes) are recomputed from the whole new gallery and the
   open-set threshold is recalibrated as training does (training.steps.evaluate_and_finalize): the
   ACCEPT_QUANTILE of the served score over held-out images only, here the original source's held-out split
   (``--calibration-data``, restricted to the classes DIR was trained on and checked against the count
   metadata.json records) plus the held-out share of the new images.
4. When the gallery then holds classes the network was not trained on (this enrollment's or an earlier one's), the
   enrolled-class switch (handler.search.EnrolledSwitch) is fitted: every class's mean, the whitening of the
   trained classes' pooled within-class covariance, and tau, set so that at most SWITCH_BUDGET of the held-out
   trained-class images (``--calibration-data``) would switch; recorded in metadata.json's "enrolled_switch".
5. DIR2 gets the network (model.pt or model.pt2, copied; model.onnx too when DIR's metadata records it),
   index.faiss, labels.json, sources.json, index.json, metrics.json and a metadata.json with new SHA-256s and an
   "enrollment" history, published atomically (staged_directory).

Bad input raises EnrollError with one line before anything is written.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import faiss
import numpy as np

from handler import preprocessing
from handler.artifacts import (
    INDEX_FILE,
    LABELS_FILE,
    METADATA_FILE,
    ONNX_FILE,
    SOURCES_FILE,
    ArtifactError,
    enrolled_switch,
    read_sources,
    open_set_settings,
    sha256_file,
    verify_artifacts,
)
from handler.metadata import Metrics, ModelMetadata
from handler.network import load_network
from handler.search import (
    EnrolledSwitch,
    GallerySearcher,
    class_prototypes,
    gallery_vectors,
)

from .build import staged_directory
from .data import DataError, load_dataset
from .data.sources import parse_source
from .evaluate import (
    ACCEPT_QUANTILE,
    calibrate_threshold,
    cross_fitted_acceptance,
    drift_baseline,
    open_set_rejection,
)
from .index import build_index, default_search_params, recall_at_1
from .outputs import INDEX_INFO_FILE, METRICS_FILE, artifacts_folder, source_reads
from .train import embed

DEFAULT_HOLDOUT = 0.2
#: Files enroll writes itself; everything else checksummed is copied. train.json is copied for the record.
COPIED = ("train.json",)
#: Enrolled-class switch: at most this share of held-out images of the trained classes would switch to an enrolled
#: class (tau's calibration). Offline on Fashion-MNIST (2-epoch models, 10 shots) 0.8% cost the trained classes up
#: to 1.19 points; 0.5% cost them at most 0.51 points on the same embeddings.
SWITCH_BUDGET = 0.005
#: Added to the pooled within-class covariance's diagonal before whitening (embeddings are L2-normalised).
WHITENING_RIDGE = 1e-3


class EnrollError(Exception):
    """Enrollment refused: bad input or artifacts; the message is one line."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def check_artifacts(artifacts: Path) -> ModelMetadata:
    """Metadata of `artifacts` once they verify and were built with this code's preprocessing."""
    try:
        metadata = verify_artifacts(artifacts)
        open_set_settings(metadata)
        enrolled_switch(metadata)
    except ArtifactError as exc:
        raise EnrollError(f"{artifacts}: {_one_line(exc)}") from None
    recorded = {"profile": preprocessing.DIGITS.name, **metadata.preprocessing}  # older: digits
    try:
        current = preprocessing.profile_of(metadata.preprocessing).record()
    except preprocessing.ProfileError as exc:
        raise EnrollError(f"{artifacts}: {_one_line(exc)}") from None
    differing = [key for key, value in current.items() if recorded.get(key) != value]
    if differing:
        raise EnrollError(f"{artifacts}: built with preprocessing {', '.join(f'{k}={recorded.get(k)!r}' for k in differing)}"
                          f", this code's is {', '.join(f'{k}={current[k]!r}' for k in differing)}: new images would "
                          "not be embedded the way the gallery was")
    return metadata


def read_new_images(root: Path, holdout: float, seed: int = 0,
                    profile: preprocessing.Profile = preprocessing.DIGITS) -> dict[str, dict[str, Any]]:
    """label -> {"canvases", "files", "gallery" (positions), "held_out" (positions)} of a folder:DIR, every image
    decoded and preprocessed as served; DataError names the first bad file or empty class folder."""
    from .data.folder import _canvas, _list_images, _split

    if not 0.0 <= holdout < 1.0:
        raise DataError(f"--holdout must be in [0, 1), got {holdout}")
    out = {}
    for label, paths in _list_images(Path(root)).items():
        # The folder loader's canvas is the served one: decode_image + to_canvas of the file's bytes, exactly
        # what a request with those bytes gets. (training.steps.prepare_data runs to_canvas over it a second
        # time; to_canvas is not quite idempotent, about 0.3% of pixels move, so that pass is not repeated.)
        canvases = np.stack([_canvas(p, profile) for p in paths])
        if holdout > 0:
            gallery, held = _split(len(paths), holdout, seed, label)
        else:
            gallery, held = np.arange(len(paths)), np.zeros(0, dtype=np.int64)
        out[label] = {"canvases": canvases, "files": [f"{label}/{p.name}" for p in paths],
                      "gallery": np.sort(gallery), "held_out": np.sort(held)}
    return out


def calibration_images(source: str, metadata: ModelMetadata, cache_dir: Path | None) -> tuple[np.ndarray, list[str]]:
    """Held-out canvases and labels of the source DIR was trained on, restricted to its training classes."""
    classes = metadata.classes
    profile = preprocessing.profile_of(metadata.preprocessing)
    dataset = load_dataset(source, cache_dir, profile.name)
    keep = np.array([dataset.classes[int(y)] in classes for y in dataset.test_labels], dtype=bool)
    labels = [dataset.classes[int(y)] for y in dataset.test_labels[keep]]
    expected = metadata.dataset.get("test")
    if not keep.any() or (isinstance(expected, int) and keep.sum() != expected):
        raise DataError(f"--calibration-data {source}: its held-out split has {int(keep.sum())} images of the "
                        f"classes the artifacts were trained on, metadata.json records {expected}: not the data "
                        "they were calibrated on (pass the training source)")
    return profile.canvases_from_arrays(dataset.test_images[keep]), labels


def pooled_whitening(vectors: np.ndarray, labels: list[str], classes: list[str],
                     ridge: float = WHITENING_RIDGE) -> np.ndarray:
    """(D, D) float64 W with W.T @ (S + ridge I) @ W = I, S the pooled within-class covariance of the `classes`'
    vectors (each item minus its class mean)."""
    x = np.asarray(vectors, np.float64)
    y = np.asarray(labels, dtype=object)
    resid = np.concatenate([x[y == c] - x[y == c].mean(axis=0) for c in classes if np.any(y == c)])
    cov = resid.T @ resid / len(resid) + ridge * np.eye(x.shape[1])
    values, vectors_ = np.linalg.eigh(cov)
    return vectors_ / np.sqrt(values)[None, :]


def switch_tau(gaps: np.ndarray, budget: float = SWITCH_BUDGET) -> float:
    """The least tau such that at most `budget` of `gaps` exceed it (the (floor(budget * n) + 1)-th largest gap),
    but never below 0: a query switches only when it is closer to an enrolled class than to every trained one."""
    ordered = np.sort(np.asarray(gaps, np.float64))[::-1]
    return max(float(ordered[min(int(np.floor(budget * len(ordered))), len(ordered) - 1)]), 0.0)


def fit_switch(vectors: np.ndarray, labels: list[str], trained: list[str],
               calibration: np.ndarray) -> tuple[EnrolledSwitch, float] | None:
    """The enrolled-class switch of a gallery (every class's mean; whitening from the `trained` classes' pooled
    covariance; tau from `calibration`, held-out embeddings of trained classes, so that at most SWITCH_BUDGET of
    them switch) and the share of `calibration` that does; None when every class of the gallery is trained."""
    names = list(dict.fromkeys(str(label) for label in labels))
    enrolled = [c for c in names if c not in set(trained)]
    if not enrolled:
        return None
    kept = [c for c in names if c not in enrolled]
    if not kept or not len(calibration):
        raise EnrollError("the enrolled-class switch needs gallery items and held-out images of trained classes")
    y = np.asarray([str(label) for label in labels], dtype=object)
    x = np.asarray(vectors, np.float64)
    means = np.stack([x[y == c].mean(axis=0) for c in names])
    whitening = pooled_whitening(x, list(y), kept)
    probe = EnrolledSwitch(tuple(names), tuple(enrolled), means, whitening, 0.0)
    gaps, _ = probe.gaps(calibration)
    tau = switch_tau(gaps)
    return EnrolledSwitch(tuple(names), tuple(enrolled), means, whitening, tau), float(np.mean(gaps > tau))


def merged_sources(directory: Path, metadata: ModelMetadata, size: int, dataset_name: str,
                   new_files: list[str]) -> tuple[dict[str, Any] | None, bool]:
    """The new sources.json ({"kind", "ids"}) and whether old ids were rewritten: new items are named by their
    file (``<label>/<name>``); a gallery whose items were dataset indexes gets its old ids written as
    ``<dataset>#<index>`` file names so one kind covers both. None when DIR has no sources.json."""
    try:
        old = read_sources(directory, metadata, size)
    except ArtifactError as exc:
        raise EnrollError(_one_line(exc)) from None
    if old is None:
        return None, False
    kind, ids = old
    if kind == "file":
        return {"kind": "file", "ids": [*ids, *new_files]}, False
    return {"kind": "file", "ids": [*(f"{dataset_name}#{i}" for i in ids), *new_files]}, True


@dataclass
class Gallery:
    """The gallery after enrollment: every item's vector and label, the index holding them, its index.json record,
    and the new items' files (their sources.json ids)."""

    index: Any
    labels: list[str]
    vectors: np.ndarray
    info: dict[str, Any]
    new_files: list[str]


@dataclass
class Calibrated:
    """The searcher recalibrated on the held-out images, and what metadata.json and metrics.json record of it."""

    searcher: GallerySearcher
    metrics: dict[str, Any]
    open_set: dict[str, Any]
    baseline: dict[str, Any]
    switch: dict[str, Any] | None
    held: int


def _folder_to_enroll(artifacts: Path, data: str, out: Path) -> Path:
    """The folder of `data` (folder:DIR), once --artifacts and --out are two separate folders."""
    if not artifacts.is_dir():
        raise EnrollError(f"{artifacts}: no such artifact directory")
    src, dst = artifacts.resolve(), out.resolve()
    if dst == src:
        raise EnrollError(f"--out {out} is the --artifacts directory: enrollment never rewrites its input")
    if src in dst.parents or dst in src.parents:
        raise EnrollError(f"--out {out} and --artifacts {artifacts} are nested: publishing one would change the other")
    parsed = parse_source(data)
    if parsed.layout != "folder" or parsed.local_path is None:
        raise EnrollError(f"--data-source {data!r}: enroll reads labelled images from folder:DIR (DIR/<label>/*.png)")
    return parsed.local_path


def _grown_gallery(artifacts: Path, metadata: ModelMetadata, model: Any, profile: preprocessing.Profile,
                   new: dict[str, dict[str, Any]], old_labels: list[str]) -> Gallery:
    """DIR's gallery with the new images' gallery share embedded and added (an IVF index is rebuilt, a flat one
    grows)."""
    index = faiss.read_index(str(artifacts / INDEX_FILE))
    if len(old_labels) != index.ntotal:
        raise EnrollError(f"{artifacts}: {LABELS_FILE} has {len(old_labels)} labels for {index.ntotal} vectors")
    canvases = np.concatenate([item["canvases"][item["gallery"]] for item in new.values()])
    add_vectors = embed(model, profile.normalize(canvases))
    if add_vectors.shape[1] != index.d:
        raise EnrollError(f"{artifacts}: model embeds into {add_vectors.shape[1]} dimensions but the index holds "
                          f"{index.d}")
    labels = [*old_labels, *(label for label, item in new.items() for _ in item["gallery"])]
    vectors = np.concatenate([gallery_vectors(index), add_vectors]).astype(np.float32)
    info = dict(metadata.index)
    kind = info.get("type", "flat")
    build_started = time.perf_counter()
    if kind == "ivf":
        index = build_index(vectors, "ivf", metadata.seed)
    else:
        index.add(np.ascontiguousarray(add_vectors, dtype=np.float32))
    info.update(rebuilt=kind == "ivf", size=int(index.ntotal), build_seconds=time.perf_counter() - build_started,
                search_params=info.get("search_params", default_search_params(kind)))
    new_files = [item["files"][i] for item in new.values() for i in item["gallery"]]
    return Gallery(index, labels, vectors, info, new_files)


def _recalibrated(gallery: Gallery, metadata: ModelMetadata, model: Any, profile: preprocessing.Profile,
                  calibration: tuple[np.ndarray, list[str]], new: dict[str, dict[str, Any]],
                  calibration_data: str) -> Calibrated:
    """The served searcher over `gallery`: the recorded open-set score, an enrolled-class switch when new classes
    came in, and the threshold recalibrated on the source's held-out split plus the new images' held-out share."""
    settings = open_set_settings(metadata)
    score, kth = settings["score"], settings["kth"]
    prototypes, names = None, None
    if score == "prototype_distance":
        names, prototypes = class_prototypes(gallery.vectors, gallery.labels)
    searcher = GallerySearcher(gallery.index, gallery.labels, k=metadata.k, score=score, kth=kth,
                               prototypes=prototypes, search_params=gallery.info["search_params"])
    cal_canvases, cal_labels = calibration
    held = np.concatenate([cal_canvases, *(item["canvases"][item["held_out"]] for item in new.values())])
    held_y = [*cal_labels, *(label for label, item in new.items() for _ in item["held_out"])]
    held_emb = embed(model, profile.normalize(held))
    if gallery.info.get("type", "flat") != "flat":
        gallery.info["recall_at_1"] = recall_at_1(gallery.index, gallery.vectors, held_emb)
    n_cal = len(cal_labels)
    fitted = fit_switch(gallery.vectors, gallery.labels, metadata.classes, held_emb[:n_cal])
    switch_record = None
    if fitted is not None:
        searcher.switch, switched_share = fitted
        switch_record = {**searcher.switch.record(), "budget": SWITCH_BUDGET, "ridge": WHITENING_RIDGE,
                         "calibration": {"source": calibration_data, "n": n_cal, "switched": switched_share}}
    answers = searcher.classify(held_emb)
    scores = searcher.scores(held_emb)
    searcher.threshold = calibrate_threshold(scores)
    correct = np.array([a.pred == y for a, y in zip(answers, held_y)], dtype=bool)
    new_correct = correct[n_cal:]
    metrics = {
        "accuracy": float(correct.mean()),
        "accuracy_original_held_out": float(correct[:n_cal].mean()),
        "accuracy_new_held_out": float(new_correct.mean()) if new_correct.size else None,
        "new_held_out_unknown": float(np.mean(scores[n_cal:] > searcher.threshold)) if new_correct.size else None,
        "open_set_rejection": open_set_rejection(searcher, lambda x: embed(model, x)),
    }
    open_set = dict(metadata.open_set)
    open_set.update(threshold=searcher.threshold, calibration={
        "split": "test+enroll_holdout", "n": int(len(scores)), "accept_quantile": ACCEPT_QUANTILE,
        "accepted_cross_fitted": cross_fitted_acceptance(scores), "source": calibration_data, "source_test": n_cal,
        "enrolled_held_out": {label: int(len(item["held_out"])) for label, item in new.items()}})
    if prototypes is not None:
        open_set["prototypes"] = {"labels": names, "vectors": prototypes.tolist()}
    top1 = np.array([a.dist if a.dist is not None else np.inf for a in answers])
    baseline = drift_baseline(top1, searcher.threshold, split="test+enroll_holdout")
    baseline["unknown_rate"] = float(np.mean(scores > searcher.threshold))
    return Calibrated(searcher, metrics, open_set, baseline, switch_record, len(scores))


def _publish(staging: Path, artifacts: Path, metadata: ModelMetadata, gallery: Gallery, calibrated: Calibrated,
             sources: dict[str, Any] | None) -> ModelMetadata:
    """Write the enrolled artifacts into `staging` with metadata.json's new checksums, and verify them as served."""
    for name in COPIED:
        if (artifacts / name).is_file():
            shutil.copy2(artifacts / name, staging / name)
    faiss.write_index(gallery.index, str(staging / INDEX_FILE))
    (staging / LABELS_FILE).write_text(json.dumps(gallery.labels))
    if sources is not None:
        (staging / SOURCES_FILE).write_text(json.dumps(sources))
    (staging / INDEX_INFO_FILE).write_text(json.dumps(gallery.info, indent=2))
    (staging / METRICS_FILE).write_text(json.dumps(calibrated.metrics, indent=2))
    onnx = [ONNX_FILE] if ONNX_FILE in metadata.sha256 else []  # verified with DIR
    for name in (metadata.model_file, *onnx):
        shutil.copy2(artifacts / name, staging / name)
    checksummed = [metadata.model_file, INDEX_FILE, LABELS_FILE, *([SOURCES_FILE] if sources is not None else []),
                   *onnx]
    metadata = metadata.replace(sha256={name: sha256_file(staging / name) for name in checksummed})
    metadata.write(staging)
    verify_artifacts(staging)
    return metadata


def enroll_artifacts(artifacts: Path, data: str, out: Path, new_only: bool = False,
                     holdout: float = DEFAULT_HOLDOUT, calibration_data: str | None = None,
                     cache_dir: Path | None = None, log: Callable[[str], None] = print) -> ModelMetadata:
    """Enroll folder `data` into a copy of `artifacts` published at `out`; return the new metadata."""
    artifacts, out = Path(artifacts), Path(out)
    started = time.perf_counter()
    root = _folder_to_enroll(artifacts, data, out)
    reads = [artifacts, root, *source_reads(calibration_data, cache_dir)]
    artifacts_folder(out, reads=reads)  # before any work; staged_directory checks again
    metadata = check_artifacts(artifacts)
    dataset_name = metadata.dataset_name
    calibration_data = calibration_data or (dataset_name if dataset_name == "mnist-sample" else None)
    if not calibration_data:
        raise EnrollError(f"{artifacts} was trained on {dataset_name!r}: pass --calibration-data with that source "
                          "so the open-set threshold is recalibrated on its held-out split")
    profile = preprocessing.profile_of(metadata.preprocessing)
    new = read_new_images(root, holdout, profile=profile)
    old_labels = [str(label) for label in json.loads((artifacts / LABELS_FILE).read_text())]
    existing = sorted(set(new) & set(old_labels))
    if new_only and existing:
        raise EnrollError(f"{root}: label {existing[0]!r} already exists in {artifacts} (--new-only)")
    calibration = calibration_images(calibration_data, metadata, cache_dir)

    model = load_network(artifacts / metadata.model_file, metadata.model_format, metadata.quantization,
                         embedding_dim=metadata.embedding_dim)
    gallery = _grown_gallery(artifacts, metadata, model, profile, new, old_labels)
    calibrated = _recalibrated(gallery, metadata, model, profile, calibration, new, calibration_data)
    sources, rewritten = merged_sources(artifacts, metadata, len(old_labels), dataset_name, gallery.new_files)
    added = {label: int(len(item["gallery"])) for label, item in new.items()}
    held_out = calibrated.open_set["calibration"]["enrolled_held_out"]
    record = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "from": str(artifacts.resolve()),
              "from_metadata_sha256": sha256_file(artifacts / METADATA_FILE), "data": data, "new_only": new_only,
              "holdout": holdout, "added": added, "held_out": held_out,
              "new_labels": sorted(set(new) - set(old_labels)), "existing_labels": existing,
              "sources_rewritten": rewritten, "seconds": None}
    new_meta = metadata.replace(created=record["created"], index=gallery.info, open_set=calibrated.open_set,
                                metrics=Metrics(calibrated.metrics["accuracy"],
                                                calibrated.metrics["open_set_rejection"]),
                                drift_baseline=calibrated.baseline, enrollment=(*metadata.enrollment, record),
                                enrolled_switch=calibrated.switch)  # an earlier enrollment's switch: recomputed
    reads += source_reads(calibration_data, cache_dir)  # the recorded source, when it was not given
    with staged_directory(out, reads, "python -m training enroll") as staging:
        record["seconds"] = round(time.perf_counter() - started, 3)
        new_meta = _publish(staging, artifacts, new_meta, gallery, calibrated, sources)
    searcher, switch, n_cal = calibrated.searcher, calibrated.switch, len(calibration[1])
    log(f"enrolled {sum(added.values())} images ({', '.join(f'{k}: {v}' for k, v in added.items())}) into "
        f"{gallery.index.ntotal} gallery items; {searcher.score} threshold {searcher.threshold:.4f} recalibrated on "
        f"{calibrated.held} held-out images ({n_cal} from {calibration_data}, {sum(held_out.values())} new)"
        + ("" if switch is None else
           f"; enrolled-class switch for {', '.join(switch['enrolled'])} at tau {switch['tau']:.3f} "
           f"({switch['calibration']['switched']:.2%} of the {n_cal} trained-class held-out images switch)"))
    return new_meta
