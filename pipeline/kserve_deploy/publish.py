"""Publishing a staged layout to the model store: s3://, gs://, pvc:// (the claim mounted in this task) or, for a
dry run, a local directory."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from cli_common import UsageError
from owned_paths import replaceable_dir
from settings import PVC_MOUNT_DEFAULT, PVC_MOUNT_ENV

from .errors import KServeError

CLUSTER_SCHEMES = ("s3", "gs", "pvc")


def versioned(uri: str, version: str) -> str:
    return f"{uri.rstrip('/')}/{version}"


def local_path(location: str) -> Path | None:
    """The directory a local path, file:// or pvc:// location is written to; None for object storage."""
    parts = urlsplit(location)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise KServeError(f"{location}: file:// URIs must name a local path (file:///dir)")
        return Path(parts.path)
    if parts.scheme == "pvc":
        mount = Path(os.environ.get(PVC_MOUNT_ENV, PVC_MOUNT_DEFAULT))
        if not parts.netloc:
            raise KServeError(f"{location}: pvc:// URIs name the claim: pvc://<claim>/<path>")
        if not mount.is_dir():
            raise KServeError(f"{location}: claim {parts.netloc} is not mounted at {mount} in this task "
                              f"(mount it there, or set {PVC_MOUNT_ENV})")
        return mount / parts.path.strip("/")
    return Path(location) if not parts.scheme else None


def publish(staging: Path, location: str) -> None:
    """Copy the staged layout to s3://, gs://, pvc:// (a mounted claim) or a local directory, replacing that version.

    Credentials come only from the environment, as the cloud SDKs define it (AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL or an IAM role; GOOGLE_APPLICATION_CREDENTIALS or Workload
    Identity), never from arguments, and are never logged.
    """
    parts = urlsplit(location)
    if parts.scheme not in ("", "file", *CLUSTER_SCHEMES):
        raise KServeError(f"cannot write to {parts.scheme}:// storage: use s3://, gs://, pvc://<claim>/<path> "
                          "or (for development) a local directory")
    local = local_path(location)
    if local is not None:
        local = local.resolve()
        try:  # a version folder holds exactly what staging holds: replace nothing else
            replaceable_dir(local, "kserve-version", "kserve_storage_uri", known=[p.name for p in staging.iterdir()])
        except UsageError as exc:
            raise KServeError(str(exc)) from None
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.parent / f".{local.name}.partial-{uuid.uuid4().hex[:8]}"
        shutil.copytree(staging, partial)
        if local.exists():
            shutil.rmtree(local)
        os.replace(partial, local)
        return
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    # The .mar last: a reader that finds it finds the whole version.
    files.sort(key=lambda p: p.suffix == ".mar")
    keys = [f"{parts.path.strip('/')}/{p.relative_to(staging).as_posix()}".lstrip("/") for p in files]
    if parts.scheme == "gs":
        _upload_gcs(parts.netloc, files, keys)
    else:
        _upload_s3(parts.netloc, files, keys)


def _upload_gcs(bucket_name: str, files: list[Path], keys: list[str]) -> None:
    try:
        from google.cloud import storage
    except ImportError:
        raise KServeError("gs:// storage needs google-cloud-storage (pip install google-cloud-storage)") from None
    import google.api_core.exceptions
    import google.auth.exceptions

    try:
        bucket = storage.Client().bucket(bucket_name)
        for path, key in zip(files, keys, strict=True):
            bucket.blob(key).upload_from_filename(str(path))
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise KServeError(f"no Google credentials for gs://{bucket_name}: {exc}") from None
    except google.api_core.exceptions.GoogleAPIError as exc:
        raise KServeError(f"gs://{bucket_name}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def _upload_s3(bucket_name: str, files: list[Path], keys: list[str]) -> None:
    try:
        import boto3
        import botocore.exceptions
    except ImportError:
        raise KServeError("s3:// storage needs boto3 (pip install boto3)") from None
    key = ""
    try:
        # A fresh session: endpoint, region and credentials from the environment as it is now (AWS_* variables).
        client = boto3.session.Session().client("s3")
        client.head_bucket(Bucket=bucket_name)  # a missing bucket or permission fails before any upload
        for path, key in zip(files, keys, strict=True):
            client.upload_file(str(path), bucket_name, key)
        for path, key in zip(files, keys, strict=True):  # what the store holds, before anything points at it
            size = client.head_object(Bucket=bucket_name, Key=key)["ContentLength"]
            if size != path.stat().st_size:
                raise KServeError(f"s3://{bucket_name}/{key}: the store holds {size} bytes of "
                                  f"{path.stat().st_size}; nothing points at this version (rerun to upload it again)")
    except botocore.exceptions.NoCredentialsError:
        raise KServeError(f"no AWS credentials for s3://{bucket_name}: set AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY (from a Secret), or give the pod an IAM role") from None
    except (botocore.exceptions.ClientError, boto3.exceptions.S3UploadFailedError,
            botocore.exceptions.BotoCoreError) as exc:
        after = f" (uploading {key}; nothing points at this version: rerun to upload it again)" if key else ""
        raise KServeError(f"{_s3_error(exc, bucket_name)}{after}") from None


def _s3_error(exc: Exception, bucket_name: str) -> str:
    """`s3://bucket: <S3 error code>: <message>` on one line (an upload failure wraps the service's error)."""
    import botocore.exceptions

    wrapped = exc.__cause__ or exc.__context__  # boto3 raises S3UploadFailedError while handling the ClientError
    cause = wrapped if isinstance(wrapped, botocore.exceptions.ClientError) else exc
    if isinstance(cause, botocore.exceptions.ClientError):
        error = cause.response.get("Error", {})
        code = {"404": "NoSuchBucket", "403": "AccessDenied"}.get(str(error.get("Code")), error.get("Code", "error"))
        return f"s3://{bucket_name}: {code}: {(error.get('Message') or 'refused').splitlines()[0]}"
    return f"s3://{bucket_name}: {str(exc).splitlines()[0]}"
