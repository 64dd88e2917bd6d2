"""k-NN classification over FAISS galleries built here by hand (handler/search.py): the weighted vote, the open-set
threshold, approximate indexes and their search parameters, and the enrolled-class switch (EnrolledSwitch), which
answers the vote's label unless a query is much closer (squared Mahalanobis distance to class means) to an enrolled
class than to every trained class."""

from __future__ import annotations

import json
import math

import faiss
import numpy as np
import pytest

from handler.artifacts import ArtifactError
from handler.artifacts import enrolled_switch
from handler.metadata import SWITCH_SECTION, ModelMetadata
from handler.search import EnrolledSwitch, GallerySearcher
from training.index import build_index

EPS = 1e-6  # GallerySearcher's weight is 1 / (distance + EPS)


def on_circle(*angles: float) -> np.ndarray:
    """Unit vectors in the plane at the given angles (radians), as a float32 (N, 2) array."""
    a = np.asarray(angles, dtype=np.float64)
    return np.stack([np.cos(a), np.sin(a)], axis=1).astype(np.float32)


def chord(angle: float) -> float:
    """Euclidean distance between two unit vectors that make this angle."""
    return 2 * math.sin(angle / 2)


def flat(vectors: np.ndarray) -> faiss.Index:
    index = faiss.IndexFlatL2(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def searcher(angles, labels, **kwargs) -> GallerySearcher:
    return GallerySearcher(flat(on_circle(*angles)), labels, **kwargs)


def weight(distance: float) -> float:
    return 1.0 / (distance + EPS)


def random_unit_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_neighbours_are_sorted_with_euclidean_not_squared_distances():
    angles = [2.0, 0.1, 3.0, 0.5, 1.0]
    s = searcher(angles, list("abcde"), k=5)
    distances, ids = s.neighbours(on_circle(0.0))
    assert ids.tolist() == [[1, 3, 4, 0, 2]]
    np.testing.assert_allclose(distances[0], [chord(angles[i]) for i in ids[0]], rtol=1e-5)
    answer = s.classify(on_circle(0.0))[0]
    assert [n["label"] for n in answer["neighbours"]] == ["b", "d", "e", "a", "c"]
    assert answer["dist"] == pytest.approx(chord(0.1), abs=1e-6)


def test_neighbours_k_argument_overrides_the_default():
    s = searcher([0.1, 0.2, 0.3, 0.4], list("abcd"), k=1)
    distances, ids = s.neighbours(on_circle(0.0), k=3)
    assert distances.shape == ids.shape == (1, 3)
    assert ids[0].tolist() == [0, 1, 2]


def test_weighted_vote_outvotes_a_closer_lone_neighbour():
    s = searcher([0.2, 0.3, 0.35, 3.0], ["a", "b", "b", "a"], k=3)
    answer = s.classify(on_circle(0.0))[0]
    assert answer["neighbours"][0]["label"] == "a"
    assert answer["pred"] == "b"
    w_a, w_b = weight(chord(0.2)), weight(chord(0.3)) + weight(chord(0.35))
    assert answer["confidence"] == pytest.approx(w_b / (w_a + w_b), abs=1e-5)
    assert answer["dist"] == pytest.approx(chord(0.2), abs=1e-6)


def test_a_much_closer_neighbour_outweighs_a_majority():
    s = searcher([0.01, 0.5, 0.6], ["a", "b", "b"], k=3)
    answer = s.classify(on_circle(0.0))[0]
    assert answer["pred"] == "a"
    w_a, w_b = weight(chord(0.01)), weight(chord(0.5)) + weight(chord(0.6))
    assert answer["confidence"] == pytest.approx(w_a / (w_a + w_b), abs=1e-5)


def test_unanimous_vote_has_confidence_one():
    answer = searcher([0.1, 0.2, 0.3], ["7", "7", "7"], k=3).classify(on_circle(0.0))[0]
    assert answer["pred"] == "7" and answer["confidence"] == 1.0


@pytest.mark.parametrize("labels", [["a", "b"], ["b", "a"]])
def test_exact_tie_goes_to_the_nearest_neighbours_label(labels):
    gallery = np.eye(3, dtype=np.float32)[1:]  # both exactly sqrt(2) from the query
    s = GallerySearcher(flat(gallery), labels, k=2)
    answer = s.classify(np.eye(3, dtype=np.float32)[:1])[0]
    assert answer["neighbours"][0]["dist"] == answer["neighbours"][1]["dist"] == pytest.approx(math.sqrt(2))
    assert answer["pred"] == answer["neighbours"][0]["label"]
    assert answer["confidence"] == 0.5


@pytest.mark.parametrize(("threshold", "unknown"), [(None, False), (0.5, False), (0.1, True), (0.0, True)])
def test_unknown_when_the_nearest_neighbour_is_beyond_the_threshold(threshold, unknown):
    s = searcher([0.2, 0.25, 0.3], ["a", "a", "b"], k=3, threshold=threshold)
    answer = s.classify(on_circle(0.0))[0]
    assert answer.unknown is unknown
    assert answer.nearest_label == "a"  # the vote is reported either way, as the answer only when known
    assert (answer.pred, answer.confidence, answer.reason) == \
        ((None, 0.0, "unlike_any_class") if unknown else ("a", answer.confidence, None))


def test_nearest_neighbour_exactly_at_the_threshold_is_known():
    s = searcher([0.2, 0.25], ["a", "b"], k=2)
    distances, _ = s.neighbours(on_circle(0.0))
    at_threshold = searcher([0.2, 0.25], ["a", "b"], k=2, threshold=float(distances[0, 0]))
    assert at_threshold.classify(on_circle(0.0))[0]["unknown"] is False


@pytest.mark.parametrize("k", [0, -1, 4])
def test_k_outside_one_to_gallery_size_is_refused(k):
    with pytest.raises(ValueError, match="gallery size 3"):
        searcher([0.1, 0.2, 0.3], list("abc"), k=k)


def test_k_equal_to_the_gallery_size_is_allowed():
    answer = searcher([0.1, 0.2, 0.3], list("abc"), k=3).classify(on_circle(0.0))[0]
    assert len(answer["neighbours"]) == 3


@pytest.mark.parametrize("labels", [list("ab"), list("abcd"), []])
def test_label_count_must_match_the_index(labels):
    with pytest.raises(ValueError, match=f"3 vectors but labels.json has {len(labels)} labels"):
        searcher([0.1, 0.2, 0.3], labels, k=1)


@pytest.mark.parametrize("shape", [(1, 3), (2, 1), (2,), (1, 1, 2)])
def test_queries_of_the_wrong_shape_are_refused(shape):
    s = searcher([0.1, 0.2], list("ab"), k=1)
    with pytest.raises(ValueError, match=r"expected embeddings of shape \(N, 2\)"):
        s.classify(np.zeros(shape, np.float32))


def test_float64_and_non_contiguous_queries_are_accepted():
    s = searcher([0.0, 1.5], list("ab"), k=1)
    queries = np.asfortranarray(on_circle(0.1, 1.4).astype(np.float64))
    assert [a["pred"] for a in s.classify(queries)] == ["a", "b"]


def test_batched_classify_answers_each_query_in_order():
    gallery_angles = [0.0, 0.05, 2.0, 2.05, 4.0, 4.05]
    s = searcher(gallery_angles, ["zero", "zero", "two", "two", "four", "four"], k=2)
    query_angles = [4.02, 0.02, 2.02, 0.03, 4.01]
    answers = s.classify(on_circle(*query_angles))
    assert [a["pred"] for a in answers] == ["four", "zero", "two", "zero", "four"]
    for answer, q in zip(answers, query_angles):
        nearest = min(abs(q - g) for g in gallery_angles)
        assert answer["dist"] == pytest.approx(chord(nearest), abs=1e-5)


def test_empty_batch_gives_no_answers():
    assert searcher([0.1, 0.2], list("ab"), k=1).classify(np.zeros((0, 2), np.float32)) == []


def test_string_labels_are_returned_as_given():
    s = searcher([0.1, 1.0, 2.0], ["cat", "dog", "unicorn 🦄"], k=1)
    assert [a["pred"] for a in s.classify(on_circle(0.0, 1.1, 2.1))] == ["cat", "dog", "unicorn 🦄"]


def test_numeric_labels_come_back_as_strings():
    answer = searcher([0.1, 1.0], [3, 7], k=1).classify(on_circle(1.0))[0]
    assert answer["pred"] == "7"
    assert answer["neighbours"][0]["label"] == "7"


def write_gallery(tmp_path, index: faiss.Index, labels) -> tuple:
    index_path, labels_path = tmp_path / "gallery.faiss", tmp_path / "labels.json"
    faiss.write_index(index, str(index_path))
    labels_path.write_text(json.dumps(labels))
    return index_path, labels_path


def test_from_files_round_trip_answers_like_the_in_memory_searcher(tmp_path):
    angles, labels = [0.1, 0.3, 1.0, 2.5, 3.0], ["cat", "cat", "dog", "bird", "bird"]
    paths = write_gallery(tmp_path, flat(on_circle(*angles)), labels)
    loaded = GallerySearcher.from_files(*paths, k=3, threshold=0.2)
    in_memory = searcher(angles, labels, k=3, threshold=0.2)
    queries = on_circle(0.0, 0.9, 2.8, 5.0)
    assert loaded.k == 3 and loaded.threshold == 0.2 and loaded.dim == 2
    assert loaded.classify(queries) == in_memory.classify(queries)
    assert [a.nearest_label for a in loaded.classify(queries)] == ["cat", "dog", "bird", "cat"]


def test_from_files_refuses_labels_that_do_not_match_the_index(tmp_path):
    paths = write_gallery(tmp_path, flat(on_circle(0.1, 0.2)), ["only-one"])
    with pytest.raises(ValueError, match="2 vectors but labels.json has 1 labels"):
        GallerySearcher.from_files(*paths, k=1)


@pytest.fixture(scope="module")
def gallery() -> tuple[np.ndarray, list[str]]:
    x = random_unit_vectors(400, 16)
    return x, [str(i % 10) for i in range(len(x))]


def search_param(index: faiss.Index, name: str) -> int:
    real = faiss.downcast_index(index)
    return real.hnsw.efSearch if name == "efSearch" else real.nprobe


@pytest.mark.parametrize(("kind", "name", "value"), [("hnsw", "efSearch", 7), ("ivf", "nprobe", 3)])
def test_search_params_are_applied_to_approximate_indexes(gallery, kind, name, value):
    x, labels = gallery
    index = build_index(x, kind)
    assert search_param(index, name) != value
    s = GallerySearcher(index, labels, k=3, search_params={name: value})
    assert search_param(s.index, name) == value
    answers = s.classify(x[:20])
    assert [a["pred"] for a in answers] == labels[:20]
    assert all(a["dist"] == pytest.approx(0.0, abs=1e-3) for a in answers)


@pytest.mark.parametrize(("kind", "name", "value"), [("hnsw", "efSearch", 9), ("ivf", "nprobe", 2)])
def test_search_params_are_applied_after_loading_from_files(tmp_path, gallery, kind, name, value):
    x, labels = gallery
    paths = write_gallery(tmp_path, build_index(x, kind), labels)
    s = GallerySearcher.from_files(*paths, k=5, search_params={name: value})
    assert search_param(s.index, name) == value
    assert s.classify(x[7:8])[0]["pred"] == labels[7]


def test_unknown_search_param_is_refused(gallery):
    x, labels = gallery
    with pytest.raises(RuntimeError, match="bogus"):
        GallerySearcher(build_index(x, "hnsw"), labels, search_params={"bogus": 1})


def two_list_ivf(gallery: np.ndarray) -> faiss.Index:
    """IVF with two lists (around +x and -x), probing one, holding only the given vectors."""
    rng = np.random.default_rng(0)
    centres = np.repeat(np.array([[1, 0], [-1, 0]], np.float32), 50, axis=0)
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(2), 2, 2)
    index.cp.seed = 0
    index.train(centres + rng.normal(scale=0.01, size=centres.shape).astype(np.float32))
    index.add(gallery)
    index.nprobe = 1
    return index


def test_approximate_index_with_fewer_than_k_hits_answers_with_the_real_ones():
    gallery = on_circle(0.0, 0.1, 0.2, 3.1, 3.2)  # three near +x, two near -x
    s = GallerySearcher(two_list_ivf(gallery), list("aaabb"), k=4)
    _, ids = s.neighbours(on_circle(3.14))
    assert (ids == -1).sum() == 2  # the probed list holds only two vectors
    answer = s.classify(on_circle(3.14))[0]
    assert [n["label"] for n in answer["neighbours"]] == ["b", "b"]
    assert answer["pred"] == "b" and answer["confidence"] == 1.0
    assert answer["dist"] == pytest.approx(chord(0.04), abs=1e-5)


def test_query_with_no_hit_at_all_is_unknown():
    s = GallerySearcher(two_list_ivf(on_circle(0.0, 0.1, 0.2)), list("abc"), k=2)
    answer = s.classify(on_circle(3.14))[0]
    assert answer["unknown"] is True
    assert answer["neighbours"] == []
    assert (answer.pred, answer.confidence, answer.reason, answer.nearest_label) == (None, 0.0, "no_neighbours", None)


# --- the enrolled-class switch (EnrolledSwitch) ------------------------------------------------------------------

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
    loaded = enrolled_switch(_metadata({SWITCH_SECTION: json.loads(json.dumps(switch.record()))}))
    assert loaded is not None and loaded.labels == switch.labels and loaded.enrolled == switch.enrolled
    assert loaded.tau == switch.tau
    np.testing.assert_array_equal(loaded.means, switch.means)
    np.testing.assert_array_equal(loaded.whitening, switch.whitening)
    x = rng.normal(size=(5, 4))
    np.testing.assert_array_equal(loaded.gaps(x)[0], switch.gaps(x)[0])
    assert enrolled_switch(_metadata({})) is None


def _metadata(sections: dict) -> ModelMetadata:
    """metadata.json with `sections` (a parsed file: the enrolled switch as read from one)."""
    return ModelMetadata.from_json({"k": 5, "metrics": {"accuracy": 0.9}, **sections})


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
        enrolled_switch(_metadata(metadata))
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
