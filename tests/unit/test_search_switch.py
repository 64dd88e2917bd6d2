"""The enrolled-class switch (handler.search.EnrolledSwitch): the k-NN vote's answer, unless a query is much closer
(squared Mahalanobis distance to class means) to an enrolled class than to every trained class."""

from __future__ import annotations

import json
import math

import faiss
import numpy as np
import pytest

from handler.artifacts import ArtifactError
from handler.artifacts import enrolled_switch
from handler.search import SWITCH_SECTION, EnrolledSwitch, GallerySearcher


def on_circle(*angles: float) -> np.ndarray:
    a = np.asarray(angles, dtype=np.float64)
    return np.stack([np.cos(a), np.sin(a)], axis=1).astype(np.float32)


def flat(vectors: np.ndarray) -> faiss.Index:
    index = faiss.IndexFlatL2(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


# A plane gallery: trained class "a" crowded around angle 0, trained "b" opposite, enrolled "n" one item at 0.5.
A_ANGLES = [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
B_ANGLES = [3.0, 3.1, 3.2]
N_ANGLES = [0.5]
LABELS = ["a"] * len(A_ANGLES) + ["b"] * len(B_ANGLES) + ["n"] * len(N_ANGLES)


def class_means() -> np.ndarray:
    return np.stack([on_circle(*angles).astype(np.float64).mean(axis=0) for angles in (A_ANGLES, B_ANGLES, N_ANGLES)])


def plane_switch(tau: float = 0.0, whitening: np.ndarray | None = None) -> EnrolledSwitch:
    return EnrolledSwitch(("a", "b", "n"), ("n",), class_means(),
                          np.eye(2) * 10 if whitening is None else whitening, tau)


def plane_searcher(switch: EnrolledSwitch | None, k: int = 5) -> GallerySearcher:
    return GallerySearcher(flat(on_circle(*A_ANGLES, *B_ANGLES, *N_ANGLES)), LABELS, k=k, switch=switch)


def test_a_query_near_the_enrolled_mean_switches_where_the_vote_says_a_trained_class():
    query = on_circle(0.4)
    assert plane_searcher(None).classify(query)[0]["pred"] == "a"  # "n" is one neighbour of five: outvoted
    answer = plane_searcher(plane_switch()).classify(query)[0]
    vote = plane_searcher(None).classify(query)[0]
    assert answer["pred"] == "n"
    # Only the label (pred, nearest_label) and its vote share change: the neighbours, dist and unknown stay the vote's.
    changed = ("pred", "nearest_label", "confidence")
    assert {k: v for k, v in answer.items() if k not in changed} == {k: v for k, v in vote.items() if k not in changed}
    weights = {label: 0.0 for label in "an"}
    for neighbour in vote["neighbours"]:
        weights[neighbour["label"]] += 1.0 / (neighbour["dist"] + 1e-6)
    assert answer["confidence"] == pytest.approx(weights["n"] / sum(weights.values()), abs=1e-5)


def test_a_trained_class_point_does_not_switch():
    s = plane_searcher(plane_switch())
    for angle in (0.0, 0.15, 0.3, 3.1):  # on class "a" (0.3 is its item nearest "n") and on "b"
        answer = s.classify(on_circle(angle))[0]
        assert answer["pred"] == ("b" if angle > 3 else "a")
    assert s.switched(on_circle(0.0, 0.15, 3.1)) == [None, None, None]


def test_tau_is_the_margin_the_gap_must_exceed():
    switch = plane_switch()
    gap, nearest = switch.gaps(on_circle(0.47))
    assert switch.labels[int(nearest[0])] == "n" and gap[0] > 0
    assert plane_switch(tau=float(gap[0]) * 0.999).choose(on_circle(0.47)) == ["n"]
    assert plane_switch(tau=float(gap[0])).choose(on_circle(0.47)) == [None]  # strictly greater


def test_gap_is_squared_mahalanobis_under_the_whitening():
    rng = np.random.default_rng(0)
    dim = 6
    root = rng.normal(size=(dim, dim))
    cov = root @ root.T / dim + 0.1 * np.eye(dim)
    values, vectors = np.linalg.eigh(cov)
    whitening = vectors / np.sqrt(values)[None, :]
    means = rng.normal(size=(4, dim))
    switch = EnrolledSwitch(("t1", "t2", "e1", "e2"), ("e1", "e2"), means, whitening, 0.0)
    x = rng.normal(size=(9, dim))
    precision = np.linalg.inv(cov)
    squared = np.array([[(xi - m) @ precision @ (xi - m) for m in means] for xi in x])
    gap, nearest = switch.gaps(x)
    np.testing.assert_allclose(gap, squared[:, :2].min(axis=1) - squared[:, 2:].min(axis=1), rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(nearest, 2 + np.argmin(squared[:, 2:], axis=1))


def test_without_a_switch_or_when_it_never_fires_answers_are_the_vote_exactly():
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(200, 2)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    vote = plane_searcher(None).classify(queries)
    assert plane_searcher(None).switched(queries) is None
    assert plane_searcher(plane_switch(tau=1e9)).classify(queries) == vote
    # a firing switch changes only the queries it chooses
    s = plane_searcher(plane_switch())
    switched = s.switched(queries)
    fired = [i for i, to in enumerate(switched) if to is not None]
    assert 0 < len(fired) < len(queries)
    answers = s.classify(queries)
    assert all(answers[i] == vote[i] for i in range(len(queries)) if i not in fired)
    assert all(answers[i]["pred"] == "n" for i in fired)


def test_no_hits_stay_unknown_even_when_the_switch_fires():
    answer = plane_searcher(plane_switch()).answer(np.array([np.inf]), np.array([-1]), 0.0, "n")
    assert answer == {"pred": None, "dist": None, "confidence": 0.0, "unknown": True, "reason": "no_neighbours",
                      "nearest_label": None, "neighbours": []}


def test_metadata_round_trip_is_exact_and_absence_means_no_switch():
    rng = np.random.default_rng(2)
    switch = EnrolledSwitch(("a", "b", "n"), ("n",), rng.normal(size=(3, 4)), rng.normal(size=(4, 4)), 1.2345678901234)
    loaded = enrolled_switch(json.loads(json.dumps({SWITCH_SECTION: switch.record()})))
    assert loaded is not None and loaded.labels == switch.labels and loaded.enrolled == switch.enrolled
    assert loaded.tau == switch.tau
    np.testing.assert_array_equal(loaded.means, switch.means)
    np.testing.assert_array_equal(loaded.whitening, switch.whitening)
    x = rng.normal(size=(5, 4))
    np.testing.assert_array_equal(loaded.gaps(x)[0], switch.gaps(x)[0])
    assert enrolled_switch({"k": 5}) is None


def _record(**changes):
    record = plane_switch().record()
    record.update(changes)
    return {SWITCH_SECTION: record}


@pytest.mark.parametrize("metadata, fragment", [
    ({SWITCH_SECTION: []}, "must be an object"),
    (_record(rule="nearest_prototype"), "'nearest_prototype' is not one this handler implements"),
    (_record(enrolled=["z"]), "non-empty proper subset"),
    (_record(enrolled=[]), "non-empty proper subset"),
    (_record(enrolled=["a", "b", "n"]), "non-empty proper subset"),
    (_record(labels=["a", "a", "n"]), "labels repeat"),
    (_record(tau=True), "tau must be a number"),
    (_record(tau="1"), "tau must be a number"),
    (_record(means=[[1.0, 0.0]]), "means must be (3, D)"),
    (_record(whitening=[[1.0]]), "whitening must be (2, 2)"),
    (_record(whitening=[[math.nan, 0.0], [0.0, 1.0]]), "must be finite"),
    (_record(means="x"), "enrolled_switch"),
])
def test_a_malformed_section_is_an_artifact_error_in_one_line(metadata, fragment):
    with pytest.raises(ArtifactError) as info:
        enrolled_switch(metadata)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_the_searcher_refuses_a_switch_that_does_not_fit_its_gallery():
    with pytest.raises(ValueError, match="2-dimensional means but the index holds 3"):
        GallerySearcher(flat(np.eye(3, dtype=np.float32)), ["a", "b", "n"], k=1, switch=plane_switch())
    with pytest.raises(ValueError, match="classes are not the gallery's .*'n' is in only one of them"):
        GallerySearcher(flat(on_circle(0.0, 1.0)), ["a", "b"], k=1, switch=plane_switch())
    s = GallerySearcher(flat(on_circle(0.0, 1.0, 2.0, 3.0)), ["a", "b", "n", "z"], k=1)
    with pytest.raises(ValueError, match="'z' is in only one of them"):  # checked when set later, too
        s.switch = plane_switch()
    assert s.switch is None


def test_a_vote_for_an_enrolled_class_stands():
    """Where the vote already answers an enrolled class it is not outvoted: the switch, which picks the nearest
    enrolled mean, does not override it (with many images per enrolled class the vote tells them apart better)."""
    angles = [*A_ANGLES, *B_ANGLES, 0.5, 1.0, 1.05, 1.1]
    labels = [*LABELS[:-1], "n", "m", "m", "m"]
    means = np.concatenate([class_means(), on_circle(2.0).astype(np.float64)])  # m's mean put far from its items
    switch = EnrolledSwitch(("a", "b", "n", "m"), ("n", "m"), means, np.eye(2) * 10, 0.0)
    s = GallerySearcher(flat(on_circle(*angles)), labels, k=5, switch=switch)
    query = on_circle(1.02)
    assert switch.choose(query) == ["n"]  # fires, for n: nearer than a's mean and m's (misplaced) one
    vote = GallerySearcher(flat(on_circle(*angles)), labels, k=5).classify(query)[0]
    assert vote["pred"] == "m" and s.classify(query)[0] == vote
