"""`python -m bench.fewshot` end to end on a tiny generated IDX dataset (`--data-source`), and its refusals. The figures
of a 1-epoch model on bars are meaningless; what is checked is that the benchmark trains on 0-7 only, enrolls the
drawn images of 8 and 9, and measures on the data's own held-out split."""

from __future__ import annotations

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
    (seed,) = result["seeds"]
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
    md = (root / "out" / "fewshot.md").read_text()
    assert f"`idx:{root / 'idx'}`" in md and f"{len(labels):,} test digits" in md


def test_the_base_model_is_cached_per_data_source(tiny_run, capsys):
    root, argv, _ = tiny_run
    (base,) = list((root / "work").glob("fewshot-seed0-e1-neg0-*/base"))
    stamp = (base / "metadata.json").stat().st_mtime_ns
    capsys.readouterr()
    assert fewshot.main(argv + ["--train-only"]) == 0
    assert "base model trained" not in capsys.readouterr().out
    assert (base / "metadata.json").stat().st_mtime_ns == stamp


def test_data_without_the_ten_digits_is_refused_in_one_line(tmp_path, capsys):
    for label in ("cat", "dog"):
        (tmp_path / "pets" / label).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(np.full((28, 28), 40 * i, np.uint8)).save(tmp_path / "pets" / label / f"{i}.png")
    assert fewshot.main(["--data-source", f"folder:{tmp_path / 'pets'}", "--work", str(tmp_path / "w"),
                         "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "few-shot needs the ten digit classes 0-9, found cat, dog" in err[0]
    assert not (tmp_path / "w").exists() and not (tmp_path / "out").exists()


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
