"""What ``python -m client`` writes: the progress bar, predict's rows and embed's .npy with its file list.

Every output file is written to a temporary file beside it and renamed into place, so a run stopped by an error
leaves no partial file; the ``*_output`` / ``embed_listing`` checks say whether an existing file is one the
command wrote before (owned_paths replaces only those).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, TextIO

from .batch import CSV_COLUMNS


class NoBar:
    """What the run uses of a tqdm bar, for runs without one (tqdm is then not imported: it costs start-up)."""

    def __enter__(self) -> "NoBar":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def clear(self) -> None:
        pass

    def write(self, text: str, file: TextIO | None = None) -> None:
        print(text, file=file or sys.stderr)


def progress(total: int, disabled: bool) -> Any:
    """A tqdm bar on stderr when it is a terminal and the bar is not `disabled`; a NoBar otherwise."""
    if disabled or not sys.stderr.isatty():
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="img", file=sys.stderr, leave=False)


def report_failure(bar: Any, outcome: Any) -> None:
    """One line on stderr (above the bar) for an image that failed."""
    status = f" (HTTP {outcome.status})" if outcome.status else ""
    bar.write(f"client: failed: {outcome.path}: {outcome.error}{status}", file=sys.stderr)


@contextlib.contextmanager
def text_output(out: Path | None) -> Iterator[TextIO]:
    """Standard output, or a temporary file beside `out` renamed onto it when the run completes (a run stopped by an
    error leaves no partial file)."""
    if out is None:
        yield sys.stdout
        return
    created = [folder for folder in [out.parent, *out.parent.parents] if not folder.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            yield fh
        os.replace(name, out)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        for folder in created:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def predict_output(path: Path) -> bool:
    """Whether `path` holds predict's output in any format: its CSV header, an empty JSON array, or a first row that
    is an image's answer or failure."""
    with open(path, "rb") as fh:
        first = fh.readline(1 << 20)
        if first == b"[\n":  # a JSON array: the first row is on the next line
            first = fh.readline(1 << 20).rstrip(b",\n")
    if first in (",".join(CSV_COLUMNS).encode() + b"\n", b"[]\n"):
        return True
    row = json.loads(first)
    if not isinstance(row, dict) or next(iter(row), None) != "image":
        return False
    return {"error", "status", "kind"} <= row.keys() or set(CSV_COLUMNS[1:-2]) <= row.keys()


def sidecar_path(out: Path) -> Path:
    """Where embed lists the file order: embeddings.npy -> embeddings.files.json."""
    return out.with_name(f"{out.stem if out.suffix == '.npy' else out.name}.files.json")


def embed_listing(path: Path) -> bool:
    """Whether `path` is the file list that embed writes beside its .npy."""
    listing = json.loads(Path(path).read_text())
    return isinstance(listing, dict) and {"files", "count", "dim", "model", "failed"} <= listing.keys()


def embed_output(path: Path) -> bool:
    """Whether `path` is an .npy that embed wrote: an .npy with embed's file list beside it."""
    with open(path, "rb") as fh:
        return fh.read(6) == b"\x93NUMPY" and embed_listing(sidecar_path(path))


def write_embeddings(out: Path, matrix: Any, sidecar: dict[str, Any]) -> None:
    """The .npy (no pickle) and its sidecar, each written to a temporary file and renamed into place."""
    import numpy as np

    targets = [(out, lambda fh: np.save(fh, matrix, allow_pickle=False)),
               (sidecar_path(out), lambda fh: fh.write(json.dumps(sidecar, indent=1).encode()))]
    temps: list[Path] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for target, write in targets:
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
            temps.append(Path(name))
            with os.fdopen(fd, "wb") as fh:
                write(fh)
        for (target, _), temp in zip(targets[::-1], temps[::-1]):  # the sidecar first: an .npy always has one
            os.replace(temp, target)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
