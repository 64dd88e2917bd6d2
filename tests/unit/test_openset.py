"""Open-set rejection: scores, AUROC, the metadata contract (new and old artifacts), served == offline, eval CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.idx_fixtures import write_idx
from support.imagegen import raw_row
from serving.samples import user_digit_png

from handler.artifacts import METADATA_FILE, ArtifactError, open_set_settings
from handler.metadata import ModelMetadata, read_metadata
from handler.preprocessing import is_blank, preprocess
from handler.search import GallerySearcher, class_prototypes, open_set_score, prototype_distance
from handler.service import EmbeddingService
from training.__main__ import main as training_main
from training.evaluate import (
    auroc,
    blank_and_noise,
    calibrate_threshold,
    cross_fitted_acceptance,
    open_set_scores,
    synthetic_non_digits,
)
from training.index import build_index
from training.negatives import synthetic_negatives


def unit(*rows) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def copy_with_metadata(src: Path, dst: Path, edit) -> Path:
    """A copy of an artifact directory whose metadata.json went through `edit` (it is not checksummed)."""
    shutil.copytree(src, dst)
    metadata = json.loads((dst / METADATA_FILE).read_text())
    edit(metadata)
    (dst / METADATA_FILE).write_text(json.dumps(metadata))
    return dst


# --- scores and AUROC ---------------------------------------------------------------------------------------

def test_auroc_matches_pairwise_counting_with_ties_and_infinities():
    rng = np.random.default_rng(0)
    known = np.round(rng.normal(0, 1, 200), 1)
    unknown = np.concatenate([np.round(rng.normal(1, 1, 150), 1), [np.inf] * 5])
    pairs = (unknown[:, None] > known[None, :]) + 0.5 * (unknown[:, None] == known[None, :])
    assert auroc(unknown, known) == pytest.approx(pairs.mean())
    assert auroc(known + 10, known) == 1.0
    assert auroc(known - 10, known) == 0.0
    with pytest.raises(ValueError):
        auroc(np.array([]), known)


def test_kth_distance_picks_the_kth_neighbour_and_missing_hits_are_infinite():
    distances = np.array([[0.1, 0.2, 0.9], [0.3, 0.4, 0.0]])
    ids = np.array([[4, 5, 6], [1, 2, -1]])
    np.testing.assert_allclose(open_set_score(distances, ids, "top1_distance"), [0.1, 0.3])
    np.testing.assert_allclose(open_set_score(distances, ids, "kth_distance", 2), [0.2, 0.4])
    assert open_set_score(distances, ids, "kth_distance", 3).tolist() == [0.9, np.inf]
    with pytest.raises(ValueError):
        open_set_score(distances, ids, "kth_distance", 4)


def test_searcher_flags_unknown_by_its_score_not_by_the_nearest_neighbour():
    # A query next to one lone gallery vector but far from the rest: near by top-1, far by the 3rd neighbour.
    gallery = unit([1, 0], [0, 1], [0, 1.05], [0.05, 1])
    query = unit([1, 0.01])
    top1 = GallerySearcher(build_index(gallery), list("abbb"), k=1, threshold=0.5)
    kth = GallerySearcher(build_index(gallery), list("abbb"), k=1, threshold=0.5, score="kth_distance", kth=3)
    assert top1.classify(query)[0]["unknown"] is False
    assert kth.classify(query)[0]["unknown"] is True
    assert len(kth.classify(query)[0]["neighbours"]) == 1  # the vote still uses k, not kth
    assert kth.scores(query)[0] == pytest.approx(sorted(np.linalg.norm(gallery - query, axis=1))[2], abs=1e-5)


def test_prototype_distance_uses_normalised_class_means():
    gallery = unit([1, 0], [1, 0.2], [0, 1], [0.2, 1])
    names, protos = class_prototypes(gallery, ["x", "x", "y", "y"])
    assert names == ["x", "y"]
    np.testing.assert_allclose(np.linalg.norm(protos, axis=1), 1.0, rtol=1e-6)
    query = unit([-1, -1])
    expected = min(np.linalg.norm(query[0] - p) for p in protos)
    assert prototype_distance(query, protos)[0] == pytest.approx(expected, abs=1e-6)
    s = GallerySearcher(build_index(gallery), ["x", "x", "y", "y"], k=2, threshold=1.0,
                        score="prototype_distance", prototypes=protos)
    assert [a["unknown"] for a in s.classify(np.concatenate([query, gallery[:1]]))] == [True, False]
    with pytest.raises(ValueError, match="prototypes"):
        GallerySearcher(build_index(gallery), list("xxyy"), k=2, score="prototype_distance")


def test_unknown_score_name_is_refused():
    with pytest.raises(ValueError, match="open-set score"):
        GallerySearcher(build_index(unit([1, 0])), ["a"], k=1, score="energy")


def test_synthetic_negatives_are_canvases_with_ink_and_reproducible():
    a, b = synthetic_negatives(12, seed=3), synthetic_negatives(12, seed=3)
    assert a.shape == (12, 28, 28) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert all(np.ptp(img) > 0 for img in a)
    assert not np.array_equal(a, synthetic_negatives(12, seed=4))


# --- metadata contract ----------------------------------------------------------------------------------------

def test_metadata_records_the_score_threshold_and_calibration_and_serving_uses_them(tiny_artifacts):
    metadata = read_metadata(tiny_artifacts)
    section = metadata.open_set
    assert section["threshold"] == metadata.threshold > 0
    assert section["calibration"]["split"] == "test" and section["calibration"]["n"] == 1000
    assert 0.98 <= section["calibration"]["accepted_cross_fitted"] <= 1.0
    settings = open_set_settings(metadata)
    service = EmbeddingService.from_dir(tiny_artifacts)
    assert (service.searcher.score, service.searcher.kth, service.searcher.threshold) == \
        (settings["score"], settings["kth"], section["threshold"])


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["open_set"].update(score="energy"), "not one this handler implements"),
    (lambda m: m["open_set"].update(kth=0), "kth"),
    (lambda m: m["open_set"].update(threshold="high"), "threshold"),
    (lambda m: m["open_set"].update(score="prototype_distance", prototypes=None), "prototypes"),
])
def test_malformed_open_set_section_is_an_artifact_error(tiny_artifacts, edit, message):
    metadata = json.loads((tiny_artifacts / METADATA_FILE).read_text())
    edit(metadata)
    with pytest.raises(ArtifactError, match=message):
        open_set_settings(ModelMetadata.from_json(metadata))


def test_old_metadata_without_open_set_serves_top1_distance_as_before(tiny_artifacts, tmp_path, prepared_sample):
    images = list(prepared_sample.test_images[:40]) + list(synthetic_non_digits(20))
    top1 = [a["dist"] for a in EmbeddingService.from_dir(tiny_artifacts).answer(images)[0]]
    threshold = float(np.median(top1))

    def strip(metadata):
        del metadata["open_set"]
        metadata["threshold"] = threshold

    service = EmbeddingService.from_dir(copy_with_metadata(tiny_artifacts, tmp_path / "old", strip))
    assert (service.searcher.score, service.searcher.threshold) == ("top1_distance", threshold)
    answers, _ = service.answer(images)
    assert [a["unknown"] for a in answers] == [d > threshold for d in top1]


# --- offline == served -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mixed_images(prepared_sample) -> list[np.ndarray]:
    """Held-out digits, synthetic non-digits and noise/blank frames, raw uint8."""
    return list(prepared_sample.test_images[:30]) + list(synthetic_non_digits(15, seed=7)) + list(blank_and_noise(8, 7))


def test_handler_answers_follow_the_recorded_score_and_equal_the_offline_evaluation(tiny_artifacts, tmp_path,
                                                                                   mixed_images):
    from support.handler_context import make_context, run_batch

    from handler.embedding_handler import EmbeddingHandler

    service = EmbeddingService.from_dir(tiny_artifacts)
    pngs = [user_digit_png(img) for img in mixed_images]
    tensors = np.stack([preprocess(png) for png in pngs])
    scores = np.where([is_blank(t) for t in tensors], np.inf, service.searcher.scores(service.embed(tensors)))
    # Move the threshold to the median score so about half the answers flip: a handler serving another score or
    # threshold than metadata.json records answers differently from the offline evaluation.
    threshold = float(np.median(scores[np.isfinite(scores)]))
    moved = copy_with_metadata(tiny_artifacts, tmp_path / "moved",
                               lambda m: (m["open_set"].update(threshold=threshold), m.update(threshold=threshold)))
    handler = EmbeddingHandler()
    context = make_context(moved)
    handler.initialize(context)
    served, statuses = run_batch(handler, context, [raw_row(png) for png in pngs])
    assert statuses == [200] * len(pngs)
    flags = [a["unknown"] for a in served]
    assert flags == (scores > threshold).tolist()
    assert 0 < sum(flags) < len(flags)
    offline, _ = EmbeddingService.from_dir(moved).answer(pngs)
    assert [{k: v for k, v in a.items() if k != "model_version"} for a in served] == offline  # the same digest


def test_eval_scores_give_the_services_unknown_flags(tiny_artifacts, mixed_images):
    """The figures of `python -m training eval` come from the same rule the service answers with."""
    service = EmbeddingService.from_dir(tiny_artifacts)
    answers, _ = service.answer(mixed_images)
    scores = open_set_scores(service, np.stack(mixed_images))
    assert [a["unknown"] for a in answers] == (scores > service.searcher.threshold).tolist()


# --- eval CLI ------------------------------------------------------------------------------------------------

def test_eval_cli_writes_well_formed_json(tiny_artifacts, tmp_path, capsys):
    fashion = tmp_path / "fashion"
    fashion.mkdir()
    rng = np.random.default_rng(0)
    shirts = np.zeros((40, 28, 28), np.uint8)
    shirts[:, 4:24, 6:22] = rng.integers(120, 256, (40, 20, 16))  # filled garment-like silhouettes
    write_idx(fashion / "t10k-images-idx3-ubyte.gz", shirts)
    out = tmp_path / "eval.json"
    rc = training_main(["eval", "--artifacts", str(tiny_artifacts), "--fashion-dir", str(fashion),
                        "--n-synthetic", "40", "--ood", "fashion,synthetic,noise", "--out", str(out)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    result = json.loads(out.read_text())
    assert printed == result
    metadata = json.loads((tiny_artifacts / METADATA_FILE).read_text())
    section = metadata["open_set"]
    assert result["score"] == section["score"] and result["threshold"] == section["threshold"]
    assert result["seed"] == 0
    digits = result["digits"]
    assert digits["n"] == 1000 and 0.9 <= digits["accuracy"] <= 1.0
    assert digits["accepted"] == pytest.approx(1 - metadata["drift_baseline"]["unknown_rate"])
    assert digits["accepted_cross_fitted"] == pytest.approx(metadata["open_set"]["calibration"]["accepted_cross_fitted"])
    assert set(result["unknown"]) == {"fashion", "synthetic", "noise"}
    assert result["unknown"]["fashion"]["n"] == 40 and result["unknown"]["noise"]["n"] == 40
    for figures in result["unknown"].values():
        assert 0.0 <= figures["auroc"] <= 1.0 and 0.0 <= figures["flagged"] <= 1.0
    assert result["unknown"]["noise"]["flagged"] >= 0.25  # every fourth frame is blank: always unknown
    assert isinstance(result["machine"]["load_average_1m"], float)


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--ood", "cifar"], 2, "argument --ood"),
    (["--n-synthetic", "0"], 2, "argument --n-synthetic"),
    (["--artifacts", "/nonexistent/artifacts"], 2, "--artifacts /nonexistent/artifacts: no such folder"),
    (["--out", "/tmp"], 2, "--out /tmp: is a folder, not a file"),
    (["--ood", "fashion", "--fashion-dir", "/nonexistent/fashion"], 1, "Fashion-MNIST test images not found"),
])
def test_eval_cli_bad_input_is_one_line_and_non_zero(tiny_artifacts, args, code, message, capsys):
    argv = ["eval", "--artifacts", str(tiny_artifacts), *args] if "--artifacts" not in args else ["eval", *args]
    try:
        rc = training_main(argv)
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    captured = capsys.readouterr()
    assert rc == code
    assert captured.out == ""
    last = captured.err.strip().splitlines()[-1]
    assert "error" in last and message in last
    assert len(captured.err.strip().splitlines()) == 1


def test_eval_cli_refuses_tampered_artifacts_in_one_line(tiny_artifacts, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_artifacts, bad)
    (bad / "labels.json").write_text("[]")
    assert training_main(["eval", "--artifacts", str(bad), "--ood", "noise"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "labels.json" in err[0]


def test_cross_fitted_acceptance_calibrates_on_one_half_and_measures_the_other():
    scores = np.arange(1.0, 11.0)  # even positions 1,3,5,7,9; odd positions 2,4,6,8,10
    # quantile 0.5: threshold 5 accepts 2 of the odd ones; threshold 6 accepts 3 of the even ones
    assert cross_fitted_acceptance(scores, 0.5) == pytest.approx((2 / 5 + 3 / 5) / 2)
    assert calibrate_threshold(scores[::2], 0.5) == 5.0
    assert cross_fitted_acceptance(np.array([1.0])) is None


def test_outlier_exposure_is_on_for_digit_classes_only(tiny_artifacts):
    from training.data.idx import FASHION_CLASSES
    from training.config import DIGIT_NEGATIVES, TrainConfig
    from training.train import resolve_negatives

    assert resolve_negatives(TrainConfig(), [str(d) for d in range(10)]).negatives == DIGIT_NEGATIVES
    assert resolve_negatives(TrainConfig(), FASHION_CLASSES).negatives == 0  # garments are no outliers of garments
    assert resolve_negatives(TrainConfig(negatives=7), FASHION_CLASSES).negatives == 7
    metadata = json.loads((tiny_artifacts / METADATA_FILE).read_text())
    assert metadata["training"]["config"]["negatives"] == DIGIT_NEGATIVES


@pytest.mark.parametrize("index_type", ["flat", "ivf"])
def test_prototypes_from_the_stored_gallery_equal_a_fresh_embedding_pass(tiny_artifacts, prepared_sample, tmp_path,
                                                                          index_type):
    """evaluate_and_finalize takes the class prototypes from the index's stored vectors instead of embedding the
    training split a second time: bit for bit the same prototypes, for an exact and for an IVF gallery."""
    from training.steps import build_gallery, evaluate_and_finalize, load_model
    from training.train import embed

    artifacts = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, artifacts)
    build_gallery(prepared_sample, artifacts, index_type, log=lambda _: None)
    metadata = evaluate_and_finalize(prepared_sample, artifacts, plots=False, log=lambda _: None)
    assert metadata.index["type"] == index_type
    fresh = embed(load_model(artifacts), prepared_sample.inputs("train"))
    names, expected = class_prototypes(fresh, [prepared_sample.classes[y] for y in prepared_sample.train_labels])
    recorded = metadata.open_set["prototypes"]
    assert recorded["labels"] == names
    np.testing.assert_array_equal(np.asarray(recorded["vectors"], dtype=np.float32), expected)
