"""Writers for small MNIST-format IDX files generated inside the tests (no committed binaries)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array: magic 00 00 08 <ndim>, big-endian sizes, payload."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array: np.ndarray) -> Path:
    """Write ``array`` as IDX; gzip-compressed (reproducibly, mtime 0) when the name ends in .gz."""
    data = idx_bytes(array)
    path = Path(path)
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


def digit_like(n: int, seed: int, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images of a light bar on black whose position depends on the label, and labels 0..9 cycling."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) % 10).astype(np.uint8)
    images = rng.integers(0, 20, size=(n, size, size), dtype=np.uint8)
    for i, label in enumerate(labels):
        row = 4 + 2 * int(label)
        images[i, row : row + 3, 6:22] = rng.integers(180, 256, size=(3, 16), dtype=np.uint8)
    return images, labels


def make_idx_dir(directory: Path, n_train: int, n_test: int, gz: bool = True) -> dict[str, np.ndarray]:
    """The four MNIST files in ``directory``; returns the arrays keyed like Dataset fields."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    arrays = {}
    for split, prefix, n, seed in (("train", "train", n_train, 1), ("test", "t10k", n_test, 2)):
        images, labels = digit_like(n, seed)
        write_idx(directory / f"{prefix}-images-idx3-ubyte{ext}", images)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte{ext}", labels)
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = images, labels
    return arrays
