"""Training data from object storage, against real API servers on loopback: S3 (moto's server, through boto3) and
GCS (gcp-storage-emulator, through google-cloud-storage). Both layouts, the download cache, and the refusals as
`python -m training` prints them: one line, exit status 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.gcsserver import gcs_server
from support.idx_fixtures import make_idx_dir
from support.s3server import client_env, s3_server
from support.image_tree import make_tree

from settings import REPO
from training.data import DataError, load_dataset
from training.data import remote
from training.data.folder import load_image_folder
from training.data.idx import load_idx_dir


def upload_tree(put, local: Path, prefix: str) -> None:
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        put(str(path), f"{prefix}/{path.relative_to(local).as_posix()}")


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("local")
    make_idx_dir(root / "mnist", n_train=40, n_test=20)
    (root / "mnist" / "README.txt").write_text("not read")
    make_tree(root / "pets", {"seven": 4, "cat": 5})
    return root


@pytest.fixture(scope="module")
def s3(local_data):
    with s3_server() as endpoint:
        import boto3

        env = client_env(endpoint)
        client = boto3.client("s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
                              aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        client.create_bucket(Bucket="data")
        put = lambda path, key: client.upload_file(path, "data", key)  # noqa: E731
        upload_tree(put, local_data / "mnist", "sets/mnist")
        upload_tree(put, local_data / "pets", "sets/pets")
        client.put_object(Bucket="data", Key="sets/mnist2/unrelated.txt", Body=b"x")
        yield endpoint, client


@pytest.fixture
def s3_env(s3, monkeypatch):
    for key, value in client_env(s3[0]).items():
        monkeypatch.setenv(key, value)
    return client_env(s3[0])


def assert_same(data, expected) -> None:
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        assert np.array_equal(getattr(data, field), getattr(expected, field)), field
    assert data.classes == expected.classes and data.name == expected.name


def cached_files(cache: Path) -> list[str]:
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file())


def test_s3_idx_prefix_is_downloaded_once_and_read_as_idx(s3_env, local_data, tmp_path):
    data = load_dataset("s3://data/sets/mnist", cache_dir=tmp_path)
    assert_same(data, load_idx_dir(local_data / "mnist"))
    files = cached_files(tmp_path)
    # Only the four IDX files, under <snapshot>/<bucket>/<prefix>; no partial directory left.
    assert [f.split("/", 3)[3] for f in files] == sorted(
        f"data/sets/mnist/{p.name}" for p in (local_data / "mnist").glob("*.gz"))
    snapshot = next((tmp_path / "remote" / "s3").iterdir())
    inode = snapshot.stat().st_ino
    assert_same(load_dataset("idx:s3://data/sets/mnist/", cache_dir=tmp_path), data)
    assert snapshot.stat().st_ino == inode and cached_files(tmp_path) == files  # reused, not downloaded again


def test_s3_changed_object_makes_a_new_snapshot(s3, s3_env, local_data, tmp_path):
    _, client = s3
    upload_tree(lambda p, k: client.upload_file(p, "data", k), local_data / "mnist", "sets/changing")
    load_dataset("s3://data/sets/changing", cache_dir=tmp_path)
    make_idx_dir(tmp_path / "other", n_train=30, n_test=20)
    client.upload_file(str(tmp_path / "other" / "train-images-idx3-ubyte.gz"), "data",
                       "sets/changing/train-images-idx3-ubyte.gz")
    client.upload_file(str(tmp_path / "other" / "train-labels-idx1-ubyte.gz"), "data",
                       "sets/changing/train-labels-idx1-ubyte.gz")
    data = load_dataset("s3://data/sets/changing", cache_dir=tmp_path)
    assert len(data.train_images) == 30
    assert len(list((tmp_path / "remote" / "s3").iterdir())) == 2


def test_s3_folder_prefix_is_read_as_labelled_images(s3_env, local_data, tmp_path):
    data = load_dataset("s3://data/sets/pets", cache_dir=tmp_path)
    assert_same(data, load_image_folder(local_data / "pets"))
    assert data.name == "pets"
    assert not [f for f in cached_files(tmp_path) if f.endswith(".txt")]  # notes.txt was not downloaded
    assert_same(load_dataset("folder:s3://data/sets/pets", cache_dir=tmp_path), data)


def test_interrupted_download_never_looks_complete(s3_env, local_data, tmp_path, monkeypatch):
    real = remote._S3Store.download
    calls = []

    def fail_on_second(store, obj, dest):
        calls.append(obj.key)
        if len(calls) == 2:
            raise DataError("connection lost")
        real(store, obj, dest)

    monkeypatch.setattr(remote._S3Store, "download", fail_on_second)
    with pytest.raises(DataError, match="connection lost"):
        load_dataset("s3://data/sets/mnist", cache_dir=tmp_path)
    assert list((tmp_path / "remote" / "s3").iterdir()) == []  # neither a snapshot nor the partial one
    monkeypatch.setattr(remote._S3Store, "download", real)
    assert_same(load_dataset("s3://data/sets/mnist", cache_dir=tmp_path), load_idx_dir(local_data / "mnist"))


@pytest.mark.parametrize("source, message", [
    ("s3://data/sets/none", "s3://data/sets/none: no objects under this prefix"),
    ("s3://data/sets/mnist2", "s3://data/sets/mnist2: no images in label folders "
                              "(expected s3://data/sets/mnist2/<label>/<image>.png)"),
    ("idx:s3://data/sets/pets", "s3://data/sets/pets: missing IDX file(s): train-images-idx3-ubyte[.gz], "
     "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]"),
    ("folder:s3://data/sets/mnist", "s3://data/sets/mnist: no images in label folders"),
    ("s3://no-such-bucket/mnist", "s3://no-such-bucket: NoSuchBucket: The specified bucket does not exist"),
])
def test_s3_refusals_are_one_line(s3_env, source, message, tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset(source, cache_dir=tmp_path)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def training_cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR", "OMP_NUM_THREADS")}
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=REPO, env={**keep, **env},
                          capture_output=True, text=True, timeout=timeout)


def no_aws_credentials(tmp_path: Path) -> dict[str, str]:
    return {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.mark.parametrize("case", ["empty-prefix", "no-credentials"])
def test_training_command_refusals_are_one_line_with_status_1(case, s3, tmp_path, monkeypatch, capsys):
    from training.__main__ import main

    env = client_env(s3[0])
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    source, line = "s3://data/sets/none", "training: error: s3://data/sets/none: no objects under this prefix"
    if case == "no-credentials":
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(key)
        for key, value in no_aws_credentials(tmp_path).items():
            monkeypatch.setenv(key, value)
        source = "s3://data/sets/mnist"
        line = ("training: error: no AWS credentials for s3://data: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(from a Secret), AWS_SHARED_CREDENTIALS_FILE (a mounted Secret's file), or give the pod an IAM role")
    status = main(["--data-source", source, "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert (status, err) == (1, line + "\n")
    assert not (tmp_path / "out").exists()


def test_training_cli_without_google_credentials_is_one_line_with_status_1(tmp_path):
    """A separate process: google-auth reads NO_GCE_CHECK at import (here: not on GCE, no metadata server)."""
    result = training_cli(["--data-source", "gs://data/mnist", "--out", str(tmp_path / "out"), "--cache-dir",
                           str(tmp_path / "cache")], {"NO_GCE_CHECK": "true", "CLOUDSDK_CONFIG": str(tmp_path)})
    assert result.returncode == 1, result.stderr
    assert result.stderr == ("training: error: no Google credentials for gs://data: set GOOGLE_APPLICATION_CREDENTIALS "
                             "to a mounted service-account key file, or run the pod with Workload Identity\n")
    assert not (tmp_path / "out").exists()


def test_training_cli_trains_from_s3(s3, tmp_path):
    """The whole command on data it downloaded: the recorded dataset is the bucket's."""
    result = training_cli(["--data-source", "s3://data/sets/mnist", "--out", str(tmp_path / "out"), "--cache-dir",
                           str(tmp_path / "cache"), "--epochs", "1", "--negatives", "0", "--printed", "0",
                           "--no-plots", "--threads", "1"], client_env(s3[0]))
    assert result.returncode == 0, result.stderr[-2000:]
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert metadata["dataset"]["train"] == 40 and metadata["dataset"]["test"] == 20


@pytest.fixture(scope="module")
def gcs(local_data):
    with gcs_server() as host:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage
        client = storage.Client(project="test", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": host})
        bucket = client.create_bucket("data")
        put = lambda path, key: bucket.blob(key).upload_from_filename(path)  # noqa: E731
        upload_tree(put, local_data / "mnist", "sets/mnist")
        upload_tree(put, local_data / "pets", "sets/pets")
        yield host


@pytest.fixture
def gcs_env(gcs, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs)


def test_gcs_idx_and_folder_prefixes_are_read(gcs_env, local_data, tmp_path):
    assert_same(load_dataset("gs://data/sets/mnist", cache_dir=tmp_path), load_idx_dir(local_data / "mnist"))
    assert_same(load_dataset("gs://data/sets/pets", cache_dir=tmp_path), load_image_folder(local_data / "pets"))
    snapshots = sorted((tmp_path / "remote" / "gs").iterdir())
    assert len(snapshots) == 2 and not [p for p in snapshots if p.name.startswith(".")]
    inodes = [p.stat().st_ino for p in snapshots]
    load_dataset("gs://data/sets/mnist", cache_dir=tmp_path)
    assert [p.stat().st_ino for p in sorted((tmp_path / "remote" / "gs").iterdir())] == inodes


@pytest.mark.parametrize("source, message", [
    ("gs://data/sets/none", "gs://data/sets/none: no objects under this prefix"),
    ("idx:gs://data/sets/pets", "gs://data/sets/pets: missing IDX file(s): train-images-idx3-ubyte[.gz]"),
    ("gs://no-such-bucket/mnist", "gs://no-such-bucket: NotFound: "),
])
def test_gcs_refusals_are_one_line(gcs_env, source, message, tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset(source, cache_dir=tmp_path)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
