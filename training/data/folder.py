"""The user's own images, laid out ``ROOT/<label>/*.png|jpg|...``, preprocessed exactly as served."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from handler.preprocessing import DIGITS, InvalidImageError, Profile, decode_image
from settings import MAX_IMAGE_PIXELS

from . import DataError, Dataset

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def load_image_folder(root: Path, test_fraction: float = 0.2, seed: int = 0, profile: Profile = DIGITS) -> Dataset:
    """Labels are the sub-directory names; a deterministic stratified split per class; each image is turned into
    ``profile``'s canvas as a request with its bytes would be.

    Each class with at least two images puts ``round(n * test_fraction)`` of them (at least
    one, at most n - 1) in test; a class with a single image goes to train.
    """
    root = Path(root)
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    files = _list_images(root)
    classes = tuple(files)
    images, labels, sources, train, test = [], [], [], [], []
    for label, (name, paths) in enumerate(files.items()):
        first = len(images)
        images.extend(_canvas(p, profile) for p in paths)
        sources.extend(f"{name}/{p.name}" for p in paths)
        labels.extend([label] * len(paths))
        cls_train, cls_test = _split(len(paths), test_fraction, seed, name)
        train.extend(first + cls_train)
        test.extend(first + cls_test)
    if not test:
        raise DataError(f"{root}: too few images for a test split: every class has a single image")
    stacked, labels_arr = np.stack(images), np.asarray(labels, dtype=np.int64)
    train_idx, test_idx = np.sort(train), np.sort(test)
    return Dataset(
        name=root.resolve().name or str(root),
        train_images=stacked[train_idx],
        train_labels=labels_arr[train_idx],
        test_images=stacked[test_idx],
        test_labels=labels_arr[test_idx],
        classes=classes,
        train_sources=np.asarray(sources, dtype=str)[train_idx],  # path relative to root: <label>/<file>
        source_kind="file",
    )


def _list_images(root: Path) -> dict[str, list[Path]]:
    """Sorted label -> sorted image paths; hidden entries and other file types are skipped."""
    if not root.is_dir():
        raise DataError(f"{root}: not a directory (expected {root}/<label>/<image>.png)")
    label_dirs = sorted(d for d in root.iterdir() if d.is_dir() and is_label_name(d.name))
    if not label_dirs:
        raise DataError(f"{root}: no label directories (expected {root}/<label>/<image>.png)")
    files = {}
    for d in label_dirs:
        paths = sorted(p for p in d.iterdir() if p.is_file() and is_image_name(p.name))
        if not paths:
            raise DataError(f"{d}: no images ({', '.join(sorted(e[1:] for e in IMAGE_EXTENSIONS))})")
        files[d.name] = paths
    return files


def image_layout(root: Path) -> str | None:
    """What a folder of images looks like: "labelled" (``<label>/`` folders holding images), "flat" (images but no
    such folder) or None (no images at its top or one level down); for hints where another layout was expected."""
    if (Path(root) / ".git").exists():
        return None  # a repository, whatever pictures it holds
    try:
        entries = [e for e in Path(root).iterdir() if not e.name.startswith(".")]
        if any(e.is_dir() and any(p.is_file() and is_image_name(p.name) for p in e.iterdir()) for e in entries):
            return "labelled"
    except OSError:
        return None
    return "flat" if any(e.is_file() and is_image_name(e.name) for e in entries) else None


def layout_hint(root: Path) -> str | None:
    """One line naming the fix when `root` holds images rather than what was expected of it, else None."""
    layout = image_layout(root)
    if layout == "labelled":
        return f"it holds <label>/ image folders: train with --data-source folder:{root}"
    if layout == "flat":
        return (f"it holds images without <label>/ folders: put them in {root}/<label>/ and use --data-source "
                f"folder:{root}")
    return None


def is_label_name(name: str) -> bool:
    """A sub-directory that names a class (hidden ones are skipped)."""
    return not name.startswith(".")


def is_image_name(name: str) -> bool:
    """A file inside a label directory that is read as an image (hidden ones and other types are skipped)."""
    return not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS


def _canvas(path: Path, profile: Profile = DIGITS) -> np.ndarray:
    try:
        return profile.canvas(decode_image(path.read_bytes()), MAX_IMAGE_PIXELS)
    except (InvalidImageError, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DataError(f"{path}: {reason}") from None


def _split(n: int, test_fraction: float, seed: int, label: str) -> tuple[np.ndarray, np.ndarray]:
    """Train and test positions within one class.

    Seeded by the label's name, not its index, so adding a class leaves the others' splits alone.
    """
    n_test = 0 if n < 2 else min(n - 1, max(1, round(n * test_fraction)))
    order = np.random.default_rng([seed, zlib.crc32(label.encode())]).permutation(n)
    return order[n_test:], order[:n_test]
