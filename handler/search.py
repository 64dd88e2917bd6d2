"""Nearest-neighbour classification over a FAISS gallery: one code path for evaluation and serving."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import faiss
import numpy as np

DEFAULT_K = 5


class GallerySearcher:
    """k-NN vote over a FAISS index of L2-normalised gallery embeddings.

    Distances are Euclidean (0 = identical, 2 = opposite on the unit sphere). The vote weights
    each neighbour by 1/(distance + eps); ``confidence`` is the winning label's share of the
    weight; ``unknown`` is set when even the nearest neighbour lies beyond ``threshold``.
    """

    def __init__(
        self,
        index: faiss.Index,
        labels: Sequence[str],
        k: int = DEFAULT_K,
        threshold: float | None = None,
        search_params: dict[str, Any] | None = None,
    ) -> None:
        if index.ntotal != len(labels):
            raise ValueError(f"index holds {index.ntotal} vectors but labels.json has {len(labels)} labels")
        if not 1 <= k <= index.ntotal:
            raise ValueError(f"k must be between 1 and the gallery size {index.ntotal}, got {k}")
        self.index = index
        self.labels = np.asarray(labels, dtype=object)
        self.k = k
        self.threshold = threshold
        for name, value in (search_params or {}).items():
            faiss.ParameterSpace().set_index_parameter(index, name, value)

    @classmethod
    def from_files(cls, index_path: Path, labels_path: Path, **kwargs: Any) -> "GallerySearcher":
        index = faiss.read_index(str(index_path))
        labels = json.loads(Path(labels_path).read_text())
        return cls(index, labels, **kwargs)

    @property
    def dim(self) -> int:
        return self.index.d

    def neighbours(self, embeddings: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One FAISS search for the whole batch: (Euclidean distances, gallery ids), each (N, k)."""
        queries = np.ascontiguousarray(embeddings, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"expected embeddings of shape (N, {self.dim}), got {queries.shape}")
        squared, ids = self.index.search(queries, k or self.k)
        return np.sqrt(np.maximum(squared, 0.0)), ids

    def classify(self, embeddings: np.ndarray) -> list[dict[str, Any]]:
        """Answer per embedding: pred, dist, confidence, unknown and the k neighbours."""
        distances, ids = self.neighbours(embeddings)
        return [self.answer(d, i) for d, i in zip(distances, ids)]

    def answer(self, distances: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
        """The answer for one query's row of :meth:`neighbours` (its ``neighbours`` are the ids >= 0, in order)."""
        valid = ids >= 0  # approximate indexes may return fewer than k hits
        distances, ids = distances[valid], ids[valid]
        if ids.size == 0:
            return {"pred": None, "dist": None, "confidence": 0.0, "unknown": True, "neighbours": []}
        labels = [str(label) for label in self.labels[ids]]
        weights: dict[str, float] = defaultdict(float)
        for label, dist in zip(labels, distances):
            weights[label] += 1.0 / (float(dist) + 1e-6)
        # Ties go to the label met first, i.e. the nearest neighbour's.
        pred = max(weights, key=lambda lab: (weights[lab], -labels.index(lab)))
        top = float(distances[0])
        return {
            "pred": pred,
            "dist": round(top, 6),
            "confidence": round(weights[pred] / sum(weights.values()), 6),
            "unknown": bool(self.threshold is not None and top > self.threshold),
            "neighbours": [{"label": lab, "dist": round(float(d), 6)} for lab, d in zip(labels, distances)],
        }
