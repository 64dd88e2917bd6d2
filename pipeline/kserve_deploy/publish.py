"""Publishing a staged layout to the model store: s3://, gs://, pvc:// (the claim mounted in this task) or, for a
dry run, a local directory."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import uuid
import zipfile
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from cli_common import UsageError
from owned_paths import replaceable_dir
from settings import PVC_MOUNT_DEFAULT, PVC_MOUNT_ENV

from .errors import KServeError

CLUSTER_SCHEMES = ("s3", "gs", "pvc")


def versioned(uri: str, version: str) -> str:
    return f"{uri.rstrip('/')}/{version}"


def storage_uri(location: str) -> str:
    """The storageUri that names exactly the version folder at ``location``. KServe's storage initializer lists an
    s3:// location by its bare prefix (``Prefix=<path>``, 0.13.1 and 0.15.2), so ``.../1`` would also download
    ``.../10/``: a trailing ``/`` makes the prefix the folder. gs:// adds it itself; pvc:// mounts a sub-path."""
    return f"{location.rstrip('/')}/" if urlsplit(location).scheme == "s3" else location


def _refuse_another(location: str, theirs: bytes, ours: str) -> bool:
    """Whether the version's stored .mar (``theirs``) is this run's (nothing to write: True) or an upload cut short
    (not a whole zip: write it again, False); another whole archive is refused before any write (KServeError)."""
    if _sha256(theirs) == ours:
        return True
    if not zipfile.is_zipfile(io.BytesIO(theirs)):
        return False
    version = location.rstrip("/").rsplit("/", 1)[-1]
    raise KServeError(f"{location}: version {version} is already published there with another .mar (sha256 "
                      f"{_sha256(theirs)[:12]}, this run's {ours[:12]}); a published version is never replaced, so "
                      "running pods and new ones serve the same model: give this one a new model_version")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    """Copy the staged layout to s3://, gs://, pvc:// (a mounted claim) or a local directory. A version whose .mar is
    already there is left as it is when it is the same archive and refused (KServeError) when it is another one;
    a version folder without its .mar (an upload that failed before the .mar, which goes last) is written again.

    Credentials come only from the environment, as the cloud SDKs define it (AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL or an IAM role; GOOGLE_APPLICATION_CREDENTIALS or Workload
    Identity), never from arguments, and are never logged.
    """
    parts = urlsplit(location)
    if parts.scheme not in ("", "file", *CLUSTER_SCHEMES):
        raise KServeError(f"cannot write to {parts.scheme}:// storage: use s3://, gs://, pvc://<claim>/<path> "
                          "or (for development) a local directory")
    mars = sorted(staging.glob("model-store/*.mar"))
    ours = _sha256(mars[0].read_bytes()) if mars else None
    local = local_path(location)
    if local is not None:
        local = local.resolve()
        existing = local / "model-store" / mars[0].name if mars else None
        if existing is not None and existing.is_file() and _refuse_another(location, existing.read_bytes(), ours):
            return
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
    held = next((key for key in keys if key.endswith(".mar")), None) if ours else None
    if parts.scheme == "gs":
        _upload_gcs(parts.netloc, files, keys, lambda theirs: _refuse_another(location, theirs, ours), held)
    else:
        _upload_s3(parts.netloc, files, keys, lambda theirs: _refuse_another(location, theirs, ours), held)


def _upload_gcs(bucket_name: str, files: list[Path], keys: list[str], check: Callable[[bytes], bool],
                held: str | None) -> None:
    try:
        from google.cloud import storage
    except ImportError:
        raise KServeError("gs:// storage needs google-cloud-storage (pip install google-cloud-storage)") from None
    import google.api_core.exceptions
    import google.auth.exceptions

    try:
        bucket = storage.Client().bucket(bucket_name)
        if held is not None and bucket.blob(held).exists() and check(bucket.blob(held).download_as_bytes()):
            return
        for path, key in zip(files, keys, strict=True):
            bucket.blob(key).upload_from_filename(str(path))
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise KServeError(f"no Google credentials for gs://{bucket_name}: {exc}") from None
    except google.api_core.exceptions.GoogleAPIError as exc:
        raise KServeError(f"gs://{bucket_name}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


def _upload_s3(bucket_name: str, files: list[Path], keys: list[str], check: Callable[[bytes], bool],
               held: str | None) -> None:
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
        if (held is not None and client.list_objects_v2(Bucket=bucket_name, Prefix=held).get("KeyCount", 0)
                and check(client.get_object(Bucket=bucket_name, Key=held)["Body"].read())):
            return
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
