"""`python -m training enroll`: new classes and examples in a copy of the gallery, without retraining; the
enrolled-class switch (handler.search.EnrolledSwitch) it fits and records, which the served answer uses (galleries
without one answer by the vote alone); and bad input refused in one line with nothing written."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch

from handler.artifacts import METADATA_FILE, ArtifactError, sha256_file, verify_artifacts
from handler.artifacts import enrolled_switch
from handler.preprocessing import DIGITS, profile_of
from handler.metadata import SWITCH_SECTION, ModelMetadata, read_metadata
from handler.search import GallerySearcher
from handler.service import EmbeddingService, Prepared
from serving.archive import build_mar
from training.__main__ import main as training_main
from training.enroll import SWITCH_BUDGET, WHITENING_RIDGE, calibration_images
from training.index import build_index
from training.train import embed

from support.enroll_folder import write_new_folder


def snapshot(directory: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under `directory` (plus the names of directories)."""
    return {str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(directory.rglob("*"))}


def enroll(*args: str) -> int:
    return training_main(["enroll", *args])


@pytest.fixture(scope="module")
def enrolled(tmp_path_factory, tiny_artifacts):
    """(DIR before, DIR2, new folder) after one enrollment of box + 7 into a copy of tiny_artifacts."""
    work = tmp_path_factory.mktemp("enroll")
    new = write_new_folder(work / "new")
    before = snapshot(tiny_artifacts)
    assert enroll("--artifacts", str(tiny_artifacts), "--data-source", f"folder:{new}", "--out", str(work / "out")) == 0
    return before, work / "out", new


@pytest.fixture(scope="module")
def enrolled_dir(enrolled) -> Path:
    """DIR2 of that enrollment: box (new) and 7 (existing) enrolled into tiny_artifacts."""
    return enrolled[1]


def read_meta(directory: Path) -> dict:
    return json.loads((directory / METADATA_FILE).read_text())


def test_enroll_adds_items_labels_and_recalibrates(enrolled, tiny_artifacts):
    _, out, new = enrolled
    old_labels = json.loads((tiny_artifacts / "labels.json").read_text())
    labels = json.loads((out / "labels.json").read_text())
    meta = json.loads((out / METADATA_FILE).read_text())
    record = meta["enrollment"][-1]
    # 20% held out per class (at least one): box 6 -> 5 enrolled + 1, 7: 5 -> 4 + 1
    assert record["added"] == {"7": 4, "box": 5} and record["held_out"] == {"7": 1, "box": 1}
    assert record["new_labels"] == ["box"] and record["existing_labels"] == ["7"]
    assert labels[: len(old_labels)] == old_labels and sorted(labels[len(old_labels):]) == ["7"] * 4 + ["box"] * 5
    index = faiss.read_index(str(out / "index.faiss"))
    old_index = faiss.read_index(str(tiny_artifacts / "index.faiss"))
    assert index.ntotal == len(labels) == old_index.ntotal + 9
    np.testing.assert_array_equal(index.reconstruct_n(0, old_index.ntotal), old_index.reconstruct_n(0, old_index.ntotal))
    sources = json.loads((out / "sources.json").read_text())
    assert sources["kind"] == "file" and len(sources["ids"]) == len(labels)
    assert sources["ids"][0].startswith("mnist-sample#") and all(i.startswith(("7/", "box/")) for i in sources["ids"][-9:])
    assert "box" in meta["open_set"]["prototypes"]["labels"]
    calibration = meta["open_set"]["calibration"]
    assert calibration["n"] == 1000 + 2 and calibration["source"] == "mnist-sample"
    assert "threshold" not in meta and read_metadata(out).threshold == meta["open_set"]["threshold"]
    assert meta["dataset"] == json.loads((tiny_artifacts / METADATA_FILE).read_text())["dataset"]


def test_enrolled_images_answer_with_the_new_label(enrolled):
    _, out, new = enrolled
    meta = json.loads((out / METADATA_FILE).read_text())
    files = [f for f in json.loads((out / "sources.json").read_text())["ids"][-9:] if f.startswith("box/")]
    service = EmbeddingService.from_dir(out)
    answers, _ = service.answer([(new / f).read_bytes() for f in files])
    assert [a["pred"] for a in answers] == ["box"] * len(files)
    assert meta["enrollment"][-1]["held_out"]["box"] == 1


def test_source_directory_is_byte_identical_and_output_verifies(enrolled, tiny_artifacts):
    before, out, _ = enrolled
    assert snapshot(tiny_artifacts) == before
    verify_artifacts(out)
    assert sha256_file(out / "model.pt") == sha256_file(tiny_artifacts / "model.pt")
    assert sha256_file(out / "model.onnx") == sha256_file(tiny_artifacts / "model.onnx")
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]


def test_enrolled_artifacts_archive(enrolled, tmp_path):
    _, out, _ = enrolled
    mar = build_mar(out, tmp_path / "store", version="2.0")
    names = set(zipfile.ZipFile(mar).namelist())
    assert {"index.faiss", "labels.json", "sources.json", "metadata.json", "model.pt", "model.onnx"} <= names


def test_ivf_gallery_is_rebuilt(tmp_path, tiny_artifacts):
    art = tmp_path / "ivf"
    shutil.copytree(tiny_artifacts, art)
    old = faiss.read_index(str(art / "index.faiss"))
    faiss.write_index(build_index(old.reconstruct_n(0, old.ntotal), "ivf"), str(art / "index.faiss"))
    meta = json.loads((art / METADATA_FILE).read_text())
    meta["index"].update(type="ivf", search_params={"nprobe": 16})
    meta["sha256"]["index.faiss"] = sha256_file(art / "index.faiss")
    (art / METADATA_FILE).write_text(json.dumps(meta))
    new = write_new_folder(tmp_path / "new")
    assert enroll("--artifacts", str(art), "--data-source", f"folder:{new}", "--out", str(tmp_path / "out"),
                  "--holdout", "0") == 0
    index = faiss.read_index(str(tmp_path / "out" / "index.faiss"))
    info = json.loads((tmp_path / "out" / METADATA_FILE).read_text())["index"]
    assert isinstance(index, faiss.IndexIVF) and index.ntotal == old.ntotal + 11
    assert info["rebuilt"] is True and info["size"] == index.ntotal and info["recall_at_1"] > 0.9
    labels = json.loads((tmp_path / "out" / "labels.json").read_text())
    answers, _ = EmbeddingService.from_dir(tmp_path / "out").answer([(new / "box" / "box0.png").read_bytes()])
    assert answers[0]["pred"] == "box" and labels.count("box") == 6


# --- bad input: one line naming the file or reason, exit 1, nothing written ----------------------------------

def _bad_image(art: Path, new: Path) -> tuple[Path, str]:
    (new / "box" / "broken.png").write_bytes(b"\x89PNG not really")
    return art, "broken.png"


def _empty_class(art: Path, new: Path) -> tuple[Path, str]:
    (new / "empty").mkdir()
    return art, "empty: no images"


def _model_differs(art: Path, new: Path) -> tuple[Path, str]:
    with open(art / "model.pt", "ab") as fh:
        fh.write(b"\0")
    return art, "model.pt: SHA-256"


def _preprocessing_differs(art: Path, new: Path) -> tuple[Path, str]:
    meta = json.loads((art / METADATA_FILE).read_text())
    meta["preprocessing"]["version"] = "0"
    (art / METADATA_FILE).write_text(json.dumps(meta))
    return art, "digits preprocessing version '0'"


def _unknown_profile(art: Path, new: Path) -> tuple[Path, str]:
    meta = json.loads((art / METADATA_FILE).read_text())
    meta["preprocessing"]["profile"] = "sketches"
    (art / METADATA_FILE).write_text(json.dumps(meta))
    return art, "preprocessing profile 'sketches'"


def _statistics_differ(art: Path, new: Path) -> tuple[Path, str]:
    meta = json.loads((art / METADATA_FILE).read_text())
    meta["preprocessing"]["std"] = 0.5
    (art / METADATA_FILE).write_text(json.dumps(meta))
    return art, "built with preprocessing std=0.5"


def _index_from_other_run(art: Path, new: Path) -> tuple[Path, str]:
    index = faiss.read_index(str(art / "index.faiss"))
    faiss.write_index(build_index(index.reconstruct_n(0, index.ntotal)[::-1].copy()), str(art / "index.faiss"))
    return art, "index.faiss: SHA-256"


@pytest.mark.parametrize(("break_it", "extra", "expected"), [
    (_bad_image, [], None),
    (_empty_class, [], None),
    (_model_differs, [], None),
    (_preprocessing_differs, [], None),
    (_unknown_profile, [], None),
    (_statistics_differ, [], None),
    (_index_from_other_run, [], None),
    (None, ["--new-only"], "label '7' already exists"),
    ("same", [], "is the --artifacts directory"),
    ("nested", [], "are nested"),
], ids=["unreadable-image", "empty-class", "model-sha", "preprocessing", "unknown-profile", "statistics", "index-sha", "new-only", "out-is-in",
        "out-nested"])
def test_bad_input_one_line_and_nothing_written(tmp_path, tiny_artifacts, capsys, break_it, extra, expected):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts, art)
    new = write_new_folder(tmp_path / "new")
    out = tmp_path / "out"
    if callable(break_it):
        art, expected = break_it(art, new)
    elif break_it == "same":
        out = art
    elif break_it == "nested":
        out = art / "v2"
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert enroll("--artifacts", str(art), "--data-source", f"folder:{new}", "--out", str(out), *extra) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("training enroll: error: ") and expected in err, err
    assert snapshot(tmp_path) == before  # no DIR2, no hidden staging directory, DIR and NEW as they were


def test_artifacts_from_before_profiles_are_digits_and_accepted(tmp_path, tiny_artifacts):
    """metadata.json written before preprocessing profiles existed has no "profile": it is the digits one."""
    from training.enroll import check_artifacts

    art = tmp_path / "art"
    shutil.copytree(tiny_artifacts, art)
    meta = json.loads((art / METADATA_FILE).read_text())
    del meta["preprocessing"]["profile"]
    (art / METADATA_FILE).write_text(json.dumps(meta))
    assert check_artifacts(art).preprocessing["version"] == DIGITS.version


# --- the enrolled-class switch: fitted, recorded and served ------------------------------------------------------

@pytest.fixture(scope="module")
def calibration_embeddings(enrolled_dir):
    """The held-out images enroll calibrated tau on, embedded exactly as enroll embeds them."""
    meta = read_meta(enrolled_dir)
    canvases, _ = calibration_images("mnist-sample", ModelMetadata.from_json(meta), None)
    model = torch.jit.load(str(enrolled_dir / "model.pt"), map_location="cpu").eval()
    return embed(model, profile_of(meta["preprocessing"]).normalize(canvases))


def test_enrollment_records_the_switch_for_its_new_class(enrolled_dir, tiny_artifacts):
    meta = read_meta(enrolled_dir)
    assert SWITCH_SECTION not in read_meta(tiny_artifacts)
    verify_artifacts(enrolled_dir)  # metadata.json holds the switch; every checksum still matches
    section = meta[SWITCH_SECTION]
    trained = [str(c) for c in meta["dataset"]["classes"]]
    assert section["enrolled"] == ["box"] and sorted(section["labels"]) == sorted([*trained, "box"])
    assert section["budget"] == SWITCH_BUDGET and section["ridge"] == WHITENING_RIDGE and section["tau"] >= 0
    assert section["calibration"]["source"] == "mnist-sample" and section["calibration"]["n"] == 1000
    switch = enrolled_switch(ModelMetadata.from_json(meta))
    assert switch is not None and switch.means.shape == (11, 32) and switch.whitening.shape == (32, 32)
    # The means and whitening are the gallery's: recomputed here from index.faiss and labels.json.
    index = faiss.read_index(str(enrolled_dir / "index.faiss"))
    vectors = index.reconstruct_n(0, index.ntotal).astype(np.float64)
    labels = np.array(json.loads((enrolled_dir / "labels.json").read_text()), dtype=object)
    for label, mean in zip(switch.labels, switch.means):
        np.testing.assert_allclose(mean, vectors[labels == label].mean(axis=0), rtol=0, atol=1e-12)
    resid = np.concatenate([vectors[labels == c] - vectors[labels == c].mean(axis=0) for c in trained])
    cov = resid.T @ resid / len(resid) + WHITENING_RIDGE * np.eye(32)
    np.testing.assert_allclose(switch.whitening.T @ cov @ switch.whitening, np.eye(32), atol=1e-8)
    # The served searcher carries it.
    service = EmbeddingService.from_dir(enrolled_dir)
    assert service.searcher.switch is not None and service.searcher.switch.labels == switch.labels


def test_tau_lets_at_most_the_budget_of_held_out_trained_images_switch(enrolled_dir, calibration_embeddings):
    meta = read_meta(enrolled_dir)
    switch = enrolled_switch(ModelMetadata.from_json(meta))
    gaps, _ = switch.gaps(calibration_embeddings)
    share = float(np.mean(gaps > switch.tau))
    assert share <= SWITCH_BUDGET and share == pytest.approx(meta[SWITCH_SECTION]["calibration"]["switched"])
    ordered = np.sort(gaps)[::-1]
    assert switch.tau == max(ordered[int(np.floor(SWITCH_BUDGET * len(gaps)))], 0.0)


def switching_queries(enrolled_dir: Path, calibration_embeddings: np.ndarray) -> np.ndarray:
    """Held-out digits, and points between the enrolled box items and those digits (some of which switch)."""
    box = np.asarray(json.loads((enrolled_dir / "labels.json").read_text())) == "box"
    index = faiss.read_index(str(enrolled_dir / "index.faiss"))
    mix = 0.5 * index.reconstruct_n(0, index.ntotal)[box][:, None, :] + 0.5 * calibration_embeddings[None, :50, :]
    mix = mix.reshape(-1, mix.shape[-1])
    return np.concatenate([calibration_embeddings, mix / np.linalg.norm(mix, axis=1, keepdims=True)]).astype(
        np.float32)


def test_served_answers_differ_from_the_vote_only_where_the_switch_fires(enrolled_dir, tmp_path,
                                                                          calibration_embeddings):
    """A gallery without the section (here: the same artifacts with it removed) loads unchanged and answers by the
    vote; with it, answers change only in pred and confidence, only where the switch fires, to an enrolled class."""
    plain = tmp_path / "plain"
    shutil.copytree(enrolled_dir, plain)
    meta = read_meta(plain)
    del meta[SWITCH_SECTION]
    (plain / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    without = EmbeddingService.from_dir(plain)
    assert without.searcher.switch is None
    queries = switching_queries(enrolled_dir, calibration_embeddings)
    vote = without.searcher.classify(queries)
    reference = GallerySearcher.from_files(plain / "index.faiss", plain / "labels.json", k=meta["k"],
                                           threshold=meta["open_set"]["threshold"], score=meta["open_set"]["score"],
                                           kth=meta["open_set"].get("kth", 1),
                                           prototypes=np.asarray(meta["open_set"]["prototypes"]["vectors"], np.float32),
                                           search_params=meta["index"].get("search_params"))
    assert vote == reference.classify(queries)
    service = EmbeddingService.from_dir(enrolled_dir)
    served = service.searcher
    fired = served.switched(queries)
    answers = served.classify(queries)
    # The request path (EmbeddingService.predict) answers these embeddings as classify does.
    service.embed = lambda batch: queries
    inked = np.arange(28 * 28, dtype=np.float32).reshape(1, 28, 28)  # not blank (blank inputs are always unknown)
    prepared = Prepared([None] * len(queries), list(range(len(queries))), [inked] * len(queries))
    assert [replace(a, model_digest=None) for a in service.predict(prepared)[0]] == answers
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


def test_re_enrolling_recomputes_the_switch(enrolled_dir, tmp_path):
    new = write_new_folder(tmp_path / "new")
    shutil.rmtree(new / "box")
    for png in (new / "7").iterdir():  # other pictures of 7: the class mean moves
        png.rename(new / "7" / f"again-{png.name}")
    assert enroll("--artifacts", str(enrolled_dir), "--data-source", f"folder:{new}", "--holdout", "0",
                  "--out", str(tmp_path / "again")) == 0
    before, after = enrolled_switch(read_metadata(enrolled_dir)), enrolled_switch(read_metadata(tmp_path / "again"))
    assert after is not None and after.enrolled == ("box",) and after.labels == before.labels  # box is still enrolled
    seven = before.labels.index("7")
    assert not np.array_equal(after.means[seven], before.means[seven])
    np.testing.assert_array_equal(after.means[before.labels.index("box")], before.means[before.labels.index("box")])


def test_a_malformed_switch_is_refused_when_serving_and_enrolling(enrolled_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(enrolled_dir, broken)
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


def test_the_report_answers_each_case_as_served(enrolled_dir, calibration_embeddings):
    """python -m training report shows its worst errors from the answers the server gives, switch included."""
    from training.report import _case

    searcher = EmbeddingService.from_dir(enrolled_dir).searcher
    queries = switching_queries(enrolled_dir, calibration_embeddings)
    distances, ids, scores = searcher.search(queries)
    switched = searcher.switched(queries)
    served = searcher.classify(queries)
    cases = [_case(searcher, i, "0", distances[i], ids[i], scores[i], False, switched[i]) for i in range(len(queries))]
    assert any(c.pred == "box" for c in cases)
    assert [c.pred for c in cases] == [a.nearest_label for a in served]
