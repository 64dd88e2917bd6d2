"""`python -m bench.fewshot` end to end on tiny generated IDX datasets (`--data-source`), and its refusals. The figures
of a 1-epoch model on bars are meaningless; what is checked is that the benchmark trains on the classes it keeps
only (0-7 for digits, the other eight for a Fashion-MNIST pair), enrolls the drawn images of the held-out ones, and
measures on the data's own held-out split."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from bench import fewshot
from support.idx_fixtures import make_idx_dir


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fewshot")
    arrays = make_idx_dir(root / "idx", n_train=400, n_test=100)
    argv = ["--data-source", f"idx:{root / 'idx'}", "--epochs", "1", "--shots", "3", "--draws", "1", "--negatives", "0",
            "--seeds", "0", "--work", str(root / "work"), "--out", str(root / "out")]
    assert fewshot.main(argv) == 0
    return root, argv, arrays


def test_trains_on_0_to_7_of_the_given_data_and_measures_on_its_held_out_split(tiny_run, written):
    root, _, arrays = tiny_run
    result = written(root / "out", "fewshot", fewshot.markdown)
    assert result["data"] == f"idx:{root / 'idx'}"
    (group,) = result["groups"]
    assert (group["base"], group["new"]) == ([str(d) for d in range(8)], ["8", "9"])
    (seed,) = group["seeds"]
    assert seed["base_training"]["config"]["negatives"] == 0  # --negatives 0; the default is the digit model's 4,000
    labels = arrays["test_labels"]
    assert seed["held_out"] == {"old": int(np.sum(labels < 8)), "new": int(np.sum(labels >= 8))}
    assert seed["base_training"]["classes"] == [str(d) for d in range(8)]
    assert seed["base_training"]["train"] == int(np.sum(arrays["train_labels"] < 8))
    names = [r["name"] for r in seed["after"]]
    n_new = int(min(np.sum(arrays["train_labels"] == d) for d in (8, 9)))
    assert names == ["shots3-draw0", "shots3-draw0-holdout", f"all{n_new}"]
    assert seed["after"][0]["enrolled"] == {"8": 3, "9": 3}
    for label, picked in seed["after"][0]["new_images"].items():  # the drawn images are that class's
        assert len(picked) == 3 and all(arrays["train_labels"][i] == int(label) for i in picked)
    assert seed["before"]["gallery"] == seed["base_training"]["train"]
    assert len(seed["after"][-1]["new_images"]["8"]) == n_new  # the every-image run's ids: in raw/ only
    summary = json.loads((root / "out" / "fewshot.summary.json").read_text())
    assert "new_images" not in summary["groups"][0]["seeds"][0]["after"][-1]
    assert summary["groups"][0]["seeds"][0]["after"][0]["new_images"] == seed["after"][0]["new_images"]
    md = (root / "out" / "fewshot.md").read_text()
    assert f"`idx:{root / 'idx'}`" in md and f"{len(labels):,} test images" in md
    assert "accuracy on held-out 8 and 9 after enrolling 3 of each" in md and "target within 0.5 pt" in md


def test_the_base_model_is_cached_per_data_source(tiny_run, capsys):
    root, argv, _ = tiny_run
    (base,) = list((root / "work").glob("fewshot-seed0-e1-neg0-*/base"))
    stamp = (base / "metadata.json").stat().st_mtime_ns
    capsys.readouterr()
    assert fewshot.main(argv + ["--train-only"]) == 0
    assert "base model trained" not in capsys.readouterr().out
    assert (base / "metadata.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("extra, fragment", [
    ([], "no default classes to hold out for data with the classes cat, dog: pass --new-classes A+B"),
    (["--new-classes", "cat+cow"], "'cow' is not a class of the data; its classes are cat, dog"),
    (["--new-classes", "cat"], "leaves 1 class to train on"),
])
def test_classes_the_data_cannot_hold_out_are_refused_in_one_line(tmp_path, capsys, extra, fragment):
    for label in ("cat", "dog"):
        (tmp_path / "pets" / label).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(np.full((28, 28), 40 * i, np.uint8)).save(tmp_path / "pets" / label / f"{i}.png")
    assert fewshot.main(["--data-source", f"folder:{tmp_path / 'pets'}", "--work", str(tmp_path / "w"),
                         "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m bench fewshot: error: ") and fragment in err[0]
    assert not (tmp_path / "w").exists() and not (tmp_path / "out").exists()


def test_an_out_folder_that_cannot_be_made_is_refused_before_the_data_is_read(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert fewshot.main(["--out", str(tmp_path / "file" / "out"), "--data-source", "idx:/nowhere"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    out, file = tmp_path / "file" / "out", tmp_path / "file"
    assert err == [f"python -m bench fewshot: error: --out {out}: {file} is not a folder"]


def test_unreadable_data_is_refused_in_one_line(tmp_path, capsys):
    assert fewshot.main(["--data-source", f"idx:{tmp_path / 'missing'}", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m bench fewshot: error: ") and "missing" in err[0]


@pytest.fixture(scope="module")
def fashion_run(tmp_path_factory):
    """A Fashion-MNIST-shaped IDX set (the loader names it by its path), one pair held out, the network trained on
    20 images of each class."""
    root = tmp_path_factory.mktemp("fewshot-fashion")
    arrays = make_idx_dir(root / "fashion-idx", n_train=400, n_test=100)
    argv = ["--data-source", f"idx:{root / 'fashion-idx'}", "--new-classes", "Sandal+Sneaker", "--epochs", "1",
            "--train-per-class", "20", "--shots", "3", "--draws", "2", "--no-ceiling", "--threads", "1", "--seeds", "0",
            "--work", str(root / "work"), "--out", str(root / "out")]
    assert fewshot.main(argv) == 0
    return root, arrays, argv


def test_a_fashion_pair_is_held_out_of_training_and_enrolled_with_full_frame_preprocessing(fashion_run, written):
    root, arrays, _ = fashion_run
    result = written(root / "out", "fewshot-fashion", fewshot.markdown)
    assert result["complete"] and result["planned_runs"] == 1 and result["kind"] == "fashion-mnist"
    assert result["targets"] == {"new_accuracy_min": 0.85, "old_accuracy_max_drop": 0.01}
    (group,) = result["groups"]
    assert group["new"] == ["Sandal", "Sneaker"]  # labels 5 and 7
    assert group["base"] == ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Shirt", "Bag", "Ankle boot"]
    (seed,) = group["seeds"]
    kept = ~np.isin(arrays["train_labels"], [5, 7])
    assert seed["base_training"]["train"] == int(kept.sum())  # the gallery: every training image of the eight
    assert seed["base_training"]["trained_on"] == 8 * 20  # the network: 20 of each
    assert seed["base_training"]["preprocessing"] == "full-frame"
    assert seed["base_training"]["config"]["negatives"] == 0 and seed["base_training"]["config"]["hflip"] is True
    test = arrays["test_labels"]
    new_test = np.isin(test, [5, 7])
    assert seed["held_out"] == {"old": int((~new_test).sum()), "new": int(new_test.sum())}
    assert [r["name"] for r in seed["after"]] == ["shots3-draw0", "shots3-draw1", "shots3-draw0-holdout"]
    assert seed["after"][0]["enrolled"] == {"Sandal": 3, "Sneaker": 3}
    for r in seed["after"]:  # the diagnostic beside the served answer: nearest recorded class prototype
        assert 0.0 <= r["new"]["prototype_accuracy"] <= 1.0 and 0.0 <= r["old"]["prototype_accuracy"] <= 1.0
    assert set(seed["summary"]["new_prototype_accuracy"]) == {"mean", "min", "max"}
    for r in seed["after"]:  # Sandal and Sneaker are enrolled classes: the enrollment records a switch, served
        assert r["switch_tau"] >= 0 and all(0.0 <= r[g][key] <= 1.0 for g in ("new", "old")
                                            for key in ("switched", "vote_accuracy"))
    for key in ("new_vote_accuracy", "new_switched", "old_switched"):
        assert set(seed["summary"][key]) == {"mean", "min", "max"} and key in group["spread"]
    for label, picked in seed["after"][1]["new_images"].items():
        assert all(arrays["train_labels"][i] == {"Sandal": 5, "Sneaker": 7}[label] for i in picked)
    md = (root / "out" / "fewshot-fashion.md").read_text()
    assert md.startswith("# Few-shot enrollment on Fashion-MNIST\n") and "PARTIAL" not in md
    assert "| Sandal + Sneaker | 0 |" in md and "the network trained on 20 training images of each class" in md
    assert "Accuracy is the served answer: the k-NN vote, or the enrolled class the enrolled-class switch" in md
    assert "k-NN vote alone (without the enrolled-class switch)" in md
    assert "| switch: tau, answers it changed: new, trained |" in md


def test_each_data_source_has_its_own_base_model_and_a_changed_one_is_not_reused(tiny_run, tmp_path):
    root, _, _ = tiny_run
    assert fewshot.work_dir(tmp_path, 0, 1, 0, "mnist-sample") == tmp_path / "fewshot-seed0-e1-neg0"
    dirs = {fewshot.work_dir(tmp_path, 0, 1, 0, source) for source in ("mnist-sample", "idx:/a", "idx:/b")}
    assert len(dirs) == 3
    (base,) = list((root / "work").glob("fewshot-seed0-e1-neg0-*/base"))
    assert fewshot.cached_base_matches(base, f"idx:{root / 'idx'}")
    make_idx_dir(tmp_path / "other", n_train=300, n_test=100)  # the same kind of data, another size
    assert not fewshot.cached_base_matches(base, f"idx:{tmp_path / 'other'}")
    assert not fewshot.cached_base_matches(tmp_path / "nothing", f"idx:{root / 'idx'}")


def test_a_sweep_cut_short_says_so_at_the_top(fashion_run):
    root, _, _ = fashion_run
    record = json.loads((root / "out" / "raw" / "fewshot-fashion.json").read_text())
    record.update(complete=False, planned_runs=9)
    assert fewshot.markdown(record).splitlines()[2] == (
        "**PARTIAL: 1 of 9 runs finished** (the sweep stopped or is still running).")


def test_resume_keeps_the_finished_runs_and_measures_only_the_missing_ones(fashion_run, tmp_path, capsys, written):
    root, _, argv = fashion_run
    shutil.copytree(root / "out", tmp_path / "out")
    argv = [*argv[:argv.index("--out")], "--out", str(tmp_path / "out"), "--seeds", "0,1", "--resume"]
    capsys.readouterr()
    assert fewshot.main(argv) == 0
    log = capsys.readouterr().out
    assert "Sandal+Sneaker seed 0:" not in log and "Sandal+Sneaker seed 1:" in log  # only seed 1 was measured
    result = written(tmp_path / "out", "fewshot-fashion", fewshot.markdown)
    before = json.loads((root / "out" / "raw" / "fewshot-fashion.json").read_text())
    assert result["groups"][0]["seeds"][0] == before["groups"][0]["seeds"][0]
    assert [r["seed"] for r in result["groups"][0]["seeds"]] == [0, 1] and result["complete"]
    assert result["resumed"]["runs"] == 1 and result["resumed"]["command"] == before["command"]
    assert "1 run(s) carried over (--resume)" in (tmp_path / "out" / "fewshot-fashion.md").read_text()
