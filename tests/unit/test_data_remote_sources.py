"""Storage URIs as data sources without a server: parsing, the refusals, and pvc:// read from a mounted claim."""

from __future__ import annotations


import pytest
from support.idx_fixtures import make_idx_dir
from support.image_tree import make_tree

from training.data import DataError, load_dataset
from training.data.remote import PVC_MOUNT_DEFAULT, PVC_MOUNT_ENV, StorageURI, fetch, parse_uri


@pytest.mark.parametrize("text, parsed", [
    ("s3://data/mnist", StorageURI("s3", "data", "mnist")),
    ("s3://data/mnist/", StorageURI("s3", "data", "mnist")),
    ("gs://my_bucket.example/a/b", StorageURI("gs", "my_bucket.example", "a/b")),
    ("s3://data", StorageURI("s3", "data", "")),
    ("pvc://training-data/sets/mnist", StorageURI("pvc", "training-data", "sets/mnist")),
])
def test_storage_uris_are_split_into_bucket_and_prefix(text, parsed):
    uri = parse_uri(text)
    assert uri == parsed
    assert str(uri) == text.rstrip("/")


@pytest.mark.parametrize("source, message", [
    ("s3://", "s3://: no bucket named; use s3://<bucket>/<path>"),
    ("gs:///mnist", "gs:///mnist: no bucket named"),
    ("pvc:///mnist", "pvc:///mnist: no claim named; use pvc://<claim>/<path>"),
    ("s3://data bucket/x", "'s3://data bucket/x': a storage URI has no spaces, query or fragment"),
    ("s3://data/x?versionId=3", "a storage URI has no spaces, query or fragment"),
    ("s3://-data/x", "s3://-data/x: '-data' is not a valid bucket name"),
    ("pvc://Training_Data/x", "pvc://Training_Data/x: 'Training_Data' is not a valid claim name"),
    ("s3://data/a/../b", "s3://data/a/../b: empty, '.' or '..' path segments are not allowed"),
    ("gs://data/a//b", "empty, '.' or '..' path segments are not allowed"),
    ("http://example.com/mnist", "http://example.com/mnist: not a storage URI; use s3://<bucket>/<prefix>"),
    ("idx:ftp://host/mnist", "ftp://host/mnist: not a storage URI"),
])
def test_bad_uris_are_one_line_errors_before_any_network(source, message, tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset(source, cache_dir=tmp_path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "remote").exists()


def test_pvc_idx_layout_is_read_from_the_mounted_claim(tmp_path, monkeypatch):
    mount = tmp_path / "mnt"
    arrays = make_idx_dir(mount / "sets" / "mnist", n_train=30, n_test=10)
    monkeypatch.setenv(PVC_MOUNT_ENV, str(mount))
    for source in ("pvc://training-data/sets/mnist", "idx:pvc://training-data/sets/mnist/"):
        data = load_dataset(source, cache_dir=tmp_path / "cache")
        assert (data.train_images == arrays["train_images"]).all()
        assert (data.test_labels == arrays["test_labels"]).all()
    assert not (tmp_path / "cache").exists()  # read in place, nothing copied


def test_pvc_folder_layout_is_detected_and_read(tmp_path, monkeypatch):
    mount = tmp_path / "mnt"
    make_tree(mount / "pets", {"seven": 4, "cat": 5})
    monkeypatch.setenv(PVC_MOUNT_ENV, str(mount))
    root, layout = fetch("pvc://claim/pets", None, tmp_path / "cache")
    assert (root, layout) == (mount / "pets", "folder")
    data = load_dataset("pvc://claim/pets", cache_dir=tmp_path / "cache")
    assert data.name == "pets" and data.classes == ("cat", "seven")
    assert len(data.train_images) + len(data.test_images) == 9


def test_pvc_layout_named_explicitly_is_held_to(tmp_path, monkeypatch):
    mount = tmp_path / "mnt"
    make_tree(mount / "pets", {"seven": 4, "cat": 5})
    make_idx_dir(mount / "mnist", n_train=10, n_test=5)
    monkeypatch.setenv(PVC_MOUNT_ENV, str(mount))
    with pytest.raises(DataError, match=r"pets: no IDX files; it holds <label>/ image folders: train with "
                                        r"--data-source folder:"):
        load_dataset("idx:pvc://claim/pets", cache_dir=tmp_path)
    with pytest.raises(DataError, match=r"mnist: no label directories"):
        load_dataset("folder:pvc://claim/mnist", cache_dir=tmp_path)


def test_pvc_refusals_name_the_mount_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(PVC_MOUNT_ENV, str(tmp_path / "not-mounted"))
    with pytest.raises(DataError) as err:
        load_dataset("pvc://training-data/mnist", cache_dir=tmp_path)
    assert str(err.value) == (f"pvc://training-data/mnist: claim training-data is not mounted at "
                              f"{tmp_path}/not-mounted in this task (mount it there, or set {PVC_MOUNT_ENV})")
    monkeypatch.setenv(PVC_MOUNT_ENV, str(tmp_path))
    with pytest.raises(DataError, match=f"^pvc://training-data/mnist: {tmp_path}/mnist is not a directory on the "
                                        "mounted claim$"):
        load_dataset("pvc://training-data/mnist", cache_dir=tmp_path)
    monkeypatch.delenv(PVC_MOUNT_ENV)
    from training.data import remote

    monkeypatch.setattr(remote, "PVC_MOUNT_DEFAULT", str(tmp_path / "no-default-mount"))
    with pytest.raises(DataError, match=f"is not mounted at {tmp_path}/no-default-mount in this task"):
        load_dataset("pvc://training-data/mnist", cache_dir=tmp_path)


def test_unreachable_s3_endpoint_is_one_line(tmp_path, monkeypatch):
    from serving.server import free_ports

    (port,) = free_ports(1)  # nothing listens there
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "id",
                       "AWS_SECRET_ACCESS_KEY": "secret", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(DataError) as err:
        load_dataset("s3://data/mnist", cache_dir=tmp_path)
    assert str(err.value).startswith(f's3://data: Could not connect to the endpoint URL: "http://127.0.0.1:{port}/')
    assert "\n" not in str(err.value) and "secret" not in str(err.value)


def test_a_missing_google_key_file_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "gcs-key.json"))
    with pytest.raises(DataError) as err:
        load_dataset("gs://data/mnist", cache_dir=tmp_path)
    assert str(err.value).startswith(f"no Google credentials for gs://data: GOOGLE_APPLICATION_CREDENTIALS="
                                     f"{tmp_path}/gcs-key.json: File {tmp_path}/gcs-key.json was not found")
    assert "\n" not in str(err.value)


def test_source_problem_checks_uris_without_network():
    from training.data import source_problem

    assert source_problem("s3://data/mnist") is None and source_problem("folder:gs://data/pets") is None
    assert source_problem("mnist-sample") is None and source_problem("idx:/data/mnist") is None
    assert source_problem("s3://") == "s3://: no bucket named; use s3://<bucket>/<path>"
    assert source_problem("folder:http://host/pets").startswith("http://host/pets: not a storage URI")
