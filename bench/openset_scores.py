"""`python -m bench openset-scores`: other open-set scores than the shipped one, on the same model and sets.

Usage: ``--artifacts DIR [--photo-n 1000] [--data-source SOURCE] [--photo-source SOURCE] [--reference SOURCE]
[--out bench/results/openset-scores]``.

Every score is fitted on the gallery only (the index's vectors, which must be the training split re-embedded) and
thresholded like the shipped one: at the 99.5% quantile of its scores on the held-out digits
(training.evaluate.calibrate_threshold). Three feature spaces of the same forward pass:

- ``norm``: the served embedding (L2-normalised);
- ``raw64``: the projection's output before the L2 normalisation;
- ``feat128``: the pooled convolutional features, the projection's input (the penultimate layer).

``raw64`` and ``feat128`` come from replaying model.pt's own frozen TorchScript graph (int8 or float, as saved:
the service runs it through torch.jit.optimize_for_inference, which splits the projection) with the projection's
input and output as its outputs; the normalised ``raw64`` must equal the served embedding within 1e-5 on every
image, or the command stops. Combinations z-score each part by its scores on the gallery and take
the larger (max) or the sum; one threshold is then set on the held-out digits as for a single score.

Sets: held-out digits; the uploads exam (training.uploads); Fashion-MNIST's 10,000 test images; the photo exam
(tests/support/photo_set.py, --photo-n evenly spaced held-out digits, seed 0); printed digits in DejaVu
(training.printed, seed 12345, not training's draws) and in the unseen Liberation/FreeFont faces of
tests/integration/test_product_quality.py. Blank inputs score +inf (always unknown), as served.
``--reference SOURCE`` adds the held-out digits of another source (``download:mnist``: MNIST's 10,000 test digits,
other writers than the training split's) and reports the share of them each threshold accepts.

Each row also gives the trade-off between two targets that the threshold alone sets: the uploads flagged (and
held-out digits accepted) at the threshold where the photo exam's unknown share just meets its target. If that
share of uploads is under its target, no threshold on that score meets both.

Writes openset-scores.md and openset-scores.summary.json into --out (raw/openset-scores.json: the same record).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import env, output

if TYPE_CHECKING:
    import torch

    from handler.service import EmbeddingService

PROG = "python -m bench openset-scores"
NAME = "openset-scores"
SPACES = ("norm", "raw64", "feat128")
#: Largest |normalised raw64 - served embedding| the graph replay may show.
REPLAY_TOLERANCE = 1e-5
#: The targets each row is held against (docs/non-digits.md; photo: tests/integration/test_product_quality.py's
#: goal); a figure that misses one is bold in the report.
TARGETS = {"uploads_flagged_min": 0.95, "fashion_flagged_min": 0.95, "photo_unknown_max": 0.02,
           "printed_accepted_min": 0.99}
PRINTED_SEED = 12345
PHOTO_SEED = 0
BATCH = 512

#: A fitted score: one feature space's vectors (N, D) -> float64 scores (N,), higher = less like the gallery.
Score = Callable[[np.ndarray], np.ndarray]


# ---------------------------------------------------------------- scores, fitted on the gallery only

def fit_prototype(gallery: np.ndarray, labels: np.ndarray) -> Score:
    """The shipped score: distance to the nearest class prototype (handler.search)."""
    from handler.search import class_prototypes, prototype_distance

    _, prototypes = class_prototypes(gallery, [str(v) for v in labels])
    return functools.partial(prototype_distance, prototypes=prototypes)


def fit_knn(gallery: np.ndarray, labels: np.ndarray, k: int) -> Score:
    """Euclidean distance to the k-th nearest gallery vector (L2-normalised vectors)."""
    g = np.asarray(gallery, np.float64)

    def score(x: np.ndarray) -> np.ndarray:
        out = []
        for start in range(0, len(x), 2000):
            squared = np.maximum(2.0 - 2.0 * np.asarray(x[start:start + 2000], np.float64) @ g.T, 0.0)
            out.append(np.sqrt(np.partition(squared, k - 1, axis=1)[:, k - 1]))
        return np.concatenate(out) if out else np.zeros(0)
    return score


def _regularised(cov: np.ndarray, ridge: float) -> np.ndarray:
    """`cov` + ridge x its mean variance on the diagonal."""
    return cov + ridge * np.trace(cov) / len(cov) * np.eye(len(cov))


def _shrunk(cov: np.ndarray, shrink: float) -> np.ndarray:
    """`cov` shrunk toward its mean variance times the identity."""
    return (1 - shrink) * cov + shrink * np.trace(cov) / len(cov) * np.eye(len(cov))


def squared_mahalanobis(x: np.ndarray, means: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """(N, C) squared Mahalanobis distances of each row of `x` to each mean under one covariance: Euclidean
    distances after whitening with the inverse covariance's Cholesky factor."""
    whiten = np.linalg.cholesky(np.linalg.inv(cov))
    x = np.asarray(x, np.float64)
    return np.stack([np.sum(((x - m) @ whiten) ** 2, axis=1) for m in np.atleast_2d(means)], axis=1)


def _class_means(gallery: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(class means (C, D), shared within-class covariance (D, D), maximum likelihood)."""
    x = np.asarray(gallery, np.float64)
    classes = np.unique(labels)
    means = np.stack([x[labels == c].mean(axis=0) for c in classes])
    centred = x - means[np.searchsorted(classes, labels)]
    return means, centred.T @ centred / len(x)


def fit_mahalanobis_shared(gallery: np.ndarray, labels: np.ndarray, ridge: float) -> Score:
    """Smallest Mahalanobis distance (squared) to a class mean under the shared covariance (Lee et al. 2018)."""
    means, cov = _class_means(gallery, labels)
    cov = _regularised(cov, ridge)
    return lambda x: squared_mahalanobis(x, means, cov).min(axis=1)


def fit_gaussian_nll(gallery: np.ndarray, labels: np.ndarray, shrink: float) -> Score:
    """Smallest negative log-likelihood over per-class Gaussians (shrunk covariances), as 2 x NLL less a constant:
    squared Mahalanobis distance plus log det."""
    x = np.asarray(gallery, np.float64)
    parts = []
    for c in np.unique(labels):
        cov = _shrunk(np.cov(x[labels == c], rowvar=False, bias=True), shrink)
        parts.append((x[labels == c].mean(axis=0), cov, np.linalg.slogdet(cov)[1]))
    return lambda z: np.stack([squared_mahalanobis(z, m, cov)[:, 0] + logdet for m, cov, logdet in parts], 1).min(1)


def fit_relative_mahalanobis(gallery: np.ndarray, labels: np.ndarray, ridge: float) -> Score:
    """Relative Mahalanobis distance (Ren et al. 2021): the shared-covariance score less the distance to one
    Gaussian fitted to the whole gallery."""
    means, cov = _class_means(gallery, labels)
    x = np.asarray(gallery, np.float64)
    cov, background = _regularised(cov, ridge), _regularised(np.cov(x, rowvar=False, bias=True), ridge)
    mean = x.mean(axis=0)
    return lambda z: squared_mahalanobis(z, means, cov).min(axis=1) - squared_mahalanobis(z, mean, background)[:, 0]


def zscore(scores: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """`scores` standardised by the mean and standard deviation of the gallery's own scores."""
    return (scores - reference.mean()) / reference.std()


def combine(zscores: Sequence[np.ndarray], how: str) -> np.ndarray:
    """The larger (`max`) or the sum (`sum`) of z-scored parts; +inf stays +inf."""
    stacked = np.stack(zscores)
    if how == "max":
        return stacked.max(axis=0)
    if how == "sum":
        return stacked.sum(axis=0)
    raise ValueError(f"unknown combination {how!r}")


@dataclass(frozen=True)
class Single:
    """A score in one feature space; `self_fit` scores the gallery against itself for z-scoring (kNN: k+1, so
    that an item does not count itself)."""

    name: str
    space: str
    fit: Callable[[np.ndarray, np.ndarray], Score]
    self_fit: Callable[[np.ndarray, np.ndarray], Score] | None = None


@dataclass(frozen=True)
class Combination:
    name: str
    parts: tuple[str, ...]
    how: str


SHIPPED = "prototype_distance (shipped)"
#: The rows of the report: the shipped score, the best of each family in the experiment behind docs/non-digits.md
#: ("Other open-set scores") and the combinations with the shipped score.
SINGLES = (
    Single(SHIPPED, "norm", fit_prototype),
    *(Single(f"kNN k={k}", "norm", functools.partial(fit_knn, k=k), functools.partial(fit_knn, k=k + 1))
      for k in (50, 100)),
    Single("Maha shared norm ridge=0.01", "norm", functools.partial(fit_mahalanobis_shared, ridge=0.01)),
    Single("Maha shared raw64 ridge=0.01", "raw64", functools.partial(fit_mahalanobis_shared, ridge=0.01)),
    Single("Maha shared feat128 ridge=0.1", "feat128", functools.partial(fit_mahalanobis_shared, ridge=0.1)),
    Single("Gauss NLL class feat128 shrink=0.1", "feat128", functools.partial(fit_gaussian_nll, shrink=0.1)),
    Single("RMD raw64 ridge=0.01", "raw64", functools.partial(fit_relative_mahalanobis, ridge=0.01)),
)
COMBINATIONS = (
    Combination("max z(proto, Maha shared raw64 1e-2)", (SHIPPED, "Maha shared raw64 ridge=0.01"), "max"),
    Combination("max z(proto, Gauss NLL class feat128)", (SHIPPED, "Gauss NLL class feat128 shrink=0.1"), "max"),
    Combination("max z(proto, RMD raw64 1e-2)", (SHIPPED, "RMD raw64 ridge=0.01"), "max"),
    Combination("max z(proto, kNN k=50)", (SHIPPED, "kNN k=50"), "max"),
    Combination("sum z(proto, Maha shared raw64 1e-2)", (SHIPPED, "Maha shared raw64 ridge=0.01"), "sum"),
)


@dataclass
class EvalSet:
    """One evaluation set: its vectors per feature space, which inputs are blank, labels where it has them."""

    spaces: dict[str, np.ndarray]
    blank: np.ndarray
    labels: np.ndarray | None = None
    categories: np.ndarray | None = None
    #: Items asked for; more than len(blank) when preprocessing refused some (they count as neither right nor
    #: unknown).
    n: int | None = None
    #: Largest |normalised raw64 - served embedding| of the graph replay on this set.
    replay_error: float = 0.0


def all_scores(singles: Sequence[Single], combinations: Sequence[Combination], gallery: EvalSet,
               sets: dict[str, EvalSet]) -> dict[str, dict[str, np.ndarray]]:
    """Score name -> set name -> scores, every score fitted on `gallery`; blank inputs +inf."""
    labels = np.asarray(gallery.labels)
    out: dict[str, dict[str, np.ndarray]] = {}
    reference: dict[str, np.ndarray] = {}
    for single in singles:
        g = gallery.spaces[single.space]
        score = single.fit(g, labels)
        out[single.name] = {name: np.where(s.blank, np.inf, score(s.spaces[single.space])) for name, s in sets.items()}
        reference[single.name] = (single.self_fit(g, labels) if single.self_fit else score)(g)
    for combo in combinations:
        out[combo.name] = {name: combine([zscore(out[p][name], reference[p]) for p in combo.parts], combo.how)
                           for name in sets}
    return out


# ---------------------------------------------------------------- evaluation at the operating point

def photo_target_cut(photo_scores: np.ndarray, n_asked: int, unknown_max: float) -> float | None:
    """The lowest threshold at which at most ``unknown_max`` of the ``n_asked`` photo uploads score above it (the
    refused ones count as asked, as in photo_unknown); None when none does: more blank photos (+inf, always unknown)
    than the target allows."""
    allowed = int(np.floor(unknown_max * n_asked + 1e-9))
    ranked = np.sort(photo_scores)[::-1]
    if allowed >= len(ranked):
        return -np.inf
    return float(ranked[allowed]) if np.isfinite(ranked[allowed]) else None


def evaluate(scores: dict[str, np.ndarray], sets: dict[str, EvalSet], photo_votes: np.ndarray,
             targets: dict[str, float] = TARGETS) -> dict[str, Any]:
    """One score's figures: threshold on the held-out digits, then the share flagged or accepted of every set;
    and at the photo exam's target cut (:func:`photo_target_cut`), the uploads flagged and digits accepted."""
    from training.evaluate import ACCEPT_QUANTILE, auroc, calibrate_threshold, cross_fitted_acceptance

    held = scores["heldout"]
    threshold = calibrate_threshold(held, ACCEPT_QUANTILE)
    flagged = {name: s > threshold for name, s in scores.items()}
    photo, categories = sets["photo"], sets["uploads"].categories
    n_photo = photo.n if photo.n is not None else len(photo.blank)
    cut = photo_target_cut(scores["photo"], n_photo, targets["photo_unknown_max"])
    def at_cut(values: np.ndarray, accepted: bool) -> float | None:
        return None if cut is None else float(np.mean(values <= cut if accepted else values > cut))

    extra = {}
    if "reference" in scores:
        extra = {"reference_accepted": float(np.mean(~flagged["reference"])),
                 "reference_accepted_at_photo_target": at_cut(scores["reference"], accepted=True)}
    return {
        **extra,
        "photo_target_threshold": cut,
        "uploads_flagged_at_photo_target": at_cut(scores["uploads"], accepted=False),
        "heldout_accepted_at_photo_target": at_cut(held, accepted=True),
        "threshold": threshold,
        "heldout_accepted": float(np.mean(~flagged["heldout"])),
        "heldout_accepted_cross_fitted": cross_fitted_acceptance(held, ACCEPT_QUANTILE),
        "uploads_flagged": float(np.mean(flagged["uploads"])),
        "uploads_auroc": auroc(scores["uploads"], held),
        "uploads_by_category": {c: float(np.mean(flagged["uploads"][categories == c]))
                                for c in dict.fromkeys(categories.tolist())},
        "fashion_flagged": float(np.mean(flagged["fashion"])),
        "fashion_auroc": auroc(scores["fashion"], held),
        "photo_right": float(np.sum((photo_votes == photo.labels) & ~flagged["photo"]) / n_photo),
        "photo_unknown": float(np.sum(flagged["photo"]) / n_photo),
        "printed_accepted": float(np.mean(~flagged["printed"])),
        "printed_unseen_accepted": float(np.mean(~flagged["printed_unseen"])),
    }


def misses(row: dict[str, Any], targets: dict[str, float] = TARGETS) -> dict[str, bool]:
    """Which targets a row misses."""
    return {"uploads": row["uploads_flagged"] < targets["uploads_flagged_min"],
            "fashion": row["fashion_flagged"] < targets["fashion_flagged_min"],
            "photo": row["photo_unknown"] > targets["photo_unknown_max"],
            "printed": row["printed_accepted"] < targets["printed_accepted_min"]}


# ---------------------------------------------------------------- features: served embedding and graph replay

def graph_replay(model: "torch.jit.ScriptModule") -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """inputs (N, 1, 28, 28) -> (feat128, raw64): the input and output of the last linear layer (the projection)
    of the model's frozen forward graph, run as the model runs it (same quantized kernels and constants)."""
    import torch

    graph = model.inlined_graph.copy()
    linears = [node for node in graph.nodes() if node.kind() == "aten::linear"]
    if not linears:
        raise ValueError("the model's forward graph has no aten::linear (projection) to read features from")
    projection = linears[-1]
    feat, raw = projection.inputsAt(0), projection.output()
    pair = graph.create("prim::TupleConstruct", [feat, raw])
    graph.appendNode(pair)
    pair.output().setType(torch._C.TupleType([feat.type(), raw.type()]))
    graph.eraseOutput(0)
    graph.registerOutput(pair.output())
    torch._C._jit_pass_dce(graph)
    replay = torch._C._create_function_from_graph("openset_features", graph)

    def run(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            f, r = replay(model._c, torch.from_numpy(np.ascontiguousarray(batch, np.float32)))
        return f.float().numpy(), r.float().numpy()
    return run


def features(service: "EmbeddingService", replay: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
             tensors: np.ndarray) -> EvalSet:
    """The served embeddings and the replayed raw64 / feat128 of model inputs; fails if they disagree."""
    from handler.preprocessing import is_blank

    tensors = np.asarray(tensors, np.float32).reshape(-1, 1, 28, 28)
    norm, raw, feat = [], [], []
    for start in range(0, len(tensors), BATCH):
        batch = tensors[start:start + BATCH]
        norm.append(service.embed(batch))
        f, r = replay(batch)
        feat.append(f)
        raw.append(r)
    spaces = {"norm": np.concatenate(norm).astype(np.float64), "raw64": np.concatenate(raw).astype(np.float64),
              "feat128": np.concatenate(feat).astype(np.float64)}
    unit = spaces["raw64"] / np.maximum(np.linalg.norm(spaces["raw64"], axis=1, keepdims=True), 1e-12)
    error = float(np.abs(unit - spaces["norm"]).max()) if len(unit) else 0.0
    if not error <= REPLAY_TOLERANCE:
        raise AssertionError(f"graph replay: |normalised raw64 - served embedding| = {error:.3g} > "
                             f"{REPLAY_TOLERANCE:g}; the replayed features are not the served model's")
    return EvalSet(spaces, np.array([is_blank(t) for t in tensors], dtype=bool), replay_error=error)


def _suite_generators() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(photo_exam, the unseen-font printed_digits) of the test suite, which bench reuses rather than copies."""
    from settings import REPO

    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from support.printed_fonts import printed_digits
    from support.photo_set import photo_exam

    return photo_exam, printed_digits


def load_sets(service: "EmbeddingService", artifacts: Path, photo_n: int,
              log: Callable[[str], None] = print, data_source: str | None = None, photo_source: str | None = None,
              reference: str | None = None) -> tuple[EvalSet, dict[str, EvalSet], dict[str, Any]]:
    """(gallery, evaluation sets, notes on them) of the artifacts' model, every vector checked by the replay.

    ``data_source`` (default: the dataset the artifacts record) is the model's training data: gallery and held-out
    digits; ``photo_source`` (default: the same) gives the photo exam its held-out digits; ``reference``, when
    given, adds its held-out digits as the set "reference"."""
    from handler.search import gallery_vectors
    from training.data import load_dataset
    from training.evaluate import load_ood_set, model_inputs
    from training.printed import printed_digits
    from training.steps import prepare_data
    from training.uploads import EXAM_SEED, exam_uploads

    import torch

    from handler.artifacts import LABELS_FILE, MODEL_FILE

    replay = graph_replay(torch.jit.load(str(artifacts / MODEL_FILE), map_location="cpu").eval())
    from training.data import DataError

    profile, source = service.profile, data_source or service.metadata["dataset"]["name"]
    try:
        data = prepare_data(source)
    except DataError as exc:
        if data_source:
            raise
        raise ValueError(f"the artifacts record the dataset {source!r}, which is not a data source: pass "
                         f"--data-source ({exc})") from None
    notes: dict[str, Any] = {"data_source": source, "photo_source": photo_source or source, "reference": reference}

    def timed(name: str, make: Callable[[], EvalSet]) -> EvalSet:
        started = time.perf_counter()
        made = make()
        notes.setdefault("seconds", {})[name] = round(time.perf_counter() - started, 1)
        log(f"{name}: {len(made.blank)} items, {int(made.blank.sum())} blank, {notes['seconds'][name]} s")
        return made

    gallery = timed("gallery", lambda: features(service, replay, profile.normalize(data.train_images)))
    stored = gallery_vectors(service.searcher.index)
    labels = json.loads((artifacts / LABELS_FILE).read_text())
    if stored.shape != gallery.spaces["norm"].shape or [str(v) for v in data.train_labels] != [str(v) for v in labels]:
        raise ValueError(f"the gallery is not the training split of {source!r} (enrolled or rebuilt artifacts?)")
    gap = float(np.abs(stored - gallery.spaces["norm"]).max())
    if gap > REPLAY_TOLERANCE:
        raise ValueError(f"the gallery differs from the re-embedded training split by {gap:.3g}")
    gallery.labels = np.asarray(data.train_labels)
    notes["gallery_max_difference"] = gap

    sets: dict[str, EvalSet] = {}
    sets["heldout"] = timed("heldout", lambda: features(service, replay, profile.normalize(data.test_images)))
    sets["heldout"].labels = np.asarray(data.test_labels)
    uploads = exam_uploads(EXAM_SEED)
    sets["uploads"] = timed("uploads", lambda: features(
        service, replay, model_inputs(profile, [u.data for u in uploads], service.max_pixels)))
    sets["uploads"].categories = np.array([u.category for u in uploads])
    sets["fashion"] = timed("fashion", lambda: features(
        service, replay, model_inputs(profile, load_ood_set("fashion"), service.max_pixels)))
    canvases, printed_labels = printed_digits(1000, seed=PRINTED_SEED)
    sets["printed"] = timed("printed", lambda: features(service, replay, profile.normalize(canvases)))
    sets["printed"].labels = np.asarray(printed_labels)
    photo_exam, unseen_digits = _suite_generators()
    unseen = unseen_digits()
    prepared = service.prepare([body for body, _ in unseen])
    if len(prepared.good) != len(unseen):
        raise ValueError(f"{len(unseen) - len(prepared.good)} printed digits were refused")
    sets["printed_unseen"] = timed("printed_unseen", lambda: features(service, replay, np.stack(prepared.tensors)))
    sets["printed_unseen"].labels = np.array([int(label) for _, label in unseen])

    if reference:
        ref = profile.canvases_from_arrays(load_dataset(reference).test_images)  # its test split only
        sets["reference"] = timed("reference", lambda: features(service, replay, profile.normalize(ref)))
    trained = load_dataset(source)
    raw = load_dataset(photo_source) if photo_source and photo_source != source else trained
    pick = np.linspace(0, len(raw.test_images) - 1, photo_n).astype(int)
    trained_on = {image.tobytes() for image in trained.train_images}
    notes["photo_digits_in_training"] = int(sum(raw.test_images[i].tobytes() in trained_on for i in pick))
    started = time.perf_counter()
    items = photo_exam(raw.test_images[pick], raw.test_labels[pick], seed=PHOTO_SEED)
    photos = service.prepare([item.body for item in items])
    notes["seconds"]["photo_exam_made"] = round(time.perf_counter() - started, 1)
    tensors = np.stack(photos.tensors) if photos.tensors else np.zeros((0, 1, 28, 28), np.float32)
    sets["photo"] = timed("photo", lambda: features(service, replay, tensors))
    sets["photo"].labels = np.array([items[i].label for i in photos.good], dtype=np.int64)
    sets["photo"].n = photo_n
    notes["photo_refused"] = photo_n - len(photos.good)
    return gallery, sets, notes


def votes(service: "EmbeddingService", vectors: np.ndarray) -> np.ndarray:
    """The served k-NN vote of each embedding, as int labels (the same whatever the open-set score)."""
    if not len(vectors):
        return np.zeros(0, np.int64)
    return np.array([int(a["pred"]) for a in service.searcher.classify(vectors.astype(np.float32))])


# ---------------------------------------------------------------- report

def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def bold(text: str, missed: bool) -> str:
    """`text` in bold where a target is missed."""
    return f"**{text}**" if missed else text


def table(rows: dict[str, dict[str, Any]], targets: dict[str, float] = TARGETS) -> list[str]:
    """The markdown table, figures that miss a target in bold."""
    with_reference = any("reference_accepted" in r for r in rows.values())
    lines = ["| score | held-out accepted (cross-fitted) | uploads flagged (AUROC) | letters / UI glyphs / symbolic "
             "icons | Fashion flagged (AUROC) | photo right / unknown | printed accepted: DejaVu / unseen fonts | "
             "at the photo target: uploads flagged / held-out accepted |"
             + (" reference accepted (at the photo target) |" if with_reference else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if with_reference else "")]
    for name, r in rows.items():
        miss, c = misses(r, targets), r["uploads_by_category"]
        cf, at_photo = r["heldout_accepted_cross_fitted"], r["uploads_flagged_at_photo_target"]
        lines.append(
            f"| {name} | {_pct(r['heldout_accepted'])} ({_pct(cf) if cf is not None else '-'}) | "
            f"{bold(_pct(r['uploads_flagged']), miss['uploads'])} ({r['uploads_auroc']:.3f}) | "
            + " / ".join(_pct(c[k]) if k in c else "-" for k in ("letters", "ui-glyphs", "symbolic-icons"))
            + f" | {bold(_pct(r['fashion_flagged']), miss['fashion'])} ({r['fashion_auroc']:.3f}) | "
            f"{_pct(r['photo_right'])} / {bold(_pct(r['photo_unknown']), miss['photo'])} | "
            f"{bold(_pct(r['printed_accepted']), miss['printed'])} / {_pct(r['printed_unseen_accepted'])} | "
            f"{bold(_pct(at_photo), at_photo is None or at_photo < targets['uploads_flagged_min'])}"
            f" / {_pct(r['heldout_accepted_at_photo_target'])} |"
            + (f" {_pct(r['reference_accepted'])} ({_pct(r['reference_accepted_at_photo_target'])}) |"
               if "reference_accepted" in r else ""))
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The report, from the result (or its summary) alone."""
    t, sets, load = result["targets"], result["sets"], result["load_average"]
    lines = [
        "# Open-set scores on one model", "",
        f"`{result['command']}` on {result['machine']['cpu_model']} ({result['machine']['logical_cores']} logical "
        f"cores), {result['started']} to {result['finished']}; load average (1, 5, 15 min) {load['start']} at the "
        f"start, {load['end']} at the end. Artifacts `{result['artifacts']}` (model.pt sha256 "
        f"{str(result['model_sha256'])[:12]}, {result['quantization']}, recorded score {result['recorded_score']} "
        f"at {result['recorded_threshold']:.6f}).", "",
        f"Every score is fitted on the gallery ({sets['gallery']} vectors, the training split of "
        f"`{result['data_source']}` re-embedded) and thresholded at the 99.5% quantile of its held-out scores "
        f"({sets['heldout']} digits). Spaces: `norm` the served embedding, `raw64` the projection's output before "
        "the L2 norm, `feat128` its input (pooled features), both from a replay of the model's frozen graph "
        f"(largest |normalised raw64 - served| {result['replay_max_difference']:.1g}). Combinations z-score each "
        "part by the gallery's own scores and take the larger or the sum.", "",
        f"Sets: uploads exam {sets['uploads']} items ({_pct(result['uploads_blank'])}% blank, always unknown), "
        f"Fashion-MNIST {sets['fashion']}, photo exam {result['photo_n']} held-out digits (seed {PHOTO_SEED}, "
        f"{result['photo_refused']} refused; photo right = vote correct and not flagged; vote alone "
        f"{_pct(result['vote_accuracy']['photo'])}%), printed DejaVu {sets['printed']} (seed {PRINTED_SEED}), "
        f"printed unseen fonts {sets['printed_unseen']}"
        + (f", reference digits {sets['reference']} (the held-out split of `{result['reference']}`)"
           if result.get("reference") else "")
        + f". Photo exam digits from `{result.get('photo_source', result['data_source'])}`'s held-out split, "
        f"{result.get('photo_digits_in_training', 0)} of them also in the training split. "
        "\"At the photo target\": the threshold at which the photo exam's unknown share just meets its target. "
        "Figures in %; bold misses a target: uploads flagged >= "
        f"{_pct(t['uploads_flagged_min'])}, Fashion flagged >= {_pct(t['fashion_flagged_min'])}, photo unknown <= "
        f"{_pct(t['photo_unknown_max'])}, printed DejaVu accepted >= {_pct(t['printed_accepted_min'])}.", "",
        *table(result["rows"], t), "",
        f"Shipped score's threshold here {result['rows'][SHIPPED]['threshold']:.6f} against "
        f"{result['recorded_threshold']:.6f} recorded. The vote's accuracy: held-out "
        f"{_pct(result['vote_accuracy']['heldout'])}%, printed DejaVu {_pct(result['vote_accuracy']['printed'])}%, "
        f"unseen fonts {_pct(result['vote_accuracy']['printed_unseen'])}%. Seconds per set: "
        + ", ".join(f"{k} {v}" for k, v in result["seconds"].items()) + ".",
    ]
    return "\n".join(lines) + "\n"


def run(artifacts: Path, photo_n: int, command: str, log: Callable[[str], None] = print,
        data_source: str | None = None, photo_source: str | None = None, reference: str | None = None
        ) -> dict[str, Any]:
    """Load the model, build every set, score and evaluate: the result record."""
    from handler.service import EmbeddingService

    started, load_start = datetime.now(UTC).isoformat(timespec="seconds"), env.load_average()
    service = EmbeddingService.from_dir(artifacts)
    if service.runtime != "torchscript":
        raise ValueError("the graph replay needs the TorchScript model")
    gallery, sets, notes = load_sets(service, artifacts, photo_n, log, data_source, photo_source, reference)
    scores = all_scores(SINGLES, COMBINATIONS, gallery, sets)
    vote = {name: votes(service, sets[name].spaces["norm"]) for name in ("heldout", "photo", "printed",
                                                                           "printed_unseen")}
    rows = {name: evaluate(per_set, sets, vote["photo"]) for name, per_set in scores.items()}
    meta = service.metadata
    n_photo = sets["photo"].n or 1
    return {
        "command": command, "artifacts": str(artifacts), "model_sha256": meta.get("sha256", {}).get("model.pt"),
        "quantization": (meta["training"].get("quantization") or {}).get("scheme", "float"),
        "recorded_score": meta["open_set"]["score"], "recorded_threshold": meta["open_set"]["threshold"],
        "data_source": notes["data_source"], "photo_source": notes["photo_source"], "reference": notes["reference"],
        "photo_digits_in_training": notes["photo_digits_in_training"],
        "photo_n": photo_n, "photo_refused": notes["photo_refused"],
        "sets": {"gallery": len(gallery.blank), **{name: len(s.blank) for name, s in sets.items()}},
        "uploads_blank": float(np.mean(sets["uploads"].blank)),
        "replay_max_difference": max(s.replay_error for s in (gallery, *sets.values())),
        "gallery_max_difference": notes["gallery_max_difference"],
        "vote_accuracy": {name: float(np.sum(v == sets[name].labels) / (n_photo if name == "photo" else len(v)))
                          for name, v in vote.items()},
        "targets": TARGETS, "rows": rows, "seconds": notes["seconds"],
        "started": started, "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": {"start": load_start, "end": env.load_average()},
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "machine": env.machine(), "versions": env.versions(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0].split(": ", 1)[-1])
    p.add_argument("--artifacts", type=Path, required=True, help="artifact directory (model.pt, index, metadata)")
    p.add_argument("--photo-n", type=int, default=1000, help="photo exam items (default 1000: about 10 minutes)")
    p.add_argument("--data-source", help="the model's training data (default: the dataset the artifacts record)")
    p.add_argument("--photo-source", help="whose held-out digits the photo exam draws (default: --data-source)")
    p.add_argument("--reference", help="more held-out digits to report the acceptance of, e.g. download:mnist")
    p.add_argument("--out", type=Path, default=Path("bench/results/openset-scores"),
                   help=f"directory for {NAME}.md and {NAME}.summary.json (and raw/)")
    args = p.parse_args(argv)
    if args.photo_n < 1:
        p.error("--photo-n must be at least 1")
    from training.data import DataError

    try:
        result = run(args.artifacts, args.photo_n, " ".join([PROG, *argv]), data_source=args.data_source,
                     photo_source=args.photo_source, reference=args.reference)
    except (DataError, ValueError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    report = markdown(output.as_json(result))
    output.write(args.out, NAME, result, report)
    print(report)
    print(f"wrote {args.out / (NAME + '.md')} and {output.summary_path(args.out, NAME)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
