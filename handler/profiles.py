"""The preprocessing profiles: one registry entry per profile, checked when this module is imported.

An entry (:class:`ProfileEntry`) holds everything a profile needs, in one place: the canvas of each version it
serves (newest first: new models are built with ``versions[0]``), the statistics that scale canvases into model
input, the training defaults its images call for (augmentation and pooling, :class:`TrainingDefaults`), the
quantization ``--quantize auto`` builds, and the datasets whose ``--preprocessing auto`` it is. A part left out
is a TypeError, and a part out of range a :class:`RegistryError`, at import: never a KeyError at train time.
Adding a profile is one entry in :data:`REGISTRY` plus its canvas function; adding a version is one
:class:`Version` line at the front of its entry's ``versions``.

A model's metadata.json records the profile's name and version (:meth:`Profile.record`); :func:`profile_of`
gives back the profile it was built with and refuses one this code does not serve.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .canvas import BOX, CANVAS, full_frame
from .decoding import DEFAULT_MAX_PIXELS, ImageInput, gray_array
from .digits import (counted_v1, counted_v2, counted_v3, counted_v4, to_canvas, to_canvas_v2, to_canvas_v3,
                     to_canvas_v4)

#: Mean and std of MNIST training pixels scaled to 0..1 (the customary figures).
MEAN = 0.1307
STD = 0.3081
#: Post-training quantization schemes of the exported model (training.quantize).
QUANTIZATION = ("none", "int8")

Canvas = Callable[[ImageInput, int], np.ndarray]
Counted = Callable[[np.ndarray], "tuple[np.ndarray, bool]"]


class RegistryError(ValueError):
    """A registry entry is incomplete or inconsistent (raised when handler.profiles is imported)."""


class ProfileError(ValueError):
    """metadata.json names a preprocessing this code does not implement."""


@dataclass(frozen=True)
class Profile:
    """A named preprocessing at one version: image -> uint8 canvas, and the statistics that scale canvases into
    model input. metadata.json records name and version."""

    name: str
    version: str
    canvas: Canvas
    mean: float
    std: float
    #: The box the content is fitted into, for profiles that crop to it.
    box: int | None = None
    #: Digits profiles: a grayscale array -> (the canvas, whether several digits stand side by side in it).
    counted: Counted | None = None

    def normalize(self, canvases: np.ndarray) -> np.ndarray:
        """uint8 canvases (N, 28, 28) -> float32 model input (N, 1, 28, 28)."""
        x = np.asarray(canvases, dtype=np.float32) / 255.0
        return ((x - self.mean) / self.std)[:, None, :, :].astype(np.float32)

    def preprocess(self, image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
        """One image -> float32 (1, 28, 28): the exact tensor a model of this profile was trained on."""
        return self.normalize(self.canvas(image, max_pixels)[None])[0]

    def read(self, image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[np.ndarray, bool]:
        """:meth:`preprocess`'s tensor, from one decoding, and whether the image holds several digits side by side
        (False for profiles that do not look)."""
        gray = gray_array(image, max_pixels)
        canvas, several = self.counted(gray) if self.counted else (self.canvas(gray, max_pixels), False)
        return self.normalize(canvas[None])[0], several

    def canvases_from_arrays(self, images: np.ndarray) -> np.ndarray:
        """Raw uint8 images (N, H, W) -> canvases (N, 28, 28), as training reads a dataset."""
        if not len(images):
            return np.zeros((0, CANVAS, CANVAS), np.uint8)
        return np.stack([self.canvas(img, DEFAULT_MAX_PIXELS) for img in images])

    def record(self) -> dict[str, Any]:
        """What metadata.json keeps of this profile (enroll compares it, the handler checks it)."""
        return {"profile": self.name, "version": self.version, "mean": self.mean, "std": self.std,
                "canvas": CANVAS, **({} if self.box is None else {"box": self.box})}


@dataclass(frozen=True)
class Version:
    """One version of a profile's canvas: image -> uint8 canvas, and (digits) the canvas with the several-digits
    look from one grayscale array."""

    version: str
    canvas: Canvas
    counted: Counted | None = None


@dataclass(frozen=True)
class TrainingDefaults:
    """What training takes for the TrainConfig fields left None (training.train.resolve_profile_defaults)."""

    max_rotation: float  # degrees
    hflip: bool  # mirror half of each batch left-right
    erase: float  # share of images with a random rectangle erased
    pool: str  # how the last feature map becomes a vector (training.model.POOLING)


@dataclass(frozen=True)
class ProfileEntry:
    """Everything one preprocessing profile needs (module docstring)."""

    name: str
    mean: float
    std: float
    box: int | None
    #: Newest first: ``versions[0]`` is what new models are built with; every one is served.
    versions: tuple[Version, ...]
    training: TrainingDefaults
    #: What ``--quantize auto`` builds for this profile (one of QUANTIZATION).
    quantize: str
    #: Datasets (training.data Dataset.name) whose ``--preprocessing auto`` is this profile.
    datasets: tuple[str, ...] = ()

    def profile(self, version: Version) -> Profile:
        return Profile(self.name, version.version, version.canvas, self.mean, self.std, self.box, version.counted)


def to_full_frame(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Any image -> uint8 (28, 28) with the whole frame kept (handler.canvas.full_frame)."""
    return full_frame(gray_array(image, max_pixels))


#: Every preprocessing profile. The first is the default where no dataset claims another.
REGISTRY: tuple[ProfileEntry, ...] = (
    # Digits as MNIST was made (crop to content, 20x20 box, centre of mass); photos and scans have their light
    # removed and their digit found first. Digits turn a little and are never mirrored (a mirrored digit is another
    # symbol); their centred strokes are pooled. int8 keeps the held-out, open-set, photo and printed-digit figures
    # and serves faster (docs/decisions.md).
    ProfileEntry("digits", MEAN, STD, BOX,
                 versions=(Version("4", to_canvas_v4, counted_v4), Version("3", to_canvas_v3, counted_v3),
                           Version("2", to_canvas_v2, counted_v2), Version("1", to_canvas, counted_v1)),
                 training=TrainingDefaults(max_rotation=10.0, hflip=False, erase=0.0, pool="avg"),
                 quantize="int8"),
    # The whole frame kept, for centred pictures whose outline carries the class (Fashion-MNIST; its customary
    # training-set statistics). Garments stand upright, mirror freely and lose parts to occlusion: random erasing
    # (Zhong et al., AAAI 2020); the feature map keeps its layout. Float: int8 lost 0.16 point of held-out accuracy.
    ProfileEntry("full-frame", 0.2860, 0.3530, None,
                 versions=(Version("1", to_full_frame),),
                 training=TrainingDefaults(max_rotation=0.0, hflip=True, erase=0.5, pool="flatten"),
                 quantize="none", datasets=("fashion-mnist",)),
)


def check_registry(entries: tuple[ProfileEntry, ...]) -> None:
    """Raise RegistryError for an entry that is incomplete or contradicts another (run at import)."""
    names = [entry.name for entry in entries]
    problems = [f"profile {name!r} is registered twice" for name in set(names) if names.count(name) > 1]
    claimed = [dataset for entry in entries for dataset in entry.datasets]
    problems += [f"dataset {d!r} is claimed by two profiles" for d in set(claimed) if claimed.count(d) > 1]
    for entry in entries:
        versions = [v.version for v in entry.versions]
        if not versions or len(set(versions)) != len(versions):
            problems.append(f"{entry.name}: versions must be listed once each, newest first, got {versions}")
        problems += [f"{entry.name} version {v.version}: its canvas is not callable"
                     for v in entry.versions if not callable(v.canvas)]
        if entry.quantize not in QUANTIZATION:
            problems.append(f"{entry.name}: quantize must be one of {QUANTIZATION}, got {entry.quantize!r}")
        if not isinstance(entry.training, TrainingDefaults):
            problems.append(f"{entry.name}: training must be TrainingDefaults, got {entry.training!r}")
        if not (entry.std > 0 and 0 <= entry.mean <= 1):
            problems.append(f"{entry.name}: mean {entry.mean} and std {entry.std} do not scale 0..1 pixels")
    if problems:
        raise RegistryError("preprocessing registry: " + "; ".join(problems))


check_registry(REGISTRY)

#: Every entry by name.
ENTRIES: Mapping[str, ProfileEntry] = {entry.name: entry for entry in REGISTRY}
#: Every profile the handler serves, by (name, version).
SERVED: Mapping[tuple[str, str], Profile] = {(entry.name, v.version): entry.profile(v)
                                             for entry in REGISTRY for v in entry.versions}
#: The profile new models are built with, by name.
PROFILES: Mapping[str, Profile] = {entry.name: SERVED[entry.name, entry.versions[0].version] for entry in REGISTRY}
#: ``--preprocessing auto``: the profile of a dataset an entry claims; every other dataset gets the first entry's.
DATASET_PROFILES: Mapping[str, str] = {dataset: entry.name for entry in REGISTRY for dataset in entry.datasets}
DEFAULT_PROFILE = REGISTRY[0].name


def training_defaults(name: str) -> dict[str, Any]:
    """The training defaults of a registered profile, as TrainConfig fields."""
    return asdict(ENTRIES[name].training)


def profile_of(recorded: Mapping[str, Any]) -> Profile:
    """The profile of a model's recorded preprocessing (ModelMetadata.preprocessing). A record from before profiles
    (no ``profile`` key) is ``digits``; an unknown name or another version raises ProfileError (one line)."""
    name = recorded.get("profile", "digits")
    if name not in PROFILES:
        raise ProfileError(f"artifacts were built with preprocessing profile {name!r}, this handler implements "
                           f"{', '.join(repr(p) for p in PROFILES)}")
    profile = SERVED.get((name, recorded.get("version")))
    if profile is None:
        versions = ", ".join(repr(v) for n, v in SERVED if n == name)
        raise ProfileError(f"artifacts were built with {name} preprocessing version {recorded.get('version')!r}, "
                           f"this handler implements {versions}")
    return profile
