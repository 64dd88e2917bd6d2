"""Many image files through one EmbeddingClient: the folder walk, batched requests, per-file outcomes, the summary,
and the predict output formats (JSON lines, CSV, a JSON array).

A file that cannot be read, or that the server refuses (4xx), becomes a failed outcome and the run goes on; any
other failure (token, model, timeout, connection, 5xx for a whole request) stops the run by raising.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, TextIO

from handler.answer import TABLE_KEYS, Answer

from .errors import BadImageError, UsageError

if TYPE_CHECKING:
    from .api import EmbeddingClient

#: What a folder contributes: files with these extensions (any case); hidden files and folders are skipped.
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"})
FORMATS = ("jsonl", "csv", "json")
#: The fewest images per request at the end of a run (fewer are not worth a request's fixed cost).
TAIL_FLOOR = 8
#: The answer's table columns (handler.answer.TABLE_KEYS) between the image and a failed one's error and status.
CSV_COLUMNS = ("image", *TABLE_KEYS, "error", "status")


def _folder_images(root: Path) -> list[Path]:
    """Image files under `root`, recursively, sorted by their path below `root` (the same order everywhere)."""
    found: list[Path] = []
    for folder, subfolders, files in os.walk(root, onerror=_walk_error):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        found.extend(Path(folder, name) for name in files
                     if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES)
    return sorted(found, key=lambda path: path.relative_to(root).parts)


def _walk_error(exc: OSError) -> None:
    raise UsageError(f"{exc.filename}: cannot list ({exc.strerror})")


def walk(args: Sequence[str | Path]) -> list[Path]:
    """The files to send, in order: a file as given (whatever its extension), a folder's image files (by extension,
    recursively, so ``DIR/<label>/*.png`` works) sorted by path. UsageError for a missing path or an imageless
    folder."""
    images: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            found = _folder_images(path)
            if not found:
                raise UsageError(f"{path}: no image files ({', '.join(sorted(s[1:] for s in IMAGE_SUFFIXES))})")
            images.extend(found)
        elif path.is_file():
            images.append(path)
        elif path.exists():
            raise UsageError(f"{path}: not a file or folder")
        else:
            raise UsageError(f"{path}: no such file or folder")
    return images


@dataclass(frozen=True)
class Outcome:
    """One file's answer, or why it has none: ``kind`` ReadError (the file could not be read) or BadImageError
    (the server refused it, with its HTTP ``status``)."""

    path: Path
    answer: dict[str, Any] | None = None
    error: str | None = None
    status: int | None = None
    kind: str | None = None

    @property
    def failed(self) -> bool:
        return self.answer is None

    def row(self) -> dict[str, Any]:
        """The output record: the image's path and its answer, or its error, status and kind."""
        if self.answer is not None:
            return {"image": str(self.path), **self.answer}
        return {"image": str(self.path), "error": self.error, "status": self.status, "kind": self.kind}


def _answer_chunk(client: "EmbeddingClient", paths: list[Path], embedding: bool) -> list[Outcome]:
    """Read the chunk's files (an unreadable one fails alone) and send the rest in as few requests as allowed."""
    outcomes: list[Outcome | None] = []
    images: list[bytes] = []
    for path in paths:
        try:
            images.append(path.read_bytes())
            outcomes.append(None)
        except OSError as exc:
            outcomes.append(Outcome(path, error=f"cannot read ({exc.strerror or exc})", kind="ReadError"))
    answers = iter(client.transport.predict_batch(images, embedding) if images else [])
    done: list[Outcome] = []
    for path, outcome in zip(paths, outcomes):
        if outcome is None:
            result = next(answers)
            outcome = (Outcome(path, error=result.message, status=result.status, kind=type(result).__name__)
                       if isinstance(result, BadImageError) else Outcome(path, answer=result))
        done.append(outcome)
    return done


def chunk_sizes(total: int, batch_size: int, concurrency: int) -> Iterator[int]:
    """Images per request, in order, summing to `total`: `batch_size` each while plenty remain, then smaller ones
    (a ``1 / (2 * concurrency)`` share of what is left, but not below :data:`TAIL_FLOOR` or `batch_size` if smaller),
    so that the last requests in flight hold little work each and the server's workers finish close together instead
    of one working through a few full requests while the others wait."""
    floor = min(batch_size, TAIL_FLOOR)
    left = total
    while left > 0:
        size = min(left, batch_size, max(floor, -(-left // (2 * concurrency))))
        yield size
        left -= size


def answer_files(client: "EmbeddingClient", paths: Sequence[Path], batch_size: int = 64, concurrency: int = 4, *,
                 embedding: bool = False, on_done: Callable[[int], None] | None = None) -> Iterator[Outcome]:
    """Every file's Outcome, in the order of `paths`: up to `batch_size` files per request (see
    :func:`chunk_sizes`; gRPC: one per call), `concurrency` requests in flight, each file read by the thread that
    sends it. `on_done(n)` is called as each chunk of n files is answered. A failure that is not one file's (see the
    module's docstring) is raised; leaving the loop early sends nothing more."""
    if batch_size < 1 or concurrency < 1:
        raise UsageError("--batch-size and --concurrency must be at least 1")
    paths = list(paths)
    sizes = chunk_sizes(len(paths), batch_size, concurrency)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="batch")
    pending: dict[Future, int] = {}
    finished: dict[int, list[Outcome]] = {}
    submitted = 0
    position = 0

    def submit() -> bool:
        nonlocal submitted, position
        size = next(sizes, None)
        if size is None:
            return False
        chunk = paths[position:position + size]
        position += size
        pending[pool.submit(_answer_chunk, client, chunk, embedding)] = submitted
        submitted += 1
        return True

    try:
        while len(pending) < concurrency and submit():
            pass
        emitted = 0
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                number = pending.pop(future)
                finished[number] = future.result()
                submit()
                if on_done is not None:
                    on_done(len(finished[number]))
            while emitted in finished:
                yield from finished.pop(emitted)
                emitted += 1
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class Summary:
    """Counts over a run's outcomes: answered with a label (per label), unknown (open-set rejects), failed."""

    images: int = 0
    unknown: int = 0
    failed: int = 0
    labels: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: Outcome) -> None:
        self.images += 1
        if outcome.answer is None:
            self.failed += 1
            return
        answer = Answer.from_json(outcome.answer)
        if answer.unknown:
            self.unknown += 1
        else:
            self.labels[str(answer.pred)] += 1

    def lines(self) -> list[str]:
        by_label = ", ".join(f"{label}: {count}" for label, count in sorted(self.labels.items()))
        return [f"summary: {self.images} images, {sum(self.labels.values())} with a label, {self.unknown} unknown "
                f"(open-set rejects), {self.failed} failed",
                f"by label: {by_label or 'none'}"]


class RowWriter:
    """Predict's output, one row at a time: JSON lines, CSV (header first) or one JSON array. Rows are flushed at
    most every `flush_s` seconds (and by close), not one by one: a flush per row cost more client CPU than
    encoding the requests."""

    def __init__(self, out: TextIO, fmt: str, flush_s: float = 0.5) -> None:
        if fmt not in FORMATS:
            raise UsageError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
        self.out = out
        self.format = fmt
        self.rows = 0
        self.flush_s = flush_s
        self._flushed = time.monotonic()
        self.csv = csv.writer(out, lineterminator="\n") if fmt == "csv" else None
        if self.csv is not None:
            self.csv.writerow(CSV_COLUMNS)

    def write(self, row: dict[str, Any]) -> None:
        if self.csv is not None:
            self.csv.writerow([_cell(row.get(column)) for column in CSV_COLUMNS])
        elif self.format == "json":
            self.out.write(("[\n" if self.rows == 0 else ",\n") + json.dumps(row))
        else:
            self.out.write(json.dumps(row) + "\n")
        self.rows += 1
        now = time.monotonic()
        if now - self._flushed >= self.flush_s:
            self.out.flush()
            self._flushed = now

    def close(self) -> None:
        """Ends the JSON array (an empty one when no row was written) and flushes."""
        if self.format == "json":
            self.out.write("\n]\n" if self.rows else "[]\n")
        self.out.flush()


def _cell(value: Any) -> str:
    """A CSV cell: empty for a missing value, JSON for lists, objects and booleans, text otherwise."""
    if value is None:
        return ""
    if isinstance(value, (list, dict, bool)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)

