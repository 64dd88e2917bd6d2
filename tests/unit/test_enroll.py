"""`python -m training enroll`: new classes and examples in a copy of the gallery, without retraining."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import faiss
import numpy as np
import pytest

from handler.artifacts import METADATA_FILE, sha256_file, verify_artifacts
from handler.preprocessing import DIGITS
from handler.service import EmbeddingService
from serving.archive import build_mar
from training.__main__ import main as training_main
from training.index import build_index

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
    assert meta["threshold"] == meta["open_set"]["threshold"]
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
    assert check_artifacts(art)["preprocessing"]["version"] == DIGITS.version
