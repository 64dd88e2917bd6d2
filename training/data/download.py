"""Full MNIST fetched from public mirrors into a checksummed cache.

Each file is streamed into ``<file>.part`` while being hashed and only renamed to its
final name once its SHA-256 matches, so the cache never holds a partial or wrong file
under a final name. An interrupted ``.part`` is resumed with an HTTP Range request.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from . import DataError, Dataset
from .idx import load_idx_dir

#: Tried in order; each serves the four files under the same names.
MIRRORS = [
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
]
#: File name -> SHA-256 of the published gzip archives.
FILES = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
SUPPORTED = ("mnist",)
USER_AGENT = "mnist-embedding-data/1 (python-urllib)"
_CHUNK = 1 << 16


class _Dropped(Exception):
    """The body ended early or the socket failed mid-body: the .part is worth resuming."""


def download_mnist(
    name: str,
    cache_dir: Path,
    mirrors: list[str] | None = None,
    timeout: float = 30.0,
    files: dict[str, str] | None = None,
) -> Path:
    """Ensure ``<cache_dir>/<name>`` holds every file with its SHA-256; return that directory.

    ``mirrors`` and ``files`` (name -> sha256) default to MIRRORS and FILES.
    """
    if name not in SUPPORTED:
        raise DataError(f"cannot download {name!r}: supported: {', '.join(SUPPORTED)}")
    target = Path(cache_dir) / name
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{target}: cannot create the cache directory: {exc.strerror or exc}") from None
    for filename, sha256 in (FILES if files is None else files).items():
        fetch_file(filename, sha256, target, MIRRORS if mirrors is None else mirrors, timeout)
    return target


def load_idx_dir_from_cache(path: Path, name: str) -> Dataset:
    return load_idx_dir(path, name=name)


def fetch_file(filename: str, sha256: str, directory: Path, mirrors: list[str], timeout: float) -> Path:
    """``directory/filename`` verified against ``sha256``, downloaded from the first mirror that works."""
    final = directory / filename
    if final.is_file() and _sha256_of(final) == sha256:
        return final
    part = directory / f"{filename}.part"
    failures = []
    for mirror in mirrors:
        error = _from_mirror(mirror.rstrip("/") + "/" + filename, part, sha256, timeout)
        if error is None:
            try:
                os.replace(part, final)
            except OSError as exc:
                raise DataError(f"{final}: cannot move the verified download into place: {exc}") from None
            return final
        failures.append(f"{mirror} ({error})")
    raise DataError(f"{filename}: every mirror failed: {'; '.join(failures) or 'no mirrors given'}")


def _from_mirror(url: str, part: Path, sha256: str, timeout: float) -> str | None:
    """Download ``url`` into ``part`` until it hashes to ``sha256``; None on success, else why not.

    A dropped connection is retried once with Range; a resumed file that fails its checksum
    (a stale .part) is retried once from zero.
    """
    retried_drop = retried_fresh = False
    while True:
        resumed = part.is_file() and part.stat().st_size > 0
        try:
            digest = _stream(url, part, timeout, sha256)
        except _Dropped as exc:
            if retried_drop:
                return f"connection dropped twice: {exc}"
            retried_drop = True
            continue
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and resumed and not retried_fresh:  # .part longer than the file
                part.unlink(missing_ok=True)
                retried_fresh = True
                continue
            return f"HTTP {exc.code} {exc.reason}"
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            return _describe_error(exc)
        if digest == sha256:
            return None
        part.unlink(missing_ok=True)
        if resumed and not retried_fresh:
            retried_fresh = True
            continue
        return f"checksum mismatch: got sha256 {digest[:12]}..., expected {sha256[:12]}..."


def _stream(url: str, part: Path, timeout: float, sha256: str) -> str:
    """Append the rest of ``url`` to ``part`` (Range when it exists) and return the file's SHA-256."""
    hasher = hashlib.sha256()
    offset = _hash_into(part, hasher) if part.is_file() else 0
    if offset and hasher.hexdigest() == sha256:
        return sha256  # a complete .part left by an interrupted run
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    with _open(url, headers, timeout) as resp:
        if offset and resp.status == 206:
            _check_content_range(resp.headers.get("Content-Range"), offset)
        else:
            offset, hasher = 0, hashlib.sha256()  # a 200 answer is the whole file: restart
        length = resp.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        received = offset
        with open(part, "ab" if offset else "wb") as out, _progress(url.rsplit("/", 1)[-1], total, offset) as bar:
            while chunk := _read_body(resp, received):
                out.write(chunk)
                hasher.update(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    if total is not None and received < total:
        raise _Dropped(f"got {received} of {total} bytes")
    return hasher.hexdigest()


def _open(url: str, headers: dict[str, str], timeout: float) -> http.client.HTTPResponse:
    """urlopen, with a connection reset before the answer counted as a drop worth one retry."""
    resets = (ConnectionResetError, ConnectionAbortedError)  # RemoteDisconnected is one
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except resets as exc:
        raise _Dropped(f"{_describe_error(exc)} before the answer") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, resets):
            raise _Dropped(f"{_describe_error(exc)} before the answer") from None
        raise


def _read_body(resp: http.client.HTTPResponse, received: int) -> bytes:
    try:
        return resp.read(_CHUNK)
    except (http.client.HTTPException, OSError) as exc:
        raise _Dropped(f"{_describe_error(exc)} after {received} bytes") from None


def _check_content_range(value: str | None, offset: int) -> None:
    """A 206 must resume exactly where the .part ends; anything else would corrupt it."""
    start = value.split()[-1].split("-")[0] if value else ""
    if start != str(offset):
        raise http.client.HTTPException(f"206 with Content-Range {value!r}, expected bytes {offset}-")


def _hash_into(path: Path, hasher) -> int:
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
            size += len(chunk)
    return size


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    _hash_into(path, hasher)
    return hasher.hexdigest()


def _progress(desc: str, total: int | None, initial: int) -> tqdm:
    return tqdm(
        desc=desc,
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
        leave=False,
    )


def _describe_error(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) if isinstance(exc, urllib.error.URLError) else None
    text = str(reason if reason is not None else exc)
    return " ".join(text.split()) or type(exc).__name__
