"""What the benchmark serves and searches: artifacts, request images and gallery embeddings.

The serving targets are stated for a 60k gallery, so the full run trains the project's model
(same architecture and preprocessing, fewer epochs) on Fashion-MNIST from Debian's
``dataset-fashion-mnist`` and indexes all 60,000 training images; the result is cached because
training is setup, not a measured figure. Without that package, or in ``--quick`` mode, the given
artifacts (the bundled MNIST sample by default) are served instead, and the report says so.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import faiss
import numpy as np
import torch

from handler import preprocessing
from handler.artifacts import INDEX_FILE, METADATA_FILE
from handler.metadata import ModelMetadata
from handler.network import load_network
from handler.search import gallery_vectors as stored_vectors
from serving.samples import user_digit_png

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
#: Training for the 60k gallery: a subset and few epochs keep setup to a few minutes on 2 cores;
#: the gallery itself holds all 60,000 training images.
FASHION_TRAIN_SUBSET = 20_000
FASHION_EPOCHS = 2
FASHION_SEED = 0
#: Request images are drawn like serving/samples.py: dark strokes on white, enlarged 4x, as a
#: scanned or photographed item would arrive, so preprocessing does its real work (invert, crop, fit).
REQUEST_SCALE = 4

Log = Callable[[str], None]


@dataclass
class ServingData:
    """Artifacts to serve plus the held-out images and embeddings the benchmark sends and searches.

    `variants` maps an index type to an artifact directory with the same model and gallery indexed
    that way (hnsw and ivf next to the flat 60k set), so serving can be compared per index.
    """

    name: str
    description: str
    artifacts: Path
    variants: dict[str, Path]
    images: list[bytes]
    gallery: np.ndarray
    queries: np.ndarray
    setup: dict = field(default_factory=dict)

    def summary(self) -> dict:
        meta = ModelMetadata.read(self.artifacts)
        return {"name": self.name, "description": self.description,
                "artifacts": str(self.artifacts), "variants": {k: str(p) for k, p in self.variants.items()},
                "gallery_size": len(self.gallery), "dim": int(self.gallery.shape[1]),
                "queries": len(self.queries), "request_images": len(self.images),
                "mean_request_bytes": float(np.mean([len(b) for b in self.images])),
                "accuracy": meta.metrics.accuracy, "dataset": meta.dataset_name,
                "setup": self.setup}


def gallery_vectors(artifacts: Path) -> np.ndarray:
    """The gallery embeddings stored in the artifacts' index."""
    return stored_vectors(faiss.read_index(str(artifacts / INDEX_FILE))).astype(np.float32)


def embed_images(artifacts: Path, images: np.ndarray) -> np.ndarray:
    """Embeddings of raw uint8 images through the shared preprocessing and the artifacts' model."""
    meta = ModelMetadata.read(artifacts)
    model = load_network(artifacts / meta.model_file, meta.model_format, meta.quantization,
                         embedding_dim=meta.embedding_dim)
    x = torch.from_numpy(preprocessing.normalize(preprocessing.canvases_from_arrays(images)))
    with torch.inference_mode():
        return torch.cat([model(x[i:i + 256]) for i in range(0, len(x), 256)]).numpy().astype(np.float32)


def _held_out_images(dataset: str) -> np.ndarray:
    if dataset == "fashion-mnist" and FASHION_DIR.is_dir():
        from training.data.idx import load_idx_dir

        return load_idx_dir(FASHION_DIR).test_images
    from training.data.sample import load_mnist_sample

    return load_mnist_sample().test_images


def _fashion_artifacts(cache_dir: Path, log: Log) -> tuple[dict[str, Path], dict]:
    """Flat, HNSW and IVF artifact directories for the 60k Fashion-MNIST gallery, built once and cached."""
    from training.build import staged_directory
    from training.index import INDEX_TYPES
    from training.data import Dataset
    from training.steps import build_gallery, evaluate_and_finalize, prepare_data, train_and_export
    from training.train import TrainConfig

    base = cache_dir / f"fashion-mnist-60k-e{FASHION_EPOCHS}-n{FASHION_TRAIN_SUBSET}-s{FASHION_SEED}"
    variants = {kind: base / kind for kind in INDEX_TYPES}
    info_file = base / "setup.json"
    missing = [kind for kind, path in variants.items() if not (path / METADATA_FILE).is_file()]
    if not missing and info_file.is_file():
        return variants, {**json.loads(info_file.read_text()), "cached": True}
    log(f"setup: building {', '.join(missing)} artifacts for the 60k Fashion-MNIST gallery (model trained on "
        f"{FASHION_TRAIN_SUBSET} images, {FASHION_EPOCHS} epochs); cached in {base}")
    started = time.perf_counter()
    data = prepare_data(f"idx:{FASHION_DIR}")

    def quiet(line: str) -> None:
        log(f"setup: {line}")

    if "flat" in missing:
        rng = np.random.default_rng(FASHION_SEED)
        pick = np.sort(rng.choice(len(data.train_images), FASHION_TRAIN_SUBSET, replace=False))
        subset = Dataset(data.name, data.train_images[pick], data.train_labels[pick], data.test_images[:2000],
                         data.test_labels[:2000], data.classes, profile=data.profile)
        with staged_directory(variants["flat"]) as staging:
            train_and_export(subset, TrainConfig(epochs=FASHION_EPOCHS, seed=FASHION_SEED), staging, log=quiet)
            build_gallery(data, staging, "flat", FASHION_SEED, log=quiet)
            evaluate_and_finalize(data, staging, plots=False, log=quiet)
    for kind in (k for k in missing if k != "flat"):
        with staged_directory(variants[kind]) as staging:
            for name in (ModelMetadata.read(variants["flat"]).model_file, "train.json"):
                shutil.copy2(variants["flat"] / name, staging / name)
            build_gallery(data, staging, kind, FASHION_SEED, log=quiet)
            evaluate_and_finalize(data, staging, plots=False, log=quiet)
    previous = json.loads(info_file.read_text()) if info_file.is_file() else {}
    info = {"train_subset": FASHION_TRAIN_SUBSET, "epochs": FASHION_EPOCHS, "seed": FASHION_SEED,
            "setup_seconds": round(previous.get("setup_seconds", 0.0) + time.perf_counter() - started, 1)}
    info_file.write_text(json.dumps(info))
    return variants, {**info, "cached": False}


def serving_data(artifacts: Path | None, cache_dir: Path, quick: bool, n_images: int, n_queries: int,
                 log: Log) -> ServingData:
    """The 60k Fashion-MNIST set (full run) or the given artifacts (quick run, or no Debian package)."""
    if artifacts is None and not quick and FASHION_DIR.is_dir():
        variants, setup = _fashion_artifacts(cache_dir, log)
        from training.index import resolve_index_type

        # Served as `python -m training` builds a 60k gallery by default; the other kinds are variants.
        primary = variants.pop(resolve_index_type("auto", 60_000))
        name = "fashion-mnist-60k"
        description = (f"Fashion-MNIST (Debian dataset-fashion-mnist): model trained on {FASHION_TRAIN_SUBSET} "
                       f"training images for {FASHION_EPOCHS} epochs, gallery = all 60,000 training images")
    else:
        if artifacts is None:
            raise ValueError("no artifacts: pass --artifacts DIR (e.g. artifacts/ from ./archive.sh)")
        primary, variants, setup = Path(artifacts), {}, {"cached": True}
        meta = ModelMetadata.read(primary)
        dataset = meta.dataset_name or "unknown"
        name = f"{dataset}-{meta.index['size'] // 1000}k"
        description = f"artifacts {artifacts} ({dataset}, {meta.index['type']} index of {meta.index['size']} images)"
        if not quick and not FASHION_DIR.is_dir():
            description += "; Debian's dataset-fashion-mnist is missing, so no 60k Fashion-MNIST gallery"
    held_out = _held_out_images(ModelMetadata.read(primary).dataset_name)
    images = [user_digit_png(img, REQUEST_SCALE) for img in held_out[:n_images]]
    queries = embed_images(primary, held_out[:n_queries])
    return ServingData(name, description, primary, variants, images, gallery_vectors(primary), queries, setup)
