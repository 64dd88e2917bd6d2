"""Whole build into one output directory, published atomically."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import uuid
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from handler.artifacts import remove_tree
from handler.search import DEFAULT_K
from owned_paths import mark
from settings import DEFAULT_THREADS

from .config import DEFAULT_KTH, DEFAULT_OPEN_SET_SCORE
from .outputs import ARTIFACTS_KIND, MADE_BY, artifacts_folder, source_reads
from .steps import build_gallery, evaluate_and_finalize, prepare_data, train_and_export
from .train import TrainConfig


RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories in one atomic step: Linux renameat2(RENAME_EXCHANGE). OSError where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:
        raise OSError(errno.ENOSYS, "renameat2 is not available") from None
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a))


def _restore_previous(out: Path) -> None:
    """A build killed between the fallback's two renames left no `out`: put the previous one back."""
    if out.exists():
        return
    previous = sorted(out.parent.glob(f".{out.name}.previous-*"), key=lambda p: p.stat().st_mtime)
    if previous:
        os.replace(previous[-1], out)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_abandoned(out: Path) -> None:
    """Remove staging directories left by killed builds (named after their process, which is gone)."""
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        owner = stale.name.rsplit(".partial-", 1)[1].split("-", 1)[0]
        if owner.isdigit() and not _pid_alive(int(owner)):
            remove_tree(stale)


@contextlib.contextmanager
def staged_directory(out: Path, reads: Iterable[Path | str | None] = (), made_by: str = MADE_BY,
                     flag: str = "--out") -> Iterator[Path]:
    """Yield a hidden sibling directory; on success it replaces `out`, on any failure it is removed.

    `out` must be a folder an artifact build may replace (training.outputs.artifacts_folder: missing, empty,
    marked as artifacts, or holding artifact names only; never one the build `reads`), checked on entry and
    again before publishing; otherwise cli_common.UsageError, one line naming `flag`, and nothing is touched.
    The staging directory carries the marker, so `out` is marked the moment it is published.

    The new directory takes the old one's place in one atomic exchange, so a reader, or a kill at any
    moment, sees the previous complete directory or the new one. Where the exchange is not supported
    it falls back to two renames, and a build killed between them is repaired by the next one.
    """
    reads = list(reads)
    if Path(out).exists() and not Path(out).is_dir():
        raise NotADirectoryError(f"{Path(out).resolve()}: exists and is not a directory")
    _restore_previous(Path(out).resolve())
    artifacts_folder(out, flag, reads)
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(out)
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging = out.parent / f".{out.name}.partial-{token}"
    previous = out.parent / f".{out.name}.previous-{token}"
    staging.mkdir()
    try:
        mark(staging, ARTIFACTS_KIND, made_by)
        yield staging
        artifacts_folder(out, flag, reads)  # still ours after the build's minutes
        if not out.exists():
            os.replace(staging, out)
            return
        try:
            _exchange(staging, out)  # staging now holds the previous build; removed below
            return
        except OSError:
            pass
        try:
            os.replace(out, previous)
            os.replace(staging, out)
        except BaseException:
            if previous.exists() and not out.exists():
                os.replace(previous, out)  # interrupted between the two renames: put the old one back
            raise
        remove_tree(previous)
    finally:
        remove_tree(staging)


def build_artifacts(source: str, out: Path, config: TrainConfig, index_type: str = "auto",
                    k: int = DEFAULT_K, cache_dir: Path | None = None, threads: int = DEFAULT_THREADS,
                    plots: bool = True, log: Callable[[str], None] = print,
                    score: str = DEFAULT_OPEN_SET_SCORE, kth: int = DEFAULT_KTH, profile: str = "auto") -> dict:
    """Data -> trained TorchScript model -> FAISS gallery -> evaluation -> metadata, in `out`. ``profile``: the
    preprocessing profile's name, or auto (the dataset's, training.config.DATASET_PROFILES). `out` is refused
    before any work unless a build may replace it (staged_directory)."""
    reads = source_reads(source, cache_dir)
    artifacts_folder(out, reads=reads)
    torch.set_num_threads(threads)
    data = prepare_data(source, cache_dir, profile=profile)
    log(f"data {data.name}: {len(data.train_images)} train / {len(data.test_images)} test images, "
        f"{len(data.classes)} classes, {data.profile} preprocessing")
    with staged_directory(out, reads) as staging:
        train_and_export(data, config, staging, k, log)
        build_gallery(data, staging, index_type, config.seed, log)
        metadata = evaluate_and_finalize(data, staging, k, plots, log, score, kth)
    return metadata
