"""Publishing the KServe model store: S3 (a real S3 API server on loopback) read back by KServe's own storage
code, a mounted PVC, and the refusals (local paths for a cluster, missing credentials) on one line."""

from __future__ import annotations

import json

import pytest
from support.s3server import client_env, files, kserve_download, s3_server

from pipeline.kserve import KServeError, KServeTarget, deploy

LAYOUT = ["config/config.properties", "model-store/embedding.mar"]


@pytest.fixture(scope="module")
def s3():
    with s3_server() as endpoint:
        import boto3

        boto3.client("s3", **{"endpoint_url": endpoint, "region_name": "us-east-1",
                              "aws_access_key_id": "x", "aws_secret_access_key": "y"}).create_bucket(Bucket="models")
        yield endpoint


def test_s3_publish_is_read_back_by_kserve_storage(model_store, s3, tmp_path, monkeypatch):
    for key, value in client_env(s3).items():
        monkeypatch.setenv(key, value)
    mar = model_store / "embedding.mar"
    result = deploy(mar, "embedding", "1.0", KServeTarget(namespace="models", storage_uri="s3://models/embedding"), dry_run=True)
    uri = result.manifest["spec"]["predictor"]["model"]["storageUri"]
    assert uri == "s3://models/embedding/1.0" and result.location == uri
    out = tmp_path / "mnt-models"
    out.mkdir()
    download = kserve_download(uri, out, s3)
    assert download.returncode == 0, download.stderr[-2000:]
    assert files(out) == LAYOUT
    assert (out / "model-store/embedding.mar").read_bytes() == mar.read_bytes()
    props = (out / "config/config.properties").read_text()
    assert '"embedding":{"1.0"' in props


def test_s3_errors_are_one_line_and_name_no_secret(model_store, s3, monkeypatch):
    mar = model_store / "embedding.mar"
    env = client_env(s3)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(KServeError) as missing_bucket:
        deploy(mar, "embedding", "1.0", KServeTarget(namespace="models", storage_uri="s3://no-such-bucket/embedding"), dry_run=True)
    assert str(missing_bucket.value).startswith("s3://no-such-bucket: NoSuchBucket")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(KServeError, match="^no AWS credentials for s3://models: set AWS_ACCESS_KEY_ID"):
        deploy(mar, "embedding", "1.0", KServeTarget(namespace="models", storage_uri="s3://models/embedding"), dry_run=True)
    for message in (str(missing_bucket.value),):
        assert "\n" not in message and env["AWS_SECRET_ACCESS_KEY"] not in message


def test_cluster_deploy_refuses_a_local_path_before_uploading(model_store, tmp_path):
    target = KServeTarget(namespace="models", storage_uri=str(tmp_path / "store"))
    with pytest.raises(KServeError, match="the cluster cannot read a local path; use s3://, gs:// or pvc://"):
        deploy(model_store / "embedding.mar", "embedding", "1.0", target, api=object())
    with pytest.raises(KServeError, match="cannot read a local path"):
        deploy(model_store / "embedding.mar", "embedding", "1.0",
               KServeTarget(namespace="models", storage_uri=(tmp_path / "store").as_uri()), api=object())
    assert not (tmp_path / "store").exists()


def test_pvc_uri_writes_into_the_mounted_claim(model_store, tmp_path, monkeypatch):
    """pvc://<claim>/<path> is written under the claim's mount in the task; the manifest keeps the pvc:// URI."""
    mount = tmp_path / "pvc"
    mount.mkdir()
    monkeypatch.setenv("PVC_MOUNT_PATH", str(mount))
    result = deploy(model_store / "embedding.mar", "embedding", "2.0",
                    KServeTarget(namespace="models", storage_uri="pvc://model-claim/embedding"), dry_run=True)
    assert result.manifest["spec"]["predictor"]["model"]["storageUri"] == "pvc://model-claim/embedding/2.0"
    assert files(mount) == [f"embedding/2.0/{f}" for f in LAYOUT]


def test_manifest_holds_no_secret_value(model_store, s3, monkeypatch):
    env = client_env(s3)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = deploy(model_store / "embedding.mar", "embedding", "1.0",
                    KServeTarget(namespace="models", storage_uri="s3://models/embedding"), dry_run=True)
    text = json.dumps(result.manifest)
    assert env["AWS_SECRET_ACCESS_KEY"] not in text and env["AWS_ACCESS_KEY_ID"] not in text
