"""Where a command may write: it replaces only what it made before, and never what a user owns.

Every command that writes to a path the user names asks here first, before any slow work starts:

- a folder may be replaced when it is missing, empty, or holds the marker file (MARKER) that the same kind of
  output wrote into it; folders from before the marker existed count too when every entry is a name that kind of
  output writes (``known``);
- a file may be replaced when it is missing or ``ours(path)`` recognises it as the same command's output;
- never, whatever it holds: the current directory or a folder above it, the home folder or one above it, the
  filesystem root, a git repository, or a path the command reads from (or one inside or above it).

A refusal is a cli_common.UsageError: one line that names the flag, the path and why.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from cli_common import UsageError

#: The marker file a command writes into a folder it made: {"kind": ..., "made_by": ...}.
MARKER = ".embedding-output.json"


def _resolved(path: Path | str) -> Path:
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path)))).resolve()


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _protected(path: Path) -> str | None:
    """Why `path` (resolved) may never be replaced, or None."""
    if path == Path(path.anchor):
        return "is the filesystem root"
    if _within(Path.cwd().resolve(), path):
        return "is the current directory" if path == Path.cwd().resolve() else "holds the current directory"
    home = Path.home().resolve()
    if _within(home, path):
        return "is the home folder" if path == home else "holds the home folder"
    if (path / ".git").exists():
        return "is a git repository"
    return None


def _overlaps_reads(path: Path, reads: Iterable[Path | str | None]) -> Path | None:
    for read in reads:
        if read is None or str(read) == "":
            continue
        read = _resolved(read)
        if _within(read, path) or _within(path, read):
            return read
    return None


def marker_kind(folder: Path) -> str | None:
    """The kind recorded in `folder`'s marker, or None when it has none (or an unreadable one)."""
    try:
        return str(json.loads((Path(folder) / MARKER).read_text())["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _ours(folder: Path, kind: str, known: Iterable[str]) -> bool:
    if marker_kind(folder) == kind:
        return True
    patterns = tuple(known)
    entries = [entry.name for entry in folder.iterdir()]
    return bool(patterns) and all(any(fnmatch.fnmatchcase(name, p) for p in patterns) for name in entries)


def replaceable_dir(path: Path, kind: str, flag: str, reads: Iterable[Path | str | None] = (),
                    known: Iterable[str] = ()) -> Path:
    """`path` if a command making a `kind` folder may replace it (see the module's rules); UsageError otherwise.

    `reads`: what the command reads from; `known`: glob patterns of every name a `kind` folder holds, which
    lets folders made before the marker existed be replaced.
    """
    resolved = _resolved(path)
    why = _protected(resolved)
    if why:
        raise UsageError(f"{flag} {path}: {why}; name a new folder for the output")
    read = _overlaps_reads(resolved, reads)
    if read is not None:
        raise UsageError(f"{flag} {path}: the command reads from {read}; name a separate folder for the output")
    if resolved.exists() and not resolved.is_dir():
        raise UsageError(f"{flag} {path}: is a file, not a folder")
    if resolved.is_dir() and any(resolved.iterdir()) and not _ours(resolved, kind, known):
        raise UsageError(f"{flag} {path}: holds files this command did not make; name a new or empty folder "
                         f"(nothing was changed)")
    return path


def mark(folder: Path, kind: str, made_by: str) -> Path:
    """Write the marker into `folder` (which the caller made), so a later run may replace it."""
    marker = Path(folder) / MARKER
    marker.write_text(json.dumps({"kind": kind, "made_by": made_by}) + "\n")
    return marker


def replaceable_file(path: Path, flag: str, ours: Callable[[Path], bool] | None = None,
                     reads: Iterable[Path | str | None] = ()) -> Path:
    """`path` if a file may be written there: it is missing, or `ours(path)` says this command wrote it."""
    resolved = _resolved(path)
    if resolved.is_dir():
        raise UsageError(f"{flag} {path}: is a folder, not a file")
    read = _overlaps_reads(resolved, reads)
    if read is not None:
        raise UsageError(f"{flag} {path}: the command reads from {read}; name another file for the output")
    if resolved.exists() and not (ours is not None and _safe(ours, resolved)):
        raise UsageError(f"{flag} {path}: exists and was not written by this command; name a new file "
                         f"(nothing was changed)")
    return path


def _safe(ours: Callable[[Path], bool], path: Path) -> bool:
    try:
        return bool(ours(path))
    except (OSError, ValueError):
        return False


def starts_with(prefix: bytes) -> Callable[[Path], bool]:
    """An `ours` test for replaceable_file: the file begins with `prefix` (a header the command writes)."""
    def test(path: Path) -> bool:
        with open(path, "rb") as fh:
            return fh.read(len(prefix)) == prefix
    return test
