"""bench.fewshot's choice of held-out classes, targets and report names, and its reports of committed records:
no data, no training."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import fewshot, output
from settings import REPO

RESULTS = REPO / "bench" / "results"
FASHION = fewshot.FASHION_CLASSES
DIGITS = fewshot.DIGIT_CLASSES


def test_fashion_classes_match_the_idx_loader():
    from training.data.idx import FASHION_CLASSES

    assert fewshot.FASHION_CLASSES == FASHION_CLASSES


def test_digits_hold_out_8_and_9_and_train_on_0_to_7_in_any_class_order():
    bench, splits = fewshot.select(DIGITS, None)
    assert (bench.name, bench.target_new_accuracy, bench.target_old_drop) == ("fewshot", 0.90, 0.005)
    assert bench.synthetic_negatives
    assert splits == [(DIGITS[:8], ("8", "9"))]
    shuffled = ("9", "0", "8", "1", "2", "3", "4", "5", "6", "7")
    assert fewshot.select(shuffled, None)[1] == [(("0", "1", "2", "3", "4", "5", "6", "7"), ("8", "9"))]


def test_fashion_holds_out_an_easy_a_medium_and_a_hard_pair_each_against_the_other_eight():
    bench, splits = fewshot.select(FASHION, None)
    assert (bench.name, bench.target_new_accuracy, bench.target_old_drop) == ("fewshot-fashion", 0.85, 0.01)
    assert not bench.synthetic_negatives
    assert [new for _, new in splits] == [("Trouser", "Bag"), ("Sandal", "Sneaker"), ("Shirt", "Pullover")]
    for base, new in splits:
        assert len(base) == 8 and not set(base) & set(new)
        assert [c for c in FASHION if c in base] == list(base)  # the data's order: label i of the base is base[i]


def test_new_classes_are_parsed_in_groups_and_keep_inner_spaces():
    assert fewshot.parse_new_classes("Trouser+Bag, Ankle boot + Sandal") == (
        ("Trouser", "Bag"), ("Ankle boot", "Sandal"))
    assert fewshot.parse_new_classes("Coat") == (("Coat",),)
    bench, splits = fewshot.select(FASHION, "Ankle boot+Sneaker,Coat")
    assert bench.name == "fewshot-fashion"
    assert splits[0] == (("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Bag"),
                         ("Ankle boot", "Sneaker"))
    assert splits[1][1] == ("Coat",) and len(splits[1][0]) == 9


@pytest.mark.parametrize("text, fragment", [
    ("", "expected class names joined by +"),
    ("Trouser+,Bag", "expected class names joined by +"),
    ("Trouser+Bag,,Coat", "expected class names joined by +"),
    ("Trousers+Bag", "'Trousers' is not a class of the data; its classes are T-shirt/top, Trouser"),
    ("trouser+Bag", "'trouser' is not a class"),
    ("Bag+Bag", "Bag+Bag names a class twice"),
    ("T-shirt/top+Bag", "'T-shirt/top' cannot be enrolled"),
    ("Trouser+Bag,Trouser+Bag", "a group is given twice"),
    ("+".join(FASHION[1:]), "leaves 1 class to train on"),
])
def test_bad_new_classes_are_refused_in_one_line(text, fragment):
    with pytest.raises(fewshot.SelectionError) as caught:
        fewshot.select(FASHION, text)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_other_data_needs_new_classes_and_gets_a_report_of_its_own():
    with pytest.raises(fewshot.SelectionError, match="no default classes to hold out .* cat, dog, fox: pass "
                                                     "--new-classes"):
        fewshot.select(("cat", "dog", "fox"), None)
    bench, splits = fewshot.select(("cat", "dog", "fox"), "fox")
    assert bench.name not in ("fewshot", "fewshot-fashion") and not bench.synthetic_negatives
    assert splits == [(("cat", "dog"), ("fox",))]


def test_each_pair_and_recipe_has_its_own_work_directory(tmp_path):
    source = "idx:/usr/share/datasets/fashion-mnist"
    dirs = {fewshot.work_dir(tmp_path, 0, 4, None, source, new)
            for new in (("Trouser", "Bag"), ("Sandal", "Sneaker"), ("Shirt", "Pullover"))}
    assert len(dirs) == 3
    assert fewshot.work_dir(tmp_path, 0, 4, None, source, ("Ankle boot", "Bag")).name.endswith("-new-ankle-boot+bag")
    assert fewshot.work_dir(tmp_path, 0, 4, None, source, ("Trouser", "Bag"), "bf16") not in dirs
    # the digit benchmark's directories keep their names, so existing caches stay valid
    assert fewshot.work_dir(tmp_path, 0, 12, None, "mnist-sample") == tmp_path / "fewshot-seed0-e12"


def test_class_lists_read_as_ranges_or_names():
    assert fewshot.class_list(DIGITS[:8]) == "0-7"
    assert fewshot.class_list(("8", "9")) == "8 and 9"
    assert fewshot.class_list(("Shirt", "Pullover")) == "Shirt and Pullover"
    assert fewshot.class_list(("Coat", "Bag", "Dress")) == "Coat, Bag, Dress"
    assert fewshot.class_list(("1", "3", "4")) == "1, 3, 4"


def test_the_committed_digit_record_from_before_groups_still_renders():
    summary = json.loads(output.summary_path(RESULTS, "fewshot").read_text())
    text = fewshot.markdown(summary)
    assert text.startswith("# Few-shot enrollment\n")
    assert "| accuracy on held-out 8 and 9 after enrolling 10 of each |" in text
    assert "## Seed 0" in text and "accuracy on 0-7" in text


@pytest.mark.skipif(not output.summary_path(RESULTS, "fewshot-fashion").exists(), reason="no Fashion-MNIST results")
def test_the_committed_fashion_summary_renders_its_report():
    summary = json.loads(output.summary_path(RESULTS, "fewshot-fashion").read_text())
    assert output.compact(summary) == summary
    assert fewshot.markdown(summary) == (RESULTS / "fewshot-fashion.md").read_text()
    done = [(tuple(g["new"]), r["seed"]) for g in summary["groups"] for r in g["seeds"]]
    assert len(done) == len(set(done)) and (len(done) == summary["planned_runs"]) == summary["complete"]


def test_the_training_subset_is_the_same_few_of_each_class_for_every_run():
    labels = np.array([0] * 5 + [1] * 2 + [2] * 10)
    rng = np.random.default_rng(7)
    labels = labels[rng.permutation(len(labels))]
    keep = fewshot.training_subset(labels, 3)
    assert list(keep) == sorted(keep) and len(set(keep)) == len(keep)
    assert [int(np.sum(labels[keep] == y)) for y in (0, 1, 2)] == [3, 2, 3]  # a class with fewer keeps all
    assert list(fewshot.training_subset(labels, 3)) == list(keep)
    assert list(fewshot.training_subset(labels, 3, seed=1)) != list(keep)
    assert list(fewshot.training_subset(labels, None)) == list(range(len(labels)))


def test_the_nearest_prototype_diagnostic_reads_the_recorded_prototypes():
    metadata = {"open_set": {"prototypes": {"labels": ["Bag", "Coat"], "vectors": [[1.0, 0.0], [0.0, 1.0]]}}}
    embeddings = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.59]], np.float32)
    assert list(fewshot.nearest_prototype(metadata, embeddings)) == ["Bag", "Coat", "Bag"]
    assert fewshot.nearest_prototype({"open_set": {"score": "top1_distance"}}, embeddings) is None


def test_resume_carries_over_the_runs_of_the_same_data_and_recipe_only():
    recipe = {"epochs": 2, "precision": "fp32", "threads": 1, "shots": 10, "draws": 3, "ceiling": True,
              "seeds": [0, 1, 2], "train_per_class": 1000}
    prior = {"data": "idx:/f", "recipe": {**recipe, "seeds": [0]},
             "groups": [{"new": ["Trouser", "Bag"], "seeds": [{"seed": 0, "x": 1}]},
                        {"new": ["Shirt", "Pullover"], "seeds": []}]}
    assert fewshot.carried_runs(prior, "idx:/f", recipe) == {(("Trouser", "Bag"), 0): {"seed": 0, "x": 1}}
    assert fewshot.carried_runs(prior, "idx:/other", recipe) == {}
    assert fewshot.carried_runs(prior, "idx:/f", {**recipe, "epochs": 3}) == {}
    assert fewshot.carried_runs(None, "idx:/f", recipe) == {}
    old_digit_record = {"data": "mnist-sample", "seeds": [{"seed": 0}]}  # from before groups: nothing to carry
    assert fewshot.carried_runs(old_digit_record, "mnist-sample", recipe) == {}
