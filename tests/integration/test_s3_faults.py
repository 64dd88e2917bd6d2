"""Faults on the way to the model store (tests/support/s3server.py: a real S3 API server behind a loopback proxy
that drops uploads halfway, answers 503 SlowDown, 507 XMinioStorageFull or 400 EntityTooLarge): deploy ends on
one line, the InferenceService is never pointed at the half-written version, and rerunning completes it."""

from __future__ import annotations

import pytest
from support.rollout import archive, cluster, target  # noqa: F401 (fixtures)
from support.s3server import ACCESS_KEY, REGION, SECRET_KEY, FaultyS3, client_env, s3_server

from pipeline.kserve_deploy import KServeError, deploy

MAR_KEY = "embedding/1.0/model-store/embedding.mar"
AFTER = rf" \(uploading {MAR_KEY}; nothing points at this version: rerun to upload it again\)$"


def store(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=SECRET_KEY)


@pytest.fixture(scope="module")
def s3():
    with s3_server() as endpoint:
        store(endpoint).create_bucket(Bucket="models")
        yield endpoint


@pytest.fixture()
def faulty(s3, monkeypatch):
    bucket = store(s3)
    for obj in bucket.list_objects_v2(Bucket="models").get("Contents", []):
        bucket.delete_object(Bucket="models", Key=obj["Key"])
    proxy = FaultyS3(s3)
    with proxy as url:
        for key, value in client_env(url).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_RETRY_MODE", "standard")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # one retry: enough to see a passing fault survived
        yield proxy


def deploy_1(archive):
    return deploy(archive, "embedding", "1.0", target("1.0", 0.9, storage_uri="s3://models/embedding"))


def isvc_writes(cluster) -> list[str]:
    return [r["method"] for r in cluster.requests if r["method"] != "GET" and "inferenceservices" in r["path"]]


@pytest.mark.parametrize("fault, message", [
    ("full", r"^s3://models: XMinioStorageFull: Storage backend has reached its minimum free drive threshold\. "
             r"Please delete a few objects to proceed\."),
    ("slowdown", r"^s3://models: SlowDown: Please reduce your request rate\."),
    ("too_large", r"^s3://models: EntityTooLarge: Your proposed upload exceeds the maximum allowed object size\."),
    ("drop", r"^s3://models: Connection was closed before we received a valid response from endpoint URL: "
             rf"\"http://127\.0\.0\.1:\d+/models/{MAR_KEY}\"\."),
])
def test_a_failed_upload_ends_on_one_line_and_points_nothing_at_the_version(fault, message, faulty, cluster, archive,
                                                                           s3):
    faulty.fail(".mar", fault)
    with pytest.raises(KServeError, match=message + AFTER):
        deploy_1(archive)
    assert isvc_writes(cluster) == []  # the InferenceService was never written
    keys = [o["Key"] for o in store(s3).list_objects_v2(Bucket="models").get("Contents", [])]
    assert keys == ["embedding/1.0/config/config.properties"]  # the archive goes last: half a version, unnamed
    faulty.clear()
    deploy_1(archive)  # the rerun completes
    assert isvc_writes(cluster) == ["POST"]
    served = cluster.isvc("models", "embedding")["spec"]["predictor"]["model"]["storageUri"]
    assert served == "s3://models/embedding/1.0/"  # the folder, not every key it prefixes
    assert store(s3).get_object(Bucket="models", Key=MAR_KEY)["Body"].read() == archive.read_bytes()


@pytest.mark.parametrize("fault", ["drop", "slowdown"])
def test_a_passing_fault_is_retried_by_the_s3_client(fault, faulty, cluster, archive, s3):
    faulty.fail(".mar", fault, times=1)
    deploy_1(archive)
    assert faulty.faults_met == 1
    assert store(s3).get_object(Bucket="models", Key=MAR_KEY)["Body"].read() == archive.read_bytes()


def test_a_store_that_keeps_less_than_it_acknowledged_is_caught_before_the_patch(faulty, cluster, archive):
    faulty.fail(".mar", "truncate")
    size = archive.stat().st_size
    with pytest.raises(KServeError, match=rf"^s3://models/{MAR_KEY}: the store holds {size // 2} bytes of {size}; "
                                          r"nothing points at this version \(rerun to upload it again\)$"):
        deploy_1(archive)
    assert isvc_writes(cluster) == []
