"""Nearest-neighbour classification over a FAISS gallery: one code path for evaluation and serving."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import faiss
import numpy as np

from .answer import NO_NEIGHBOURS, UNLIKE_ANY_CLASS, Answer, Neighbour

DEFAULT_K = 5
#: The one switch rule this handler implements (metadata.json's ``enrolled_switch.rule``).
SWITCH_RULE = "mahalanobis_gap"
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


@dataclass(frozen=True)
class EnrolledSwitch:
    """The answer rule for classes enrolled from a few images (``python -m training enroll``).

    The k-NN vote outvotes a class of 10 gallery items beside classes of thousands, so where the vote answers a
    trained class, the answer switches to an enrolled class when the query is much closer to that class than to any
    trained class: squared Mahalanobis distance to each class mean under ``whitening`` (the trained classes' pooled
    within-class covariance, inverse square root), ``gap`` = distance to the nearest trained-class mean minus
    distance to the nearest enrolled-class mean, the switch fires when ``gap > tau`` (enrollment sets tau so that
    at most a small share of held-out trained-class images would). A vote for an enrolled class stands: the vote
    is not outvoted there, and it tells enrolled classes apart better than their means once they hold many images.
    """

    #: Class names, one per row of ``means``.
    labels: tuple[str, ...]
    #: The enrolled classes (a non-empty subset of ``labels``; the others are the trained classes).
    enrolled: tuple[str, ...]
    #: Class means of the gallery embeddings, float64 (C, D).
    means: np.ndarray
    #: Whitening matrix, float64 (D, D): squared Mahalanobis distance = ||(x - mean) @ whitening||^2.
    whitening: np.ndarray
    tau: float
    _whitened_means: np.ndarray = field(init=False, repr=False, compare=False)
    _enrolled_mask: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        means = np.asarray(self.means, np.float64)
        whitening = np.asarray(self.whitening, np.float64)
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("enrolled switch: class labels repeat")
        if means.ndim != 2 or means.shape[0] != len(self.labels) or not means.size:
            raise ValueError(f"enrolled switch: means must be ({len(self.labels)}, D), got {means.shape}")
        if whitening.shape != (means.shape[1], means.shape[1]):
            raise ValueError(f"enrolled switch: whitening must be {(means.shape[1],) * 2}, got {whitening.shape}")
        if not (np.isfinite(means).all() and np.isfinite(whitening).all() and math.isfinite(self.tau)):
            raise ValueError("enrolled switch: means, whitening and tau must be finite")
        mask = np.array([label in set(self.enrolled) for label in self.labels], dtype=bool)
        if not self.enrolled or mask.sum() != len(set(self.enrolled)) or mask.all():
            raise ValueError("enrolled switch: the enrolled classes must be a non-empty proper subset of its labels")
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "whitening", whitening)
        object.__setattr__(self, "_whitened_means", means @ whitening)
        object.__setattr__(self, "_enrolled_mask", mask)

    @property
    def dim(self) -> int:
        return int(self.means.shape[1])

    def gaps(self, embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(gap float64 (N,), position in ``labels`` of the nearest enrolled-class mean (N,)) per embedding."""
        x = np.asarray(embeddings, np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected embeddings of shape (N, {self.dim}), got {x.shape}")
        diff = (x @ self.whitening)[:, None, :] - self._whitened_means[None, :, :]
        squared = np.einsum("ncd,ncd->nc", diff, diff)
        trained = squared[:, ~self._enrolled_mask].min(axis=1)
        enrolled_pos = np.flatnonzero(self._enrolled_mask)
        nearest = np.argmin(squared[:, enrolled_pos], axis=1)
        return trained - squared[np.arange(len(x)), enrolled_pos[nearest]], enrolled_pos[nearest]

    def choose(self, embeddings: np.ndarray) -> list[str | None]:
        """Per embedding, the enrolled class the switch fires for (gap > tau), or None."""
        gap, nearest = self.gaps(embeddings)
        return [self.labels[int(c)] if g > self.tau else None for g, c in zip(gap.tolist(), nearest.tolist())]

    def record(self) -> dict[str, Any]:
        """The metadata.json section (JSON numbers; float64 values round-trip exactly)."""
        return {"rule": SWITCH_RULE, "labels": list(self.labels), "enrolled": list(self.enrolled),
                "tau": float(self.tau), "means": self.means.tolist(), "whitening": self.whitening.tolist()}


class GallerySearcher:
    """k-NN vote over a FAISS index of L2-normalised gallery embeddings.

    Distances are Euclidean (0 = identical, 2 = opposite on the unit sphere). The vote weights
    each neighbour by 1/(distance + eps); ``confidence`` is the winning label's share of the
    weight; the answer is ``unknown`` (no ``pred``, reason ``unlike_any_class``, the vote's label kept as
    ``nearest_label``) when the open-set score (:func:`open_set_score`: by default the nearest neighbour's distance)
    exceeds ``threshold``. With an :class:`EnrolledSwitch` (``switch``), where the vote
    answers a trained class and the switch fires, ``pred`` is the enrolled class it chooses (``confidence`` stays
    that label's share of the vote's weight, which may be 0); without one, answers are the vote's.
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
        switch: EnrolledSwitch | None = None,
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
        self.switch = switch
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

    @property
    def switch(self) -> EnrolledSwitch | None:
        """The enrolled-class switch, or None: the vote alone."""
        return self._switch

    @switch.setter
    def switch(self, switch: EnrolledSwitch | None) -> None:
        if switch is not None:
            if switch.dim != self.index.d:
                raise ValueError(f"the enrolled switch has {switch.dim}-dimensional means but the index holds "
                                 f"{self.index.d}")
            if set(switch.labels) != set(self._label_text):
                differ = sorted(set(switch.labels) ^ set(self._label_text))
                raise ValueError(f"the enrolled switch's classes are not the gallery's (labels.json): {differ[0]!r} "
                                 "is in only one of them")
        self._switch = switch

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

    def classify(self, embeddings: np.ndarray) -> list[Answer]:
        """The :class:`~handler.answer.Answer` per embedding."""
        distances, ids, scores = self.search(embeddings)
        switched = self.switched(embeddings)
        if switched is None:
            return [self.answer(d, i, s) for d, i, s in zip(distances, ids, scores)]
        return [self.answer(d, i, s, to) for d, i, s, to in zip(distances, ids, scores, switched)]

    def switched(self, embeddings: np.ndarray) -> list[str | None] | None:
        """Per embedding, the enrolled class the switch fires for (None: it does not), for :meth:`answer`; None
        without a switch."""
        return None if self.switch is None else self.switch.choose(embeddings)

    def search(self, embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One FAISS search for the batch: the k neighbours' (distances, gallery ids), each (N, k), and the
        open-set scores (N,), from as many neighbours as the score needs."""
        distances, ids = self.neighbours(embeddings, max(self.k, self.kth))
        scores = self._scores(embeddings, distances, ids)
        return distances[:, : self.k], ids[:, : self.k], scores

    def answer(self, distances: np.ndarray, ids: np.ndarray, score: float,
               switch_to: str | None = None) -> Answer:
        """The answer for one query's row of :meth:`search` (its ``neighbours`` are the ids >= 0, in order);
        ``switch_to``: the query's entry of :meth:`switched`, the answer's ``pred`` when not None and the vote
        answers a class the switch does not count as enrolled."""
        # Python lists from the start: one conversion per row instead of one per element (tolist() gives the same
        # floats as float() of each float32); approximate indexes may return fewer than k hits (id -1).
        text = self._label_text
        hits = [(text[i], d) for i, d in zip(ids.tolist(), distances.tolist()) if i >= 0]
        if not hits:
            return Answer.of_vote(None, 0.0, None, (), NO_NEIGHBOURS)
        labels = [label for label, _ in hits]
        weights: dict[str, float] = {}
        for label, dist in hits:
            weights[label] = weights.get(label, 0.0) + 1.0 / (dist + 1e-6)
        # Ties go to the label met first, i.e. the nearest neighbour's.
        pred = max(weights, key=lambda lab: (weights[lab], -labels.index(lab)))
        if switch_to is not None and (self._switch is None or pred not in self._switch.enrolled):
            pred = switch_to
        unknown = self.threshold is not None and score > self.threshold
        return Answer.of_vote(pred, round(weights.get(pred, 0.0) / sum(weights.values()), 6), round(hits[0][1], 6),
                              tuple(Neighbour(label, round(dist, 6)) for label, dist in hits),
                              UNLIKE_ANY_CLASS if unknown else None)
