"""Publishing the KServe model store: S3 (a real S3 API server on loopback) read back by KServe's own storage
code, a mounted PVC, and the refusals (local paths for a cluster, missing credentials) on one line.

The read-back runs the storage code of the KServe releases the project supports and of the newest upstream
(support/kserve_versions: 0.13.1 and 0.15.2 inside the kserve package, kserve-storage 0.21.0), each in its own
environment and given only the S3 variables that release reads, as checked against its installed source here."""

from __future__ import annotations

import json

import pytest
import yaml
from support.kserve_versions import BOTOCORE_ENV, VERSIONS, download, installed, s3_settings_in, storage_config
from support.s3server import EXAMPLE_SECRET, client_env, files, s3_server, storage_initializer_env

from pipeline.kserve_deploy import KServeError, KServeTarget, deploy

LAYOUT = ["config/config.properties", "model-store/embedding.mar"]


@pytest.fixture(scope="module")
def s3():
    with s3_server() as endpoint:
        import boto3

        boto3.client("s3", **{"endpoint_url": endpoint, "region_name": "us-east-1",
                              "aws_access_key_id": "x", "aws_secret_access_key": "y"}).create_bucket(Bucket="models")
        yield endpoint


@pytest.fixture(scope="module")
def published(model_store, s3):
    """The model store deployed (dry run) to s3://models/embedding/1.0, once for every release's read-back."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        for key, value in client_env(s3).items():
            monkeypatch.setenv(key, value)
        result = deploy(model_store / "embedding.mar", "embedding", "1.0",
                        KServeTarget(namespace="models", storage_uri="s3://models/embedding"), dry_run=True)
    return result


def test_s3_publish_writes_the_versioned_layout(published):
    uri = published.manifest["spec"]["predictor"]["model"]["storageUri"]
    assert uri == "s3://models/embedding/1.0/" and published.location == "s3://models/embedding/1.0"


@pytest.fixture(scope="module")
def versions_1_and_10(model_store, s3, tmp_path_factory):
    """Versions 1 and 10 of another model name published side by side (10 with another archive)."""
    other = tmp_path_factory.mktemp("other") / "embedding.mar"
    other.write_bytes(_another_archive(model_store / "embedding.mar"))
    with pytest.MonkeyPatch.context() as monkeypatch:
        for key, value in client_env(s3).items():
            monkeypatch.setenv(key, value)
        one = deploy(model_store / "embedding.mar", "embedding", "1",
                     KServeTarget(namespace="models", storage_uri="s3://models/prefixes"), dry_run=True)
        deploy(other, "embedding", "10", KServeTarget(namespace="models", storage_uri="s3://models/prefixes"),
               dry_run=True)
    return one


def _another_archive(mar):
    """The same archive with one more member: a whole .mar with another SHA-256."""
    import io
    import zipfile

    buf = io.BytesIO(mar.read_bytes())
    with zipfile.ZipFile(buf, "a") as archive:
        archive.writestr("NOTE.txt", "another build\n")
    return buf.getvalue()


@pytest.mark.parametrize("release", VERSIONS, ids=[r.version for r in VERSIONS])
def test_version_1_downloads_only_its_own_folder_beside_version_10(release, versions_1_and_10, s3, tmp_path):
    """KServe lists s3:// by the bare prefix: storageUri .../1 would download .../10/ too, so it ends in '/'."""
    uri = versions_1_and_10.manifest["spec"]["predictor"]["model"]["storageUri"]
    assert uri == "s3://models/prefixes/1/"
    out = tmp_path / "mnt-models"
    out.mkdir()
    result = download(release, uri, out, release_env(release, s3))
    assert result.returncode == 0, result.stderr[-2000:]
    assert files(out) == LAYOUT


def test_a_published_version_is_never_replaced(model_store, s3, versions_1_and_10, monkeypatch, tmp_path):
    """Publishing the same .mar again writes nothing; another .mar under a published version is refused before any
    write, so the pods that run and the ones that start later serve the same model."""
    import boto3

    for key, value in client_env(s3).items():
        monkeypatch.setenv(key, value)
    target = KServeTarget(namespace="models", storage_uri="s3://models/prefixes")
    store = boto3.session.Session().client("s3")
    before = {o["Key"]: o["ETag"] for o in store.list_objects_v2(Bucket="models", Prefix="prefixes/")["Contents"]}
    deploy(model_store / "embedding.mar", "embedding", "1", target, dry_run=True)  # the same archive: a no-op
    other = tmp_path / "embedding.mar"
    other.write_bytes(_another_archive(model_store / "embedding.mar"))
    with pytest.raises(KServeError, match=r"^s3://models/prefixes/1: version 1 is already published there with "
                                          r"another \.mar \(sha256 [0-9a-f]{12}, this run's [0-9a-f]{12}\); a "
                                          r"published version is never replaced"):
        deploy(other, "embedding", "1", target, dry_run=True)
    after = {o["Key"]: o["ETag"] for o in store.list_objects_v2(Bucket="models", Prefix="prefixes/")["Contents"]}
    assert after == before


@pytest.mark.parametrize("release", VERSIONS, ids=[r.version for r in VERSIONS])
def test_release_reads_the_s3_settings_in_the_table(release):
    """The table in support/kserve_versions was written from each release's source; the installed module agrees."""
    version, module_file = installed(release)
    assert version == release.version
    assert s3_settings_in(module_file.read_text()) == (release.s3_env, release.storage_config)


def release_env(release, s3) -> dict[str, str]:
    """What KServe's controller derives from the example S3 Secret, less the variables this release never reads."""
    (secret, _) = [d for d in yaml.safe_load_all(EXAMPLE_SECRET.read_text()) if d]
    full = storage_initializer_env(secret, s3)
    return {k: v for k, v in full.items() if k in release.s3_env | BOTOCORE_ENV | {"PATH", "HOME", "TMPDIR"}}


@pytest.mark.parametrize("release", VERSIONS, ids=[r.version for r in VERSIONS])
def test_s3_publish_is_read_back_by_kserve_storage(release, published, model_store, s3, tmp_path):
    env = release_env(release, s3)
    assert {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env)
    assert "S3_ENDPOINT" not in env and "S3_USE_HTTPS" not in env  # set by the controller, read by neither release
    out = tmp_path / "mnt-models"
    out.mkdir()
    result = download(release, published.location, out, env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert files(out) == LAYOUT
    assert (out / "model-store/embedding.mar").read_bytes() == (model_store / "embedding.mar").read_bytes()
    props = (out / "config/config.properties").read_text()
    assert '"embedding":{"1.0"' in props


@pytest.mark.parametrize("release", VERSIONS, ids=[r.version for r in VERSIONS])
def test_storage_spec_json_is_read_back_by_kserve_storage(release, published, s3, tmp_path):
    """An InferenceService `storage:` spec reaches the initializer as STORAGE_CONFIG, with no AWS_* variables."""
    values = client_env(s3)
    spec = storage_config(release, {name: values[name] for name in
                                    ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                     "AWS_DEFAULT_REGION")})
    env = {k: v for k, v in release_env(release, s3).items() if k in ("PATH", "HOME", "TMPDIR")}
    out = tmp_path / "mnt-models"
    out.mkdir()
    result = download(release, published.location, out, {**env, "STORAGE_CONFIG": spec})
    assert result.returncode == 0, result.stderr[-2000:]
    assert files(out) == LAYOUT


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


def test_a_published_version_on_a_claim_is_never_replaced(model_store, tmp_path, monkeypatch):
    mount = tmp_path / "pvc"
    mount.mkdir()
    monkeypatch.setenv("PVC_MOUNT_PATH", str(mount))
    target = KServeTarget(namespace="models", storage_uri="pvc://model-claim/embedding")
    deploy(model_store / "embedding.mar", "embedding", "2.0", target, dry_run=True)
    published = {f: (mount / f).read_bytes() for f in files(mount)}
    deploy(model_store / "embedding.mar", "embedding", "2.0", target, dry_run=True)  # the same archive: a no-op
    other = tmp_path / "embedding.mar"
    other.write_bytes(_another_archive(model_store / "embedding.mar"))
    with pytest.raises(KServeError, match=r"^pvc://model-claim/embedding/2\.0: version 2\.0 is already published"):
        deploy(other, "embedding", "2.0", target, dry_run=True)
    assert {f: (mount / f).read_bytes() for f in files(mount)} == published


def test_manifest_holds_no_secret_value(model_store, s3, monkeypatch):
    env = client_env(s3)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = deploy(model_store / "embedding.mar", "embedding", "1.0",
                    KServeTarget(namespace="models", storage_uri="s3://models/embedding"), dry_run=True)
    text = json.dumps(result.manifest)
    assert env["AWS_SECRET_ACCESS_KEY"] not in text and env["AWS_ACCESS_KEY_ID"] not in text
