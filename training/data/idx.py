"""MNIST-format IDX files (MNIST, Fashion-MNIST, ...), plain or gzip-compressed, read with numpy.

The format: a 4-byte magic ``00 00 <type> <ndim>``, ``ndim`` big-endian uint32 sizes, then
the row-major payload. Only the unsigned-byte type (0x08) that the MNIST family uses is
accepted, and the payload must have exactly the length the header declares.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import BinaryIO, Iterable

import numpy as np

from . import DataError, Dataset

UBYTE = 0x08
IMAGES_MAGIC = 0x00000803  # uint8, 3 dimensions (N, H, W)
LABELS_MAGIC = 0x00000801  # uint8, 1 dimension (N,)
_KIND = {IMAGES_MAGIC: "images", LABELS_MAGIC: "labels"}
_CHUNK = 1 << 20
CLASSES = tuple(str(d) for d in range(10))
#: Fashion-MNIST's label names, in label order (Zalando's README).
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
#: Split name -> file-name prefix, as the MNIST distribution spells them.
SPLITS = {"train": "train", "test": "t10k"}


def read_idx(path: Path, magic: int | None = None) -> np.ndarray:
    """Read one IDX file (``.gz`` decompressed on the fly) into a writable uint8 array.

    ``magic``, when given, is the exact magic number required (IMAGES_MAGIC or LABELS_MAGIC).
    Reading is bounded by the header, so a lying header or a gzip bomb cannot exhaust memory.
    """
    path = Path(path)
    gz = path.name.endswith(".gz")
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            return _parse(f, path, magic)
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError, zlib.error) as exc:
        problem = "corrupt gzip" if gz else "cannot read"
        raise DataError(f"{path}: {problem}: {_one_line(exc)}") from None


def load_idx_dir(path: Path, name: str | None = None) -> Dataset:
    """Load the four MNIST IDX files of a directory (``train-images-idx3-ubyte[.gz]`` etc.).

    ``name`` defaults to "fashion-mnist" when the path mentions fashion, else "mnist".
    """
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{path}: not a directory")
    files = _find_files(path)
    arrays = {}
    for split, prefix in SPLITS.items():
        images = read_idx(files[f"{prefix}-images"], IMAGES_MAGIC)
        labels = read_idx(files[f"{prefix}-labels"], LABELS_MAGIC)
        _check_split(files[f"{prefix}-images"], images, files[f"{prefix}-labels"], labels)
        arrays[split] = (images, labels.astype(np.int64))
    name = name or ("fashion-mnist" if "fashion" in str(path).lower() else "mnist")
    return Dataset(
        name=name,
        train_images=arrays["train"][0],
        train_labels=arrays["train"][1],
        test_images=arrays["test"][0],
        test_labels=arrays["test"][1],
        classes=FASHION_CLASSES if name == "fashion-mnist" else CLASSES,
        train_sources=np.arange(len(arrays["train"][0]), dtype=np.int64),  # index in the train IDX file
        source_kind="dataset_index",
    )


def _candidates(prefix: str, kind: str) -> list[str]:
    ndim = 3 if kind == "images" else 1
    names = [f"{prefix}-{kind}-idx{ndim}-ubyte", f"{prefix}-{kind}.idx{ndim}-ubyte"]
    return [n + ext for n in names for ext in ("", ".gz")]


def _find_files(path: Path) -> dict[str, Path]:
    """``{"train-images": Path, ...}``; one DataError listing every file that is missing."""
    found, missing = select_idx_files(p.name for p in path.iterdir() if p.is_file())
    if missing:
        raise DataError(f"{path}: missing IDX file(s): {', '.join(missing)}")
    return {key: path / name for key, name in found.items()}


def select_idx_files(names: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """The files of one directory, by name, that load_idx_dir reads: ``({"train-images": name, ...}, missing)``.

    Also used on a bucket listing, to download only these files and name the missing ones before any download.
    """
    present = set(names)
    found, missing = {}, []
    for prefix in SPLITS.values():
        for kind in ("images", "labels"):
            candidates = _candidates(prefix, kind)
            hit = next((n for n in candidates if n in present), None)
            if hit is None:
                missing.append(f"{candidates[0]}[.gz]")
            else:
                found[f"{prefix}-{kind}"] = hit
    return found, missing


def _check_split(images_path: Path, images: np.ndarray, labels_path: Path, labels: np.ndarray) -> None:
    if len(images) != len(labels):
        raise DataError(
            f"{images_path.parent}: {images_path.name} has {len(images)} images "
            f"but {labels_path.name} has {len(labels)} labels"
        )
    if len(labels) and labels.max() >= len(CLASSES):
        raise DataError(f"{labels_path}: label {int(labels.max())} outside 0..{len(CLASSES) - 1}")


def _parse(f: BinaryIO, path: Path, magic: int | None) -> np.ndarray:
    head = f.read(4)
    if len(head) < 4:
        raise DataError(f"{path}: truncated: {len(head)} bytes, too short for an IDX header")
    found = int.from_bytes(head, "big")
    _check_magic(path, head, found, magic)
    ndim = head[3]
    raw_dims = f.read(4 * ndim)
    if len(raw_dims) < 4 * ndim:
        raise DataError(f"{path}: truncated: header declares {ndim} dimensions but ends after {len(raw_dims)} bytes")
    shape = tuple(int(d) for d in np.frombuffer(raw_dims, dtype=">u4"))
    size = int(np.prod(shape, dtype=object))
    payload = _read_at_most(f, size)
    if len(payload) < size:
        raise DataError(f"{path}: truncated: header says {_describe(shape)}, payload has {len(payload)} bytes")
    extra = _count_rest(f)
    if extra:
        raise DataError(f"{path}: over-long: header says {_describe(shape)}, payload has {size + extra} bytes")
    return np.frombuffer(payload, dtype=np.uint8).reshape(shape)


def _check_magic(path: Path, head: bytes, found: int, magic: int | None) -> None:
    hint = " (the file looks gzip-compressed: name it .gz)" if head[:2] == b"\x1f\x8b" else ""
    if magic is not None and found != magic:
        raise DataError(f"{path}: bad magic 0x{found:08x}, expected 0x{magic:08x} ({_KIND.get(magic, 'idx')}){hint}")
    if head[:2] != b"\x00\x00":
        raise DataError(f"{path}: bad magic 0x{found:08x}, not an IDX file{hint}")
    if head[2] != UBYTE:
        raise DataError(f"{path}: unsupported IDX element type 0x{head[2]:02x}, only 0x08 (unsigned byte) is read")
    if head[3] == 0:
        raise DataError(f"{path}: bad magic 0x{found:08x}: zero dimensions")


def _describe(shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return f"{shape[0]} items"
    return f"{'x'.join(map(str, shape))} = {int(np.prod(shape, dtype=object))} bytes"


def _read_at_most(f: BinaryIO, size: int) -> bytearray:
    """Up to ``size`` bytes, grown chunk by chunk so that memory follows the real data."""
    out = bytearray()
    while len(out) < size:
        chunk = f.read(min(_CHUNK, size - len(out)))
        if not chunk:
            break
        out += chunk
    return out


def _count_rest(f: BinaryIO) -> int:
    """Bytes left after the payload; reading to the end also makes gzip verify its CRC."""
    extra = 0
    while chunk := f.read(_CHUNK):
        extra += len(chunk)
    return extra


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
