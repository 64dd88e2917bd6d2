"""`python -m training enroll` fits and records the enrolled-class switch (handler.search.EnrolledSwitch), and the
served answer uses it; galleries without one answer by the vote alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch

from handler.artifacts import METADATA_FILE, ArtifactError, verify_artifacts
from handler.preprocessing import profile_of
from handler.artifacts import enrolled_switch
from handler.search import SWITCH_SECTION, GallerySearcher
from handler.service import EmbeddingService, Prepared
from training.__main__ import main as training_main
from training.enroll import SWITCH_BUDGET, WHITENING_RIDGE, calibration_images
from training.train import embed

from support.enroll_folder import write_new_folder


def enroll(*args: str) -> int:
    return training_main(["enroll", *args])


def read_meta(directory: Path) -> dict:
    return json.loads((directory / METADATA_FILE).read_text())


@pytest.fixture(scope="module")
def enrolled(tmp_path_factory, tiny_artifacts):
    """DIR2 after enrolling box (new) and 7 (existing) into tiny_artifacts."""
    work = tmp_path_factory.mktemp("enroll-switch")
    new = write_new_folder(work / "new")
    assert enroll("--artifacts", str(tiny_artifacts), "--data-source", f"folder:{new}", "--out", str(work / "out")) == 0
    return work / "out"


@pytest.fixture(scope="module")
def calibration_embeddings(enrolled):
    """The held-out images enroll calibrated tau on, embedded exactly as enroll embeds them."""
    meta = read_meta(enrolled)
    canvases, _ = calibration_images("mnist-sample", meta, None)
    model = torch.jit.load(str(enrolled / "model.pt"), map_location="cpu").eval()
    return embed(model, profile_of(meta).normalize(canvases))


def test_enrollment_records_the_switch_for_its_new_class(enrolled, tiny_artifacts):
    meta = read_meta(enrolled)
    assert SWITCH_SECTION not in read_meta(tiny_artifacts)
    verify_artifacts(enrolled)  # metadata.json holds the switch; every checksum still matches
    section = meta[SWITCH_SECTION]
    trained = [str(c) for c in meta["dataset"]["classes"]]
    assert section["enrolled"] == ["box"] and sorted(section["labels"]) == sorted([*trained, "box"])
    assert section["budget"] == SWITCH_BUDGET and section["ridge"] == WHITENING_RIDGE and section["tau"] >= 0
    assert section["calibration"]["source"] == "mnist-sample" and section["calibration"]["n"] == 1000
    switch = enrolled_switch(meta)
    assert switch is not None and switch.means.shape == (11, 32) and switch.whitening.shape == (32, 32)
    # The means and whitening are the gallery's: recomputed here from index.faiss and labels.json.
    index = faiss.read_index(str(enrolled / "index.faiss"))
    vectors = index.reconstruct_n(0, index.ntotal).astype(np.float64)
    labels = np.array(json.loads((enrolled / "labels.json").read_text()), dtype=object)
    for label, mean in zip(switch.labels, switch.means):
        np.testing.assert_allclose(mean, vectors[labels == label].mean(axis=0), rtol=0, atol=1e-12)
    resid = np.concatenate([vectors[labels == c] - vectors[labels == c].mean(axis=0) for c in trained])
    cov = resid.T @ resid / len(resid) + WHITENING_RIDGE * np.eye(32)
    np.testing.assert_allclose(switch.whitening.T @ cov @ switch.whitening, np.eye(32), atol=1e-8)
    # The served searcher carries it.
    service = EmbeddingService.from_dir(enrolled)
    assert service.searcher.switch is not None and service.searcher.switch.labels == switch.labels


def test_tau_lets_at_most_the_budget_of_held_out_trained_images_switch(enrolled, calibration_embeddings):
    meta = read_meta(enrolled)
    switch = enrolled_switch(meta)
    gaps, _ = switch.gaps(calibration_embeddings)
    share = float(np.mean(gaps > switch.tau))
    assert share <= SWITCH_BUDGET and share == pytest.approx(meta[SWITCH_SECTION]["calibration"]["switched"])
    ordered = np.sort(gaps)[::-1]
    assert switch.tau == max(ordered[int(np.floor(SWITCH_BUDGET * len(gaps)))], 0.0)


def switching_queries(enrolled: Path, calibration_embeddings: np.ndarray) -> np.ndarray:
    """Held-out digits, and points between the enrolled box items and those digits (some of which switch)."""
    box = np.asarray(json.loads((enrolled / "labels.json").read_text())) == "box"
    index = faiss.read_index(str(enrolled / "index.faiss"))
    mix = 0.5 * index.reconstruct_n(0, index.ntotal)[box][:, None, :] + 0.5 * calibration_embeddings[None, :50, :]
    mix = mix.reshape(-1, mix.shape[-1])
    return np.concatenate([calibration_embeddings, mix / np.linalg.norm(mix, axis=1, keepdims=True)]).astype(
        np.float32)


def test_served_answers_differ_from_the_vote_only_where_the_switch_fires(enrolled, tmp_path, calibration_embeddings):
    """A gallery without the section (here: the same artifacts with it removed) loads unchanged and answers by the
    vote; with it, answers change only in pred and confidence, only where the switch fires, to an enrolled class."""
    plain = tmp_path / "plain"
    shutil.copytree(enrolled, plain)
    meta = read_meta(plain)
    del meta[SWITCH_SECTION]
    (plain / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    without = EmbeddingService.from_dir(plain)
    assert without.searcher.switch is None
    queries = switching_queries(enrolled, calibration_embeddings)
    vote = without.searcher.classify(queries)
    reference = GallerySearcher.from_files(plain / "index.faiss", plain / "labels.json", k=meta["k"],
                                           threshold=meta["open_set"]["threshold"], score=meta["open_set"]["score"],
                                           kth=meta["open_set"].get("kth", 1),
                                           prototypes=np.asarray(meta["open_set"]["prototypes"]["vectors"], np.float32),
                                           search_params=meta["index"].get("search_params"))
    assert vote == reference.classify(queries)
    service = EmbeddingService.from_dir(enrolled)
    served = service.searcher
    fired = served.switched(queries)
    answers = served.classify(queries)
    # The request path (EmbeddingService.predict) answers these embeddings as classify does.
    service.embed = lambda batch: queries
    inked = np.arange(28 * 28, dtype=np.float32).reshape(1, 28, 28)  # not blank (blank inputs are always unknown)
    prepared = Prepared([None] * len(queries), list(range(len(queries))), [inked] * len(queries))
    assert service.predict(prepared)[0] == answers
    changed = [i for i in range(len(queries)) if fired[i] is not None]
    assert changed, "no query was switched"
    for i, (got, expected) in enumerate(zip(answers, vote)):
        if fired[i] is None:
            assert got == expected
        else:
            changed = ("pred", "nearest_label", "confidence")
            assert got["pred"] == "box" and {k: v for k, v in got.items() if k not in changed} == \
                {k: v for k, v in expected.items() if k not in changed}


def test_enrolling_only_existing_classes_records_no_switch(tiny_artifacts, tmp_path):
    new = write_new_folder(tmp_path / "new")
    shutil.rmtree(new / "box")
    assert enroll("--artifacts", str(tiny_artifacts), "--data-source", f"folder:{new}",
                  "--out", str(tmp_path / "out")) == 0
    assert SWITCH_SECTION not in read_meta(tmp_path / "out")
    assert EmbeddingService.from_dir(tmp_path / "out").searcher.switch is None


def test_re_enrolling_recomputes_the_switch(enrolled, tmp_path):
    new = write_new_folder(tmp_path / "new")
    shutil.rmtree(new / "box")
    for png in (new / "7").iterdir():  # other pictures of 7: the class mean moves
        png.rename(new / "7" / f"again-{png.name}")
    assert enroll("--artifacts", str(enrolled), "--data-source", f"folder:{new}", "--holdout", "0",
                  "--out", str(tmp_path / "again")) == 0
    before, after = enrolled_switch(read_meta(enrolled)), enrolled_switch(read_meta(tmp_path / "again"))
    assert after is not None and after.enrolled == ("box",) and after.labels == before.labels  # box is still enrolled
    seven = before.labels.index("7")
    assert not np.array_equal(after.means[seven], before.means[seven])
    np.testing.assert_array_equal(after.means[before.labels.index("box")], before.means[before.labels.index("box")])


def test_a_malformed_switch_is_refused_when_serving_and_enrolling(enrolled, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(enrolled, broken)
    meta = read_meta(broken)
    meta[SWITCH_SECTION]["whitening"] = meta[SWITCH_SECTION]["whitening"][:3]
    (broken / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="whitening must be"):
        EmbeddingService.from_dir(broken)
    new = write_new_folder(tmp_path / "new")
    capsys.readouterr()
    assert enroll("--artifacts", str(broken), "--data-source", f"folder:{new}", "--out", str(tmp_path / "out")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "enrolled_switch: enrolled switch: whitening must be" in err[0]
    assert not (tmp_path / "out").exists()


def test_the_report_answers_each_case_as_served(enrolled, calibration_embeddings):
    """python -m training report shows its worst errors from the answers the server gives, switch included."""
    from training.report import _case

    searcher = EmbeddingService.from_dir(enrolled).searcher
    queries = switching_queries(enrolled, calibration_embeddings)
    distances, ids, scores = searcher.search(queries)
    switched = searcher.switched(queries)
    served = searcher.classify(queries)
    cases = [_case(searcher, i, "0", distances[i], ids[i], scores[i], False, switched[i]) for i in range(len(queries))]
    assert any(c.pred == "box" for c in cases)
    assert [c.pred for c in cases] == [a.nearest_label for a in served]
