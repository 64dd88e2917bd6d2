"""Held-out evaluation, open-set threshold calibration and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from handler.preprocessing import normalize
from handler.search import GallerySearcher

#: Share of held-out (in-distribution) queries the open-set threshold must accept.
ACCEPT_QUANTILE = 0.995


def calibrate_threshold(top1_distances: np.ndarray, quantile: float = ACCEPT_QUANTILE) -> float:
    """Distance below which `quantile` of held-out queries fall; beyond it serving says "unknown"."""
    return float(np.quantile(top1_distances, quantile))


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
    """Accuracy, per-class precision/recall and confusion matrix using the serving searcher."""
    answers = searcher.classify(test_embeddings)
    position = {name: i for i, name in enumerate(classes)}
    pred = np.array([position[a["pred"]] for a in answers])
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
        "top1_distances": np.array([a["dist"] for a in answers]),
    }


def open_set_rejection(searcher: GallerySearcher, embed_fn, n: int = 300) -> float:
    """Share of synthetic non-digit images that the calibrated threshold answers as unknown."""
    answers = searcher.classify(embed_fn(normalize(synthetic_non_digits(n))))
    return float(np.mean([a["unknown"] for a in answers]))


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
