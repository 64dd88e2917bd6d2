"""bench.openset_scores: the score maths on small synthetic Gaussian data, the operating point, the graph replay."""

from __future__ import annotations

import numpy as np
import pytest

from bench import openset_scores as o
from bench.output import as_json

DIM = 6


def gaussian_classes(rng: np.random.Generator, n: int = 400, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """`n` points per class around well separated means, one shared anisotropic covariance."""
    mix = rng.normal(size=(DIM, DIM)) * np.linspace(0.2, 2.0, DIM)
    means = rng.normal(scale=8.0, size=(classes, DIM))
    labels = np.repeat(np.arange(classes), n)
    return means[labels] + rng.normal(size=(len(labels), DIM)) @ mix.T, labels


def eval_set(x: np.ndarray, space: str = "raw64", **kwargs) -> o.EvalSet:
    return o.EvalSet({space: x}, np.zeros(len(x), dtype=bool), **kwargs)


def test_mahalanobis_is_euclidean_after_whitening():
    rng = np.random.default_rng(0)
    root = rng.normal(size=(DIM, DIM)) + 3 * np.eye(DIM)
    cov, means, x = root @ root.T, rng.normal(size=(2, DIM)), rng.normal(size=(50, DIM))
    whitened = [np.linalg.solve(root, (x - m).T).T for m in means]  # cov = root root^T: root^-1 whitens
    expected = np.stack([np.sum(w ** 2, axis=1) for w in whitened], axis=1)
    np.testing.assert_allclose(o.squared_mahalanobis(x, means, cov), expected, rtol=1e-9)
    np.testing.assert_allclose(o.squared_mahalanobis(x, means, np.eye(DIM)),
                               ((x[:, None] - means[None]) ** 2).sum(-1), rtol=1e-12)


def test_shared_mahalanobis_does_not_change_under_a_linear_map_of_the_space():
    rng = np.random.default_rng(1)
    gallery, labels = gaussian_classes(rng)
    queries = rng.normal(scale=10, size=(100, DIM))
    mapping = rng.normal(size=(DIM, DIM)) + 2 * np.eye(DIM)
    before = o.fit_mahalanobis_shared(gallery, labels, ridge=0.0)(queries)
    after = o.fit_mahalanobis_shared(gallery @ mapping, labels, ridge=0.0)(queries @ mapping)
    np.testing.assert_allclose(after, before, rtol=1e-7)
    euclid = o.fit_mahalanobis_shared(gallery, labels, ridge=1e6)(queries)  # ridge dominates: Euclidean ranking
    assert not np.allclose(np.argsort(euclid), np.argsort(before))


def test_gaussian_nll_of_one_isotropic_class_is_distance_over_variance_plus_log_det():
    rng = np.random.default_rng(2)
    gallery = rng.normal(scale=2.0, size=(2000, DIM))
    x = rng.normal(size=(20, DIM))
    mean, var = gallery.mean(0), np.trace(np.cov(gallery, rowvar=False, bias=True)) / DIM
    expected = ((x - mean) ** 2).sum(1) / var + DIM * np.log(var)
    np.testing.assert_allclose(o.fit_gaussian_nll(gallery, np.zeros(2000), shrink=1.0)(x), expected, rtol=1e-9)


def test_relative_mahalanobis_of_a_single_class_is_zero_and_is_smaller_than_the_plain_score():
    rng = np.random.default_rng(3)
    gallery, labels = gaussian_classes(rng)
    x = rng.normal(scale=10, size=(30, DIM))
    np.testing.assert_allclose(o.fit_relative_mahalanobis(gallery, np.zeros(len(gallery)), 0.01)(x), 0, atol=1e-8)
    rmd = o.fit_relative_mahalanobis(gallery, labels, 0.01)(x)
    assert np.all(rmd < o.fit_mahalanobis_shared(gallery, labels, 0.01)(x))


def test_knn_is_the_kth_distance_and_the_gallery_skips_itself_with_k_plus_one():
    rng = np.random.default_rng(4)
    g = rng.normal(size=(200, DIM))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    pairwise = np.sqrt(np.maximum(((g[:, None] - g[None]) ** 2).sum(-1), 0))
    np.testing.assert_allclose(o.fit_knn(g, None, k=1)(g), 0, atol=1e-6)
    np.testing.assert_allclose(o.fit_knn(g, None, k=3)(g), np.sort(pairwise, axis=1)[:, 2], atol=1e-6)
    knn = next(s for s in o.SINGLES if s.name == "kNN k=50")
    np.testing.assert_allclose(knn.self_fit(g, None)(g), np.sort(pairwise, axis=1)[:, 50], atol=1e-6)


def test_the_prototype_score_is_the_served_distance_to_the_nearest_class_mean():
    rng = np.random.default_rng(5)
    gallery, labels = gaussian_classes(rng)
    gallery /= np.linalg.norm(gallery, axis=1, keepdims=True)
    protos = np.stack([gallery[labels == c].mean(0) for c in range(3)])
    protos /= np.linalg.norm(protos, axis=1, keepdims=True)
    expected = np.linalg.norm(gallery[:, None] - protos[None], axis=-1).min(1)
    np.testing.assert_allclose(o.fit_prototype(gallery, labels)(gallery), expected, atol=1e-6)


def synthetic_sets(rng: np.random.Generator) -> tuple[o.EvalSet, dict[str, o.EvalSet]]:
    """A gallery of three Gaussian classes and evaluation sets: held-out digits of the same classes, unknowns far
    away, photos with a blank and a refused item."""
    gallery, labels = gaussian_classes(rng)
    held, held_labels = gaussian_classes(rng, n=400)
    far = rng.normal(loc=60.0, size=(300, DIM))
    sets = {"heldout": eval_set(held, labels=held_labels),
            "uploads": eval_set(far[:200], categories=np.array(["letters", "ui-glyphs"] * 100)),
            "fashion": eval_set(far[200:]), "printed": eval_set(held[:100]), "printed_unseen": eval_set(held[100:200]),
            "photo": eval_set(held[:20], labels=held_labels[:20], n=21)}
    sets["photo"].blank[0] = True
    return eval_set(gallery, labels=labels), sets


def test_the_threshold_accepts_the_quantile_of_held_out_digits_and_flags_far_sets():
    gallery, sets = synthetic_sets(np.random.default_rng(6))
    single = o.Single("maha", "raw64", lambda g, y: o.fit_mahalanobis_shared(g, y, 0.01))
    scores = o.all_scores([single], [], gallery, sets)["maha"]
    row = o.evaluate(scores, sets, photo_votes=sets["photo"].labels)
    assert row["threshold"] == np.quantile(scores["heldout"], 0.995)
    assert row["heldout_accepted"] == pytest.approx(0.995, abs=1 / 1200)
    assert 0.98 <= row["heldout_accepted_cross_fitted"] <= 1.0
    assert row["uploads_flagged"] == row["fashion_flagged"] == row["uploads_auroc"] == 1.0
    assert row["uploads_by_category"] == {"letters": 1.0, "ui-glyphs": 1.0}
    assert scores["photo"][0] == np.inf  # blank: always unknown
    assert row["photo_unknown"] == np.sum(scores["photo"] > row["threshold"]) / 21 >= 1 / 21  # of all asked for
    assert row["photo_right"] <= 19 / 21  # the blank one is flagged, the refused one is never right
    assert o.misses(row) == {"uploads": False, "fashion": False, "photo": row["photo_unknown"] > 0.02,
                             "printed": row["printed_accepted"] < 0.99}


def test_the_photo_target_cut_leaves_at_most_the_target_share_of_all_asked_above_it():
    scores = np.arange(100, dtype=float)  # 100 scored of 110 asked: 2% of 110 -> 2 may be flagged
    cut = o.photo_target_cut(scores, 110, 0.02)
    assert cut == 97.0 and np.sum(scores > cut) == 2
    assert o.photo_target_cut(scores, 100, 0.0) == 99.0 and o.photo_target_cut(scores[:1], 100, 0.02) == -np.inf
    with_blanks = np.concatenate([scores, [np.inf] * 3])  # 3 always unknown, 2 allowed: no threshold meets it
    assert o.photo_target_cut(with_blanks, 110, 0.02) is None
    gallery, sets = synthetic_sets(np.random.default_rng(8))
    sets["reference"] = sets["printed"]
    sets["photo"] = o.EvalSet({k: np.concatenate([v] * 5) for k, v in sets["photo"].spaces.items()},
                              np.zeros(100, bool), labels=np.concatenate([sets["photo"].labels] * 5), n=110)
    single = o.Single("maha", "raw64", lambda g, y: o.fit_mahalanobis_shared(g, y, 0.01))
    scores = o.all_scores([single], [], gallery, sets)["maha"]
    row = o.evaluate(scores, sets, photo_votes=sets["photo"].labels)
    cut = row["photo_target_threshold"]
    assert np.isfinite(cut) and np.sum(scores["photo"] > cut) <= 2 < np.sum(scores["photo"] >= cut) + 2
    assert row["uploads_flagged_at_photo_target"] == np.mean(scores["uploads"] > cut)
    assert row["heldout_accepted_at_photo_target"] == np.mean(scores["heldout"] <= cut)
    assert row["reference_accepted"] == np.mean(scores["reference"] <= row["threshold"])
    assert row["reference_accepted_at_photo_target"] == np.mean(scores["reference"] <= cut)
    sets["photo"].blank[:3] = True
    row = o.evaluate(o.all_scores([single], [], gallery, sets)["maha"], sets, photo_votes=sets["photo"].labels)
    assert row["photo_target_threshold"] is None and row["uploads_flagged_at_photo_target"] is None
    assert o.table({"maha": row})[-1].endswith("| **-** / - | 100.0 (-) |")


def test_a_combination_z_scores_by_the_gallery_and_calibrates_on_the_held_out_digits():
    rng = np.random.default_rng(7)
    gallery, sets = synthetic_sets(rng)
    a = o.Single("a", "raw64", lambda g, y: o.fit_mahalanobis_shared(g, y, 0.01))
    b = o.Single("b", "raw64", lambda g, y: lambda x: np.linalg.norm(x, axis=1))
    both = o.all_scores([a, b], [o.Combination("max", ("a", "b"), "max"), o.Combination("sum", ("a", "b"), "sum")],
                        gallery, sets)
    ref = {name: s.fit(gallery.spaces["raw64"], gallery.labels)(gallery.spaces["raw64"]) for name, s in
           (("a", a), ("b", b))}
    z = {name: (both[name]["uploads"] - ref[name].mean()) / ref[name].std() for name in ref}
    np.testing.assert_allclose(both["max"]["uploads"], np.maximum(z["a"], z["b"]))
    np.testing.assert_allclose(both["sum"]["uploads"], z["a"] + z["b"])
    for combo in ("max", "sum"):
        row = o.evaluate(both[combo], sets, sets["photo"].labels)
        assert row["threshold"] == np.quantile(both[combo]["heldout"], 0.995)
        assert row["heldout_accepted"] == pytest.approx(0.995, abs=1 / 1200)
    with pytest.raises(ValueError):
        o.combine([np.zeros(2)], "mean")


def test_the_graph_replay_reads_the_projection_and_a_mismatch_stops_the_run():
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.proj = torch.nn.Conv2d(1, 4, 3), torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pooled = torch.flatten(torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1), 1)
            return torch.nn.functional.normalize(self.proj(pooled), dim=1)

    torch.manual_seed(0)
    model = torch.jit.freeze(torch.jit.script(Net().eval()))
    x = torch.randn(5, 1, 28, 28)
    feat, raw = o.graph_replay(model)(x.numpy())
    assert feat.shape == (5, 4) and raw.shape == (5, 3)
    with torch.no_grad():
        served = model(x).numpy()
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), served, atol=1e-6)

    class Service:
        def __init__(self, shift: float) -> None:
            self.shift = shift

        def embed(self, batch: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return model(torch.from_numpy(batch)).numpy() + self.shift

    checked = o.features(Service(0.0), o.graph_replay(model), x.numpy())
    assert checked.replay_error <= o.REPLAY_TOLERANCE and set(checked.spaces) == set(o.SPACES)
    with pytest.raises(AssertionError, match="graph replay"):
        o.features(Service(1e-3), o.graph_replay(model), x.numpy())


def test_the_report_renders_from_the_summary_and_bolds_missed_targets():
    row = {"threshold": 0.9, "heldout_accepted": 0.995, "heldout_accepted_cross_fitted": 0.993,
           "uploads_flagged": 0.853, "uploads_auroc": 0.993,
           "uploads_by_category": {"letters": 0.667, "ui-glyphs": 0.72, "symbolic-icons": 0.74},
           "fashion_flagged": 0.97, "fashion_auroc": 0.998, "photo_right": 0.959, "photo_unknown": 0.023,
           "printed_accepted": 0.99, "printed_unseen_accepted": 1.0, "uploads_flagged_at_photo_target": 0.873,
           "heldout_accepted_at_photo_target": 0.998}
    result = as_json({
        "command": "python -m bench openset-scores --artifacts A", "artifacts": "A", "model_sha256": "ab" * 32,
        "quantization": "int8", "recorded_score": "prototype_distance", "recorded_threshold": 0.9,
        "data_source": "mnist-sample", "photo_n": 20, "photo_refused": 0,
        "sets": {"gallery": 4000, "heldout": 1000, "uploads": 1258, "fashion": 10000, "printed": 1000,
                 "printed_unseen": 560, "photo": 20},
        "uploads_blank": 0.031, "replay_max_difference": 6e-8, "gallery_max_difference": 0.0,
        "vote_accuracy": {"heldout": 0.991, "photo": 0.95, "printed": 0.998, "printed_unseen": 0.996},
        "targets": o.TARGETS, "rows": {o.SHIPPED: row}, "seconds": {"gallery": 1.0},
        "started": "2026-11-27T12:00:00+00:00", "finished": "2026-11-27T12:10:00+00:00",
        "load_average": {"start": [1.0, 1.0, 1.0], "end": [2.0, 2.0, 2.0]},
        "machine": {"cpu_model": "cpu", "logical_cores": 2}})
    report = o.markdown(result)
    assert report.startswith("# Open-set scores")
    line = next(text for text in report.splitlines() if text.startswith(f"| {o.SHIPPED}"))
    assert line == (f"| {o.SHIPPED} | 99.5 (99.3) | **85.3** (0.993) | 66.7 / 72.0 / 74.0 | 97.0 (0.998) | "
                    "95.9 / **2.3** | 99.0 / 100.0 | **87.3** / 99.8 |")
    with_reference = as_json(dict(result, reference="download:mnist", sets=dict(result["sets"], reference=10000),
                                  rows={o.SHIPPED: dict(row, reference_accepted=0.988,
                                                        reference_accepted_at_photo_target=0.996)}))
    report = o.markdown(with_reference)
    assert "reference digits 10000 (the held-out split of `download:mnist`)" in report
    assert next(text for text in report.splitlines() if text.startswith(f"| {o.SHIPPED}")).endswith(
        "| **87.3** / 99.8 | 98.8 (99.6) |")
    assert "[1.0, 1.0, 1.0] at the start, [2.0, 2.0, 2.0] at the end" in report
