"""Held-out evaluation, open-set threshold calibration and plots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from handler.preprocessing import DEFAULT_MAX_PIXELS, DIGITS, ImageInput, Profile
from handler.search import GallerySearcher

if TYPE_CHECKING:
    from handler.service import EmbeddingService

#: Share of held-out (in-distribution) queries the open-set threshold must accept.
ACCEPT_QUANTILE = 0.995


def calibrate_threshold(top1_distances: np.ndarray, quantile: float = ACCEPT_QUANTILE) -> float:
    """Score below which `quantile` of held-out queries fall; beyond it serving says "unknown"."""
    return float(np.quantile(top1_distances, quantile))


def cross_fitted_acceptance(scores: np.ndarray, quantile: float = ACCEPT_QUANTILE) -> float | None:
    """Share of held-out digits accepted by a threshold calibrated on the other half (even/odd positions, both
    ways, averaged): what the operating point accepts of digits it has not seen. None below 2 queries."""
    scores = np.asarray(scores, dtype=np.float64)
    even = np.arange(len(scores)) % 2 == 0
    if even.sum() < 1 or (~even).sum() < 1:
        return None
    shares = [np.mean(scores[~fold] <= calibrate_threshold(scores[fold], quantile)) for fold in (even, ~even)]
    return float(np.mean(shares))


def auroc(unknown_scores: np.ndarray, known_scores: np.ndarray) -> float:
    """Area under the ROC curve of "score flags unknown" (Mann-Whitney U): the chance that a random unknown
    scores higher than a random known query, ties counting one half. +inf scores are allowed."""
    known = np.sort(np.asarray(known_scores, dtype=np.float64))
    unknown = np.asarray(unknown_scores, dtype=np.float64)
    if known.size == 0 or unknown.size == 0:
        raise ValueError("AUROC needs at least one known and one unknown score")
    below = np.searchsorted(known, unknown, side="left")
    at_or_below = np.searchsorted(known, unknown, side="right")
    return float((below + 0.5 * (at_or_below - below)).sum() / (known.size * unknown.size))


#: Quantiles of held-out top-1 distances recorded in metadata.json as the drift baseline.
BASELINE_QUANTILES = (0.5, 0.9, 0.99)


def drift_baseline(top1_distances: np.ndarray, threshold: float, split: str = "test") -> dict:
    """What in-distribution traffic looks like to the served model: the distribution of held-out top-1
    distances and the share answered "unknown" at the operating threshold. Serving exposes it as metrics
    (EmbeddingBaseline*) so alerts compare live traffic against the model actually loaded."""
    d = np.asarray(top1_distances, dtype=np.float64)
    return {
        "split": split,
        "n": int(d.size),
        "top1_distance": {"mean": float(d.mean()),
                          **{f"p{round(q * 100)}": float(np.quantile(d, q)) for q in BASELINE_QUANTILES}},
        "unknown_rate": float(np.mean(d > threshold)),
    }


def synthetic_non_digits(n: int, seed: int = 0) -> np.ndarray:
    """Canvases that are not digits (uniform noise, blobs, stripes): an open-set sanity probe."""
    rng = np.random.default_rng(seed)
    kinds = []
    yy, xx = np.mgrid[0:28, 0:28]
    for i in range(n):
        kind = i % 3
        if kind == 0:
            img = rng.integers(0, 256, (28, 28))
        elif kind == 1:
            cy, cx, r = rng.uniform(9, 19), rng.uniform(9, 19), rng.uniform(6, 10)
            img = np.where((yy - cy) ** 2 + (xx - cx) ** 2 < r * r, 255, 0)
        else:
            period = int(rng.integers(3, 7))
            img = np.where((xx // period) % 2 == 0, 255, 0) * (np.abs(yy - 14) < 10)
        kinds.append(img)
    return np.asarray(kinds, dtype=np.uint8)


def confusion_matrix(truth: np.ndarray, pred: np.ndarray, n_classes: int) -> np.ndarray:
    matrix = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(matrix, (truth, pred), 1)
    return matrix


def evaluate(searcher: GallerySearcher, test_embeddings: np.ndarray, test_labels: np.ndarray, classes: Sequence[str]) -> dict:
    """Accuracy, per-class precision/recall and confusion matrix using the serving searcher (closed-set: the label
    the neighbours vote for, answered or flagged unknown)."""
    answers = searcher.classify(test_embeddings)
    position = {name: i for i, name in enumerate(classes)}
    pred = np.array([position[a.nearest_label] for a in answers])
    matrix = confusion_matrix(test_labels, pred, len(classes))
    tp = np.diag(matrix).astype(float)
    precision = np.divide(tp, matrix.sum(axis=0), out=np.zeros_like(tp), where=matrix.sum(axis=0) > 0)
    recall = np.divide(tp, matrix.sum(axis=1), out=np.zeros_like(tp), where=matrix.sum(axis=1) > 0)
    return {
        "accuracy": float((pred == test_labels).mean()),
        "per_class": {
            name: {"precision": float(p), "recall": float(r), "support": int(s)}
            for name, p, r, s in zip(classes, precision, recall, matrix.sum(axis=1))
        },
        "confusion_matrix": matrix.tolist(),
        "top1_distances": np.array([a.dist for a in answers]),
    }


def open_set_rejection(searcher: GallerySearcher, embed_fn, n: int = 300, profile: Profile = DIGITS) -> float:
    """Share of synthetic non-digit images that the calibrated threshold answers as unknown (the images are
    canvases already; ``profile`` scales them as the model's inputs)."""
    answers = searcher.classify(embed_fn(profile.normalize(synthetic_non_digits(n))))
    return float(np.mean([a.unknown for a in answers]))


def write_plots(out: Path, history: list[dict], matrix: np.ndarray, classes: Sequence[str],
                embeddings: np.ndarray, labels: np.ndarray) -> list[str]:
    """training_curve.png, confusion_matrix.png and embeddings_2d.png (PCA of test embeddings)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax1 = plt.subplots(figsize=(6, 4))
    epochs = [h["epoch"] for h in history]
    ax1.plot(epochs, [h["loss"] for h in history], color="tab:blue", marker="o")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("ArcFace loss", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(epochs, [h["knn_accuracy"] for h in history], color="tab:red", marker="s")
    ax2.set_ylabel("held-out k-NN accuracy", color="tab:red")
    fig.tight_layout()
    fig.savefig(out / "training_curve.png", dpi=100)
    plt.close(fig)
    written.append("training_curve.png")

    fig, ax = plt.subplots(figsize=(6, 5))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(classes)), classes, rotation=90 if len(classes) > 10 else 0)
    ax.set_yticks(range(len(classes)), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for (i, j), v in np.ndenumerate(matrix):
        if v:
            ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                    color="white" if v > matrix.max() / 2 else "black")
    fig.tight_layout()
    fig.savefig(out / "confusion_matrix.png", dpi=100)
    plt.close(fig)
    written.append("confusion_matrix.png")

    centred = embeddings - embeddings.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    xy = centred @ vt[:2].T
    fig, ax = plt.subplots(figsize=(6, 5))
    scatter = ax.scatter(xy[:, 0], xy[:, 1], c=labels, cmap="tab10", s=4)
    ax.legend(scatter.legend_elements()[0], classes, fontsize=7, loc="best", markerscale=0.8)
    ax.set_title("test embeddings, first two principal components")
    fig.tight_layout()
    fig.savefig(out / "embeddings_2d.png", dpi=100)
    plt.close(fig)
    written.append("embeddings_2d.png")
    return written


#: Unknown sets `python -m training eval --ood` knows. None of them is ever used in training or calibration.
#: uploads: real non-digit images as encoded files (training/uploads.py), reported per category too.
OOD_SETS = ("fashion", "synthetic", "noise", "uploads")
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian package dataset-fashion-mnist
#: Seed of the synthetic and blank/noise sets.
OOD_SEED = 12345


def blank_and_noise(n: int, seed: int = 0) -> np.ndarray:
    """Blank frames (uniform grey levels) and noise (uniform, Gaussian, salt-and-pepper of several densities),
    n raw uint8 (n, 28, 28) images in turn."""
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            img = np.full((28, 28), rng.integers(0, 256))
        elif kind == 1:
            img = rng.integers(0, 256, (28, 28))
        elif kind == 2:
            img = rng.normal(rng.uniform(60, 200), rng.uniform(10, 60), (28, 28)).clip(0, 255)
        else:
            img = (rng.random((28, 28)) < rng.uniform(0.02, 0.3)) * 255
        images.append(img)
    return np.asarray(images, dtype=np.uint8).reshape(n, 28, 28)


def load_ood_set(name: str, fashion_dir: Path = FASHION_DIR, n: int = 1000, seed: int = OOD_SEED
                 ) -> "np.ndarray | list[bytes]":
    """The images of an unknown set: raw uint8 (N, H, W) for Fashion-MNIST's 10,000 test images, the synthetic
    non-digit probe and blank/noise frames (``n`` and ``seed`` size and seed these two); encoded files (PNG/JPEG
    bytes) for the uploads exam, which is always the same (training.uploads.EXAM_SEED). Raises ValueError (one
    line) for an unknown name or missing files."""
    return _load_labelled(name, fashion_dir, n, seed)[0]


def _load_labelled(name: str, fashion_dir: Path, n: int, seed: int
                   ) -> "tuple[np.ndarray | list[bytes], list[str] | None]":
    """load_ood_set's images and, for the uploads exam, each item's category."""
    if name == "fashion":
        from .data import DataError
        from .data.idx import IMAGES_MAGIC, read_idx

        path = Path(fashion_dir) / "t10k-images-idx3-ubyte.gz"
        if not path.is_file() and (Path(fashion_dir) / "t10k-images-idx3-ubyte").is_file():
            path = Path(fashion_dir) / "t10k-images-idx3-ubyte"
        if not path.is_file():
            raise ValueError(f"{path}: Fashion-MNIST test images not found "
                             "(apt-get install dataset-fashion-mnist, or pass --fashion-dir)")
        try:
            return read_idx(path, IMAGES_MAGIC), None
        except DataError as exc:
            raise ValueError(str(exc)) from None
    if name == "synthetic":
        return synthetic_non_digits(n, seed), None
    if name == "noise":
        return blank_and_noise(n, seed), None
    if name == "uploads":
        from .uploads import EXAM_SEED, exam_uploads

        uploads = exam_uploads(EXAM_SEED)
        return [u.data for u in uploads], [u.category for u in uploads]
    raise ValueError(f"unknown --ood set {name!r}; choose from {', '.join(OOD_SETS)}")


def model_inputs(profile: Profile, images: "np.ndarray | Sequence[ImageInput]",
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Model inputs (N, 1, 28, 28) of images through a preprocessing profile: raw uint8 arrays (N, H, W) as training
    reads a dataset, or any sequence of encoded files (bytes), PIL images or 2-D arrays of any size, each as the
    service preprocesses a request (``profile.preprocess``; raises InvalidImageError for one it would refuse)."""
    if isinstance(images, np.ndarray) and images.ndim == 3:
        return profile.normalize(profile.canvases_from_arrays(images))
    if not len(images):
        return np.zeros((0, 1, 28, 28), np.float32)
    return np.stack([profile.preprocess(image, max_pixels) for image in images])


def served_inputs(profile: Profile, images: "np.ndarray | Sequence[ImageInput]",
                  max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[np.ndarray, np.ndarray]:
    """:func:`model_inputs` and, per image, whether the service answers it unknown whatever the model says: no
    ink, or several digits side by side (``Profile.read``)."""
    from handler.preprocessing import is_blank

    read = [profile.read(image, max_pixels) for image in images]
    tensors = np.stack([t for t, _ in read]) if read else np.zeros((0, 1, 28, 28), np.float32)
    return tensors, np.array([several or is_blank(t) for t, several in read], dtype=bool)


def open_set_scores(service: "EmbeddingService", images: "np.ndarray | Sequence[ImageInput]",
                    batch: int = 1024) -> np.ndarray:
    """The served open-set score of images (see :func:`model_inputs`: raw uint8 (N, H, W), or encoded files and
    arrays of any size): the serving preprocessing, model and searcher of an EmbeddingService; +inf for inputs
    without ink or with several digits, which the service always answers as unknown."""
    out = []
    for start in range(0, len(images), batch):
        tensors, unanswerable = served_inputs(service.profile, images[start : start + batch], service.max_pixels)
        out.append(np.where(unanswerable, np.inf, service.searcher.scores(service.embed(tensors))))
    return np.concatenate(out) if out else np.zeros(0)


def evaluate_open_set(artifacts: Path, ood: Sequence[str] = OOD_SETS, data_source: str = "mnist-sample",
                      fashion_dir: Path = FASHION_DIR, n_synthetic: int = 1000) -> dict:
    """Open-set figures of served artifacts: held-out accuracy and digit acceptance at the recorded threshold,
    and per unknown set its AUROC against the held-out digits and the share flagged unknown (for the uploads exam
    per category as well).

    Digits come from `data_source`'s held-out split, the one the threshold was calibrated on: ``accepted`` is
    in-sample, ``accepted_cross_fitted`` the share a threshold calibrated on one half accepts of the other.
    Unknown sets never take part in training or calibration.
    """
    import os
    import platform
    from datetime import datetime, timezone

    from handler.service import EmbeddingService

    from .data import load_dataset

    unknown_names = list(ood)
    for name in unknown_names:
        if name not in OOD_SETS:
            raise ValueError(f"unknown --ood set {name!r}; choose from {', '.join(OOD_SETS)}")
    # Loaded first: a missing set fails before the model loads.
    unknown_sets = {name: _load_labelled(name, fashion_dir, n_synthetic, OOD_SEED) for name in unknown_names}
    service = EmbeddingService.from_dir(Path(artifacts))
    searcher, metadata = service.searcher, service.metadata
    threshold = searcher.threshold
    dataset = load_dataset(data_source, profile=service.profile.name)
    if "classes" in metadata.dataset and [str(c) for c in dataset.classes] != metadata.classes:
        raise ValueError(f"{data_source}: classes differ from the ones the artifacts were trained on")
    if threshold is None:
        raise ValueError(f"{artifacts}: metadata.json records no open-set threshold")
    tensors, unanswerable = served_inputs(service.profile, dataset.test_images)
    embeddings = service.embed(tensors)
    answers = searcher.classify(embeddings)
    accuracy = float(np.mean([a.nearest_label == dataset.classes[y] for a, y in zip(answers, dataset.test_labels)]))
    digit_scores = np.where(unanswerable, np.inf, searcher.scores(embeddings))
    accepted = digit_scores <= threshold
    result = {
        "artifacts": str(artifacts),
        "score": searcher.score,
        "kth": searcher.kth,
        "threshold": threshold,
        "seed": (metadata.training.get("config") or {}).get("seed"),
        "digits": {"source": data_source, "n": int(len(accepted)), "accuracy": accuracy,
                   "accepted": float(accepted.mean()),
                   "accepted_cross_fitted": cross_fitted_acceptance(digit_scores)},
        "unknown": {},
        "machine": {"load_average_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
                    "platform": platform.platform(terse=True),
                    "time": datetime.now(timezone.utc).isoformat(timespec="seconds")},
    }
    for name, (images, categories) in unknown_sets.items():
        scores = open_set_scores(service, images)
        result["unknown"][name] = _flagged(scores, digit_scores, threshold)
        if categories is not None:
            labels = np.asarray(categories)
            result["unknown"][name]["categories"] = {
                category: _flagged(scores[labels == category], digit_scores, threshold)
                for category in dict.fromkeys(categories)}
    return result


def _flagged(scores: np.ndarray, digit_scores: np.ndarray, threshold: float) -> dict:
    """n, AUROC against the digits, share flagged unknown, and the share of those that preprocessing left blank or
    found several digits in (``blank``: always unknown, whatever the model)."""
    return {"n": int(len(scores)), "auroc": auroc(scores, digit_scores), "flagged": float(np.mean(scores > threshold)),
            "blank": float(np.mean(np.isinf(scores)))}
