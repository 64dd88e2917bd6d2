"""Nearest-neighbour classification over a FAISS gallery: one code path for evaluation and serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import faiss
import numpy as np

DEFAULT_K = 5
#: Open-set scores (higher = less like the gallery), by the name metadata.json records under "open_set":
#: ``top1_distance``, the nearest neighbour's distance (artifacts without "open_set" use it);
#: ``kth_distance``, the distance to the kth nearest neighbour on the L2-normalised embeddings (Sun et al. 2022,
#: "Out-of-Distribution Detection with Deep Nearest Neighbors", ICML);
#: ``prototype_distance``, the distance to the nearest class prototype, the normalised mean of a class's gallery
#: embeddings (as in prototypical networks, Snell et al. 2017), recorded in metadata.json.
OPEN_SET_SCORES = ("top1_distance", "kth_distance", "prototype_distance")


def gallery_vectors(index: faiss.Index) -> np.ndarray:
    """Every stored vector of a flat, HNSW-flat or IVF-flat index, in id order (float32 (N, D)): exact copies of the
    embeddings that were added."""
    if isinstance(index, faiss.IndexIVF):
        index.make_direct_map()
    return index.reconstruct_n(0, index.ntotal)


def class_prototypes(embeddings: np.ndarray, labels: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(class names, L2-normalised mean embedding per class, float32 (C, D)) of a gallery."""
    labels = np.asarray([str(label) for label in labels], dtype=object)
    names = sorted(set(labels.tolist()))
    means = np.stack([np.asarray(embeddings, np.float64)[labels == name].mean(axis=0) for name in names])
    means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    return names, means.astype(np.float32)


def prototype_distance(embeddings: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    """Euclidean distance from each L2-normalised embedding to its nearest prototype, float64 (N,)."""
    cosine = np.asarray(embeddings, np.float64) @ np.asarray(prototypes, np.float64).T
    return np.sqrt(np.maximum(2.0 - 2.0 * cosine.max(axis=1), 0.0))


def open_set_score(distances: np.ndarray, ids: np.ndarray, score: str = "top1_distance", kth: int = 1) -> np.ndarray:
    """Neighbour-based score per query from its sorted neighbour distances and ids (N, >= kth); +inf where the
    index returned fewer hits than the score needs (an approximate index in a sparse region: unknown)."""
    if score not in ("top1_distance", "kth_distance"):
        raise ValueError(f"{score!r} is not a neighbour-distance score")
    column = 0 if score == "top1_distance" else kth - 1
    if distances.ndim != 2 or distances.shape[1] <= column:
        raise ValueError(f"{score} with kth={kth} needs at least {column + 1} neighbours per query")
    picked = distances[:, column].astype(np.float64)
    return np.where(ids[:, column] >= 0, picked, np.inf)


class GallerySearcher:
    """k-NN vote over a FAISS index of L2-normalised gallery embeddings.

    Distances are Euclidean (0 = identical, 2 = opposite on the unit sphere). The vote weights
    each neighbour by 1/(distance + eps); ``confidence`` is the winning label's share of the
    weight; ``unknown`` is set when the open-set score (:func:`open_set_score`: by default the nearest
    neighbour's distance) exceeds ``threshold``.
    """

    def __init__(
        self,
        index: faiss.Index,
        labels: Sequence[str],
        k: int = DEFAULT_K,
        threshold: float | None = None,
        search_params: dict[str, Any] | None = None,
        score: str = "top1_distance",
        kth: int = 1,
        prototypes: np.ndarray | None = None,
    ) -> None:
        if index.ntotal != len(labels):
            raise ValueError(f"index holds {index.ntotal} vectors but labels.json has {len(labels)} labels")
        if not 1 <= k <= index.ntotal:
            raise ValueError(f"k must be between 1 and the gallery size {index.ntotal}, got {k}")
        if score not in OPEN_SET_SCORES:
            raise ValueError(f"unknown open-set score {score!r}; expected one of {', '.join(OPEN_SET_SCORES)}")
        if score == "kth_distance" and not 1 <= kth <= index.ntotal:
            raise ValueError(f"kth must be between 1 and the gallery size {index.ntotal}, got {kth}")
        if score == "prototype_distance":
            prototypes = np.asarray(prototypes if prototypes is not None else np.zeros((0, 0)), np.float32)
            if prototypes.ndim != 2 or len(prototypes) == 0 or prototypes.shape[1] != index.d:
                raise ValueError(f"prototype_distance needs prototypes of shape (C, {index.d}), got {prototypes.shape}")
        self.prototypes = prototypes
        self.index = index
        self.score = score
        self.kth = kth if score == "kth_distance" else 1
        self.labels = np.asarray(labels, dtype=object)
        #: Each gallery item's label as answers give it (str), by gallery id.
        self._label_text = [str(label) for label in self.labels.tolist()]
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

    def _scores(self, embeddings: np.ndarray, distances: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if self.score == "prototype_distance":
            return prototype_distance(np.asarray(embeddings, np.float32), self.prototypes)
        return open_set_score(distances, ids, self.score, self.kth)

    def scores(self, embeddings: np.ndarray) -> np.ndarray:
        """The open-set score of each embedding (float64 (N,)); compare with ``threshold``."""
        distances, ids = self.neighbours(embeddings, max(self.k, self.kth))
        return self._scores(embeddings, distances, ids)

    def classify(self, embeddings: np.ndarray) -> list[dict[str, Any]]:
        """Answer per embedding: pred, dist, confidence, unknown and the k neighbours."""
        distances, ids, scores = self.search(embeddings)
        return [self.answer(d, i, s) for d, i, s in zip(distances, ids, scores)]

    def search(self, embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One FAISS search for the batch: the k neighbours' (distances, gallery ids), each (N, k), and the
        open-set scores (N,), from as many neighbours as the score needs."""
        distances, ids = self.neighbours(embeddings, max(self.k, self.kth))
        scores = self._scores(embeddings, distances, ids)
        return distances[:, : self.k], ids[:, : self.k], scores

    def answer(self, distances: np.ndarray, ids: np.ndarray, score: float) -> dict[str, Any]:
        """The answer for one query's row of :meth:`search` (its ``neighbours`` are the ids >= 0, in order)."""
        # Python lists from the start: one conversion per row instead of one per element (tolist() gives the same
        # floats as float() of each float32); approximate indexes may return fewer than k hits (id -1).
        text = self._label_text
        hits = [(text[i], d) for i, d in zip(ids.tolist(), distances.tolist()) if i >= 0]
        if not hits:
            return {"pred": None, "dist": None, "confidence": 0.0, "unknown": True, "neighbours": []}
        labels = [label for label, _ in hits]
        weights: dict[str, float] = {}
        for label, dist in hits:
            weights[label] = weights.get(label, 0.0) + 1.0 / (dist + 1e-6)
        # Ties go to the label met first, i.e. the nearest neighbour's.
        pred = max(weights, key=lambda lab: (weights[lab], -labels.index(lab)))
        return {
            "pred": pred,
            "dist": round(hits[0][1], 6),
            "confidence": round(weights[pred] / sum(weights.values()), 6),
            "unknown": bool(self.threshold is not None and score > self.threshold),
            "neighbours": [{"label": label, "dist": round(dist, 6)} for label, dist in hits],
        }
