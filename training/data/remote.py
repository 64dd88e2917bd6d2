"""Training data in the cluster's storage: ``s3://bucket/prefix``, ``gs://bucket/prefix`` and ``pvc://claim/path``.

The layouts are the local ones: the four MNIST IDX files directly under the prefix, or ``<label>/<image>``.
``idx:URI`` and ``folder:URI`` choose one; a bare URI is read as IDX when an IDX file is there, else as a folder.

Object storage is listed and only the objects that layout reads are downloaded, into a snapshot of the cache:
``<cache>/remote/<scheme>/<snapshot>/<bucket>/<prefix>/``, where ``<snapshot>`` hashes the URI, the layout and the
listing (key, size, ETag or generation). An unchanged listing reuses its snapshot without downloading; a changed
object makes a new one. Objects are downloaded into a hidden partial directory that is renamed to ``<snapshot>``
only once every file has its listed size, so a partial download never looks complete. Then the local readers
read the snapshot.

Credentials come only from the environment, as each SDK reads it, never from arguments:

- S3 (boto3): ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``, or ``AWS_SHARED_CREDENTIALS_FILE`` naming a
  mounted Secret's file, or the pod's IAM role; ``AWS_ENDPOINT_URL`` for MinIO and other S3 servers;
  ``AWS_DEFAULT_REGION``; ``AWS_CA_BUNDLE``. The variables the pipeline's model upload (pipeline/kserve_deploy/) uses.
- GCS (google-cloud-storage): ``GOOGLE_APPLICATION_CREDENTIALS`` naming a mounted service-account key, or
  Workload Identity; ``STORAGE_EMULATOR_HOST`` points the client at an emulator.

``pvc://claim/path`` is read in place: the task has the claim mounted at ``$PVC_MOUNT_PATH`` (default ``/mnt/pvc``,
where the pipeline mounts a claim with kfp-kubernetes' ``mount_pvc``), and ``path`` is relative to that mount.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from settings import PVC_MOUNT_DEFAULT, PVC_MOUNT_ENV

from . import DataError
from .folder import is_image_name, is_label_name
from .idx import select_idx_files

SCHEMES = ("s3", "gs", "pvc")
LAYOUTS = ("idx", "folder")
URI_FORMS = "s3://<bucket>/<prefix>, gs://<bucket>/<prefix> or pvc://<claim>/<path>"
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,250}[A-Za-z0-9])?$")
#: A PersistentVolumeClaim's name: a DNS-1123 subdomain (lowercase), as the API server checks it.
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class StorageURI:
    """``scheme://bucket/prefix``; for pvc:// the bucket is the claim. ``prefix`` has no outer slashes."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    @property
    def key_prefix(self) -> str:
        """What listed keys start with: the prefix as a directory, so ``data`` does not match ``data2/``."""
        return f"{self.prefix}/" if self.prefix else ""


@dataclass(frozen=True)
class _Object:
    key: str
    rel: str  # the key below the prefix
    size: int
    tag: str  # ETag or generation: changes when the object does
    handle: Any = None


def is_storage_uri(source: str) -> bool:
    """Whether a data source names cluster storage (what follows ``idx:`` / ``folder:`` included)."""
    return source.partition("://")[0] in SCHEMES and "://" in source


def parse_uri(text: str) -> StorageURI:
    """Check and split a storage URI; DataError with a one-line reason."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in SCHEMES:
        raise DataError(f"{text}: not a storage URI; use {URI_FORMS}")
    if re.search(r"[\s?#]", text):
        raise DataError(f"{text!r}: a storage URI has no spaces, query or fragment; use {URI_FORMS}")
    what = "claim" if scheme == "pvc" else "bucket"
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise DataError(f"{text}: no {what} named; use {scheme}://<{what}>/<path>")
    if not (_CLAIM if scheme == "pvc" else _NAME).match(bucket):
        raise DataError(f"{text}: {bucket!r} is not a valid {what} name")
    parts = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
    if any(part in ("", ".", "..") for part in parts):
        raise DataError(f"{text}: empty, '.' or '..' path segments are not allowed")
    return StorageURI(scheme, bucket, "/".join(parts))


def fetch(source: str, layout: str | None, cache_dir: Path) -> tuple[Path, str]:
    """A local directory holding the data of storage URI `source`, and its layout (idx or folder).

    `layout` None: IDX when an IDX file is under the prefix, else folder.
    """
    uri = parse_uri(source)
    if layout is not None and layout not in LAYOUTS:
        raise DataError(f"{source}: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if uri.scheme == "pvc":
        root = pvc_path(uri)
        if layout is None:
            found, _ = select_idx_files(p.name for p in root.iterdir() if p.is_file())
            layout = "idx" if found else "folder"
        return root, layout
    store = _S3Store(uri) if uri.scheme == "s3" else _GCSStore(uri)
    objects = store.list()
    if not objects:
        raise DataError(f"{uri}: no objects under this prefix")
    found, missing = select_idx_files(o.rel for o in objects if "/" not in o.rel)
    layout = layout or ("idx" if found else "folder")
    if layout == "idx":
        if missing:
            raise DataError(f"{uri}: missing IDX file(s): {', '.join(missing)}")
        wanted = [o for o in objects if o.rel in set(found.values())]
    else:
        wanted = [o for o in objects if _is_folder_image(o.rel)]
        if not wanted:
            raise DataError(f"{uri}: no images in label folders (expected {uri}/<label>/<image>.png)")
    return _snapshot(uri, layout, wanted, store, Path(cache_dir)), layout


def pvc_path(uri: StorageURI) -> Path:
    """The directory of pvc://claim/path in this task: path under the claim's mount."""
    mount = Path(os.environ.get(PVC_MOUNT_ENV) or PVC_MOUNT_DEFAULT)
    if not mount.is_dir():
        raise DataError(f"{uri}: claim {uri.bucket} is not mounted at {mount} in this task "
                        f"(mount it there, or set {PVC_MOUNT_ENV})")
    root = mount / uri.prefix
    if not root.is_dir():
        raise DataError(f"{uri}: {root} is not a directory on the mounted claim")
    return root


def _is_folder_image(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) == 2 and is_label_name(parts[0]) and is_image_name(parts[1])


def _snapshot(uri: StorageURI, layout: str, objects: list[_Object], store: Any, cache_dir: Path) -> Path:
    """The snapshot directory of `objects`, downloading them first unless a complete snapshot exists."""
    listing = json.dumps([str(uri), layout, sorted((o.key, o.size, o.tag) for o in objects)])
    base = cache_dir / "remote" / uri.scheme
    final = base / hashlib.sha256(listing.encode()).hexdigest()[:16]
    data = Path(uri.bucket, *uri.prefix.split("/")) if uri.prefix else Path(uri.bucket)
    if final.is_dir():
        return final / data
    partial = base / f".{final.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        try:
            (partial / data).mkdir(parents=True)
        except OSError as exc:
            raise DataError(f"{base}: cannot create the download cache: {exc.strerror or exc}") from None
        for obj in objects:
            dest = partial / data / obj.rel
            dest.parent.mkdir(exist_ok=True)
            store.download(obj, dest)
            size = dest.stat().st_size
            if size != obj.size:
                raise DataError(f"{uri.scheme}://{uri.bucket}/{obj.key}: downloaded {size} bytes, listed {obj.size}")
        try:
            os.rename(partial, final)
        except OSError:
            if not final.is_dir():  # else another run completed the same snapshot first: use it
                raise
    except OSError as exc:
        raise DataError(f"{final}: cannot write the download: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final / data


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(text[0].split()) if text else type(exc).__name__


class _S3Store:
    """boto3 with a fresh session: endpoint, region and credentials from the environment as it is now."""

    def __init__(self, uri: StorageURI) -> None:
        try:
            import boto3
        except ImportError:
            raise DataError("s3:// data needs boto3 (pip install boto3)") from None
        self.uri = uri
        with self._errors():
            self.client = boto3.session.Session().client("s3")

    @contextmanager
    def _errors(self, key: str = "") -> Iterator[None]:
        import botocore.exceptions

        where = f"s3://{self.uri.bucket}" + (f"/{key}" if key else "")
        try:
            yield
        except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError):
            raise DataError(f"no AWS credentials for s3://{self.uri.bucket}: set AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY (from a Secret), AWS_SHARED_CREDENTIALS_FILE (a mounted Secret's "
                            "file), or give the pod an IAM role") from None
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code = {"404": "NotFound", "403": "AccessDenied"}.get(str(error.get("Code")), error.get("Code") or "error")
            raise DataError(f"{where}: {code}: {error.get('Message') or 'refused'}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise DataError(f"{where}: {_one_line(exc)}") from None

    def list(self) -> list[_Object]:
        start = self.uri.key_prefix
        objects = []
        with self._errors():
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.uri.bucket, Prefix=start)
            for page in pages:
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):  # "directory" marker objects
                        objects.append(_Object(item["Key"], item["Key"][len(start):], int(item["Size"]),
                                               str(item.get("ETag", ""))))
        return objects

    def download(self, obj: _Object, dest: Path) -> None:
        import boto3.exceptions

        with self._errors(obj.key):
            try:
                self.client.download_file(self.uri.bucket, obj.key, str(dest))
            except boto3.exceptions.Boto3Error as exc:
                raise DataError(f"s3://{self.uri.bucket}/{obj.key}: {_one_line(exc)}") from None


class _GCSStore:
    """google-cloud-storage's client: Application Default Credentials (or STORAGE_EMULATOR_HOST) as set now."""

    def __init__(self, uri: StorageURI) -> None:
        try:
            with warnings.catch_warnings():  # the Google libraries' notices about this Python and grpcio
                warnings.simplefilter("ignore", FutureWarning)
                from google.cloud import storage
        except ImportError:
            raise DataError("gs:// data needs google-cloud-storage (pip install google-cloud-storage)") from None
        self.uri = uri
        with self._errors():
            self.client = storage.Client()

    @contextmanager
    def _errors(self, key: str = "") -> Iterator[None]:
        import google.api_core.exceptions
        import google.auth.exceptions
        import requests.exceptions
        from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

        where = f"gs://{self.uri.bucket}" + (f"/{key}" if key else "")
        try:
            yield
        except google.auth.exceptions.DefaultCredentialsError as exc:
            named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
            if named:
                raise DataError(f"no Google credentials for gs://{self.uri.bucket}: GOOGLE_APPLICATION_CREDENTIALS="
                                f"{named}: {_one_line(exc)}") from None
            raise DataError(f"no Google credentials for gs://{self.uri.bucket}: set GOOGLE_APPLICATION_CREDENTIALS "
                            "to a mounted service-account key file, or run the pod with Workload Identity") from None
        except google.api_core.exceptions.GoogleAPICallError as exc:
            message = getattr(exc, "message", "") or _one_line(exc)
            raise DataError(f"{where}: {type(exc).__name__}: {_one_line(Exception(message))}") from None
        except (google.auth.exceptions.GoogleAuthError, google.api_core.exceptions.GoogleAPIError,
                requests.exceptions.RequestException, DataCorruption, InvalidResponse) as exc:
            raise DataError(f"{where}: {type(exc).__name__}: {_one_line(exc)}") from None

    def list(self) -> list[_Object]:
        start = self.uri.key_prefix
        with self._errors():
            return [_Object(blob.name, blob.name[len(start):], int(blob.size or 0),
                            f"{blob.generation}:{blob.md5_hash or blob.crc32c}", blob)
                    for blob in self.client.list_blobs(self.uri.bucket, prefix=start)
                    if not blob.name.endswith("/")]

    def download(self, obj: _Object, dest: Path) -> None:
        with self._errors(obj.key):
            obj.handle.download_to_filename(str(dest))
