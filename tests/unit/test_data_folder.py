"""load_image_folder on PNG/JPEG trees generated here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.image_tree import drawing, make_tree

from training.data import DataError, load_dataset
from training.data.folder import load_image_folder


def test_string_labels_png_and_jpeg(tmp_path):
    root = make_tree(tmp_path / "pets", {"seven": 6, "cat": 10})
    ds = load_image_folder(root)
    assert ds.classes == ("cat", "seven")
    assert ds.name == "pets"
    assert ds.train_images.dtype == np.uint8 and ds.train_images.shape[1:] == (28, 28)
    assert np.bincount(ds.train_labels).tolist() == [8, 5]
    assert np.bincount(ds.test_labels).tolist() == [2, 1]
    assert ds.train_images[:, 0, 0].max() == 0 and ds.train_images.max() == 255  # light strokes on black


def test_split_is_deterministic_and_seeded(tmp_path):
    root = make_tree(tmp_path / "digits", {"cat": 10, "seven": 10})
    first, second = load_image_folder(root), load_dataset(f"folder:{root}")
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(first, field), getattr(second, field))
    other = load_image_folder(root, seed=1)
    assert not np.array_equal(first.test_images, other.test_images)


def test_single_image_class_goes_to_train(tmp_path):
    root = make_tree(tmp_path / "r", {"cat": 2, "seven": 1})
    ds = load_image_folder(root)
    assert ds.train_labels.tolist() == [0, 1] and ds.test_labels.tolist() == [0]


def test_only_single_image_classes_cannot_be_split(tmp_path):
    root = make_tree(tmp_path / "r", {"cat": 1, "seven": 1})
    with pytest.raises(DataError, match="too few images"):
        load_image_folder(root)


def test_corrupt_image_names_the_file(tmp_path):
    root = make_tree(tmp_path / "r", {"cat": 3, "seven": 3})
    (root / "seven" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    with pytest.raises(DataError) as excinfo:
        load_image_folder(root)
    message = str(excinfo.value)
    assert "\n" not in message and str(root / "seven" / "broken.png") in message


@pytest.mark.parametrize("layout", ["empty", "files_only", "empty_label"])
def test_empty_layouts_are_refused(tmp_path, layout):
    root = tmp_path / "r"
    root.mkdir()
    if layout == "files_only":
        drawing("cat", 0).save(root / "a.png")
    if layout == "empty_label":
        make_tree(root, {"cat": 2})
        (root / "dog").mkdir()
    with pytest.raises(DataError, match="no label directories|no images"):
        load_image_folder(root)


def test_missing_root(tmp_path):
    with pytest.raises(DataError, match="not a directory"):
        load_dataset(f"folder:{tmp_path / 'nope'}")


def test_train_sources_name_each_images_file(tmp_path):
    from handler.preprocessing import decode_image, to_canvas

    root = make_tree(tmp_path / "pets", {"seven": 6, "cat": 10})
    ds = load_image_folder(root)
    assert ds.source_kind == "file" and len(ds.train_sources) == len(ds.train_images) == 13
    assert len(set(ds.train_sources.tolist())) == 13
    for source, image, label in zip(ds.train_sources, ds.train_images, ds.train_labels):
        assert source.split("/")[0] == ds.classes[label]
        np.testing.assert_array_equal(to_canvas(decode_image((root / source).read_bytes())), image)


@pytest.mark.parametrize("layout, fix", [("labelled", "--data-source folder:{root}"),
                                         ("flat", "put them in {root}/<label>/ and use --data-source folder:{root}")])
@pytest.mark.parametrize("prefix", ["", "idx:"])
def test_a_folder_of_images_given_as_idx_names_the_fix(tmp_path, layout, fix, prefix):
    """#36 part 4: a bare <label>/*.png folder as --data-source is told to write folder:, not 'missing IDX file(s)'."""
    root = make_tree(tmp_path / "mine", {"seven": 2, "cat": 2})
    if layout == "flat":
        for image in list(root.rglob("*.png")):
            image.rename(root / f"{image.parent.name}-{image.name}")
        for folder in ("seven", "cat"):
            for other in (root / folder).iterdir():
                other.unlink()
            (root / folder).rmdir()
    with pytest.raises(DataError) as excinfo:
        load_dataset(f"{prefix}{root}")
    message = str(excinfo.value)
    assert fix.format(root=root) in message and "missing IDX" not in message and "\n" not in message


def test_an_idx_folder_without_images_still_lists_the_missing_files(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="missing IDX file"):
        load_dataset(str(tmp_path / "empty"))
