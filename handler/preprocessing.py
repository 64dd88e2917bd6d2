"""The one image -> model-input contract, shared by training and serving.

Every image, whether a user's photo posted to TorchServe or a 28x28 MNIST array read
during training, goes through :func:`to_canvas`, so train and serve cannot drift:

1. grayscale (alpha composited onto the colour that contrasts with the strokes),
2. contrast stretched to 0..255 and turned to MNIST polarity (light strokes on black),
3. cropped to the content, fitted into a 20x20 box (aspect kept) and placed in a
   28x28 canvas so that its centre of mass sits at the centre, as MNIST was made,

then :func:`normalize` scales it with the MNIST statistics into the float tensor the
model takes. That is the ``digits`` profile. Its version 2 (:func:`to_canvas_v2`) first sends photos and scans,
whose background is not one flat level, through handler/photo.py: the light is divided out, the digit is found
among paper edges, shadows and table, and only its ink reaches steps 2-3; a clean picture (MNIST, a drawing, a
rendered digit) gets version 1's canvas bit for bit. Version 3 (:func:`to_canvas_v3`, the current one) keeps a
strip of table at the frame's edge from reading as ink, never takes a sheet's outline for the digit, and gives the
photo's canvas MNIST's saturated stroke core; clean pictures are unchanged. The ``full-frame`` profile (:func:`to_full_frame`) is
for centred 28x28 pictures such as Fashion-MNIST, whose outline and size carry the class: it keeps
the whole frame (fitted into 28x28, aspect kept) and only turns a light background dark. A
model's metadata.json records its profile and version (:data:`PROFILES`); the handler applies the
one recorded and refuses one it does not know.

This module imports only numpy, Pillow and (through handler/photo.py) scipy, so that it can be packed into the model
archive and imported by the handler without the training code. Speed without a second code path: 8-bit images are
handled as uint8 up to the crop (:func:`_canvas_from_uint8`, bit-identical to the float32 steps above), and only
rotated images are copied by the EXIF step.

JPEG luma: colour (YCbCr) JPEGs are decoded straight to grayscale (``draft("L")``: libjpeg returns its Y channel
without chroma IDCT, upsampling or colour conversion, about 40% less time than decoding to RGB and converting, on
640x480 photos). Y is the ITU-R 601 luma ``convert("L")`` computes up to the RGB's rounding, so a pixel moves by at
most one level (more where RGB clips), and the crop only where a pixel at the ink threshold moves
(tests/unit/test_preprocessing_fast.py pins this down; bench.preprocess measures held-out accuracy both ways).

:meth:`Profile.read` also tells whether a digits image holds several digits side by side (:func:`photo.several`),
from the same decoding and ink map; the canvas is the same with or without that look.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from . import photo

#: Bumped whenever the output of the digits profile changes; stored in metadata.json and checked by the handler,
#: so a model is never served with another preprocessing. Version 2 added the photo path (:func:`to_canvas_v2`);
#: version 3 finds the digit better on a photo and gives it MNIST's tone (:func:`to_canvas_v3`). Models built with
#: an older version keep being served with it (:data:`DIGITS_V1`, :data:`DIGITS_V2`).
PREPROCESSING_VERSION = "3"

CANVAS = 28
BOX = 20
#: Mean and std of MNIST training pixels scaled to 0..1 (the customary figures).
MEAN = 0.1307
STD = 0.3081
#: Images with more pixels than this are refused before their pixels are decoded.
DEFAULT_MAX_PIXELS = 16_000_000
#: Pixels darker than this fraction of the stretched range count as background.
INK_THRESHOLD = 0.2
#: The only decoders that ever see request bytes (phone JPEGs with several pictures open as JPEG too).
FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF")

ImageInput = Union[bytes, bytearray, memoryview, Image.Image, np.ndarray]

EXIF_ORIENTATION = 0x0112
_ROTATED = frozenset(range(2, 9))  # orientations exif_transpose turns
_WIDE_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
_LEVELS = np.arange(256, dtype=np.float32)


class InvalidImageError(ValueError):
    """The input cannot be turned into a model input; the message says why."""

    status = 400


class ImageTooLargeError(InvalidImageError):
    """More pixels than the configured limit (refused before the pixels are decoded)."""

    status = 413


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode image bytes with Pillow, refusing oversized images before decoding pixels."""
    if not data:
        raise InvalidImageError("empty image: the request carried no bytes")
    try:
        img = Image.open(io.BytesIO(bytes(data)), formats=FORMATS)
    except UnidentifiedImageError:
        raise InvalidImageError("not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, TIFF)") from None
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"image too large: {exc}") from None
    except Exception as exc:  # Pillow raises assorted errors on malformed headers
        raise InvalidImageError(f"unreadable image header: {exc}") from None
    width, height = img.size
    if width < 1 or height < 1:
        raise InvalidImageError(f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"image too large: {width}x{height} = {width * height} pixels exceeds the limit of {max_pixels}"
        )
    try:
        img.seek(0)  # first frame of animations
        if img.format == "JPEG" and img.mode == "RGB":
            img.draft("L", None)  # luma straight from the decoder: see "JPEG luma" in the module docstring
        img.load()
    except Exception as exc:
        raise InvalidImageError(f"corrupt or truncated {img.format or 'image'} data: {exc}") from None
    try:
        # Phone photos store their rotation in EXIF. Only a rotated image is copied (exif_transpose copies
        # every image): the pixels are those exif_transpose gives in every case.
        if img.getexif().get(EXIF_ORIENTATION, 1) in _ROTATED:
            return ImageOps.exif_transpose(img)
    except Exception:
        pass  # malformed EXIF: use the pixels as stored
    return img


def _grayscale(img: Image.Image) -> np.ndarray:
    """Grayscale array of an image of any mode: uint8 for 8-bit images without alpha, else float32 with
    alpha composited onto a contrasting colour."""
    if img.mode in _WIDE_MODES:
        return np.asarray(img, dtype=np.float32)
    has_alpha = img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)
    if not has_alpha:
        gray = img if img.mode == "L" else img.convert("L")
        return np.frombuffer(gray.tobytes(), dtype=np.uint8).reshape(gray.height, gray.width)
    rgba = img.convert("RGBA")
    gray = np.asarray(rgba.convert("L"), dtype=np.float32)
    alpha = np.asarray(rgba.getchannel("A"), dtype=np.float32) / 255.0
    opaque = alpha > 0.5
    # Strokes drawn dark on a transparent sheet go onto white, light strokes onto black.
    stroke_mean = float(gray[opaque].mean()) if opaque.any() else 0.0
    backdrop = 255.0 if stroke_mean < 128.0 else 0.0
    return gray * alpha + backdrop * (1.0 - alpha)


def _to_mnist_polarity(gray: np.ndarray) -> np.ndarray:
    """Stretch to 0..1 and invert when the background (the border) is light."""
    lo, hi = float(gray.min()), float(gray.max())
    if hi - lo < 1e-6:
        return np.zeros(gray.shape, dtype=np.float32)
    stretched = (gray - lo) / (hi - lo)
    border = np.concatenate([stretched[0], stretched[-1], stretched[:, 0], stretched[:, -1]])
    if float(np.median(border)) > 0.5:
        stretched = 1.0 - stretched
    return stretched.astype(np.float32)


def _fit_and_centre(ink: np.ndarray) -> np.ndarray:
    """Crop to the content, fit into BOX x BOX, centre by mass in a CANVAS x CANVAS canvas."""
    canvas = np.zeros((CANVAS, CANVAS), dtype=np.float32)
    rows = np.flatnonzero((ink > INK_THRESHOLD).any(axis=1))
    cols = np.flatnonzero((ink > INK_THRESHOLD).any(axis=0))
    if rows.size == 0:
        return canvas
    return _place(ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1])


def _place(crop: np.ndarray) -> np.ndarray:
    """A float crop of the content fitted into BOX x BOX and centred by mass in a CANVAS x CANVAS canvas."""
    canvas = np.zeros((CANVAS, CANVAS), dtype=np.float32)
    h, w = crop.shape
    scale = BOX / max(h, w)
    new_h, new_w = max(1, round(h * scale)), max(1, round(w * scale))
    if (new_h, new_w) != (h, w):
        picture = Image.frombuffer("F", (w, h), np.ascontiguousarray(crop, dtype=np.float32), "raw", "F", 0, 1)
        resized = picture.resize((new_w, new_h), Image.Resampling.BOX if scale < 1 else Image.Resampling.BILINEAR)
        crop = np.frombuffer(resized.tobytes(), dtype=np.float32).reshape(new_h, new_w).clip(0.0, 1.0)
    mass = crop.sum()
    cy = float((crop.sum(axis=1) * np.arange(new_h)).sum() / mass)
    cx = float((crop.sum(axis=0) * np.arange(new_w)).sum() / mass)
    top = int(round((CANVAS - 1) / 2 - cy))
    left = int(round((CANVAS - 1) / 2 - cx))
    top = min(max(top, 0), CANVAS - new_h)
    left = min(max(left, 0), CANVAS - new_w)
    canvas[top : top + new_h, left : left + new_w] = crop
    return canvas


def to_canvas(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Any image (bytes, PIL image or 2-D array) -> uint8 (28, 28), light digit on black, centred."""
    return _version_1_canvas(_gray_array(image, max_pixels))


def _version_1_canvas(gray: np.ndarray) -> np.ndarray:
    """Steps 2-3 of the digits canvas on a grayscale array: uint8 (28, 28)."""
    canvas = _canvas_from_uint8(gray) if gray.dtype == np.uint8 else _fit_and_centre(_to_mnist_polarity(gray))
    return np.round(canvas * 255.0).astype(np.uint8)


def _gray_array(image: ImageInput, max_pixels: int) -> np.ndarray:
    """Bytes, PIL image or 2-D array -> a 2-D grayscale array: uint8 for 8-bit input, else finite float32."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        image = decode_image(bytes(image), max_pixels)
    if isinstance(image, Image.Image):
        try:
            gray = _grayscale(image)
        except (ValueError, OSError) as exc:  # modes Pillow cannot convert, e.g. LAB
            raise InvalidImageError(f"unsupported image mode {image.mode}: {exc}") from None
    else:
        gray = np.asarray(image)
        if gray.dtype != np.uint8:
            gray = np.asarray(gray, dtype=np.float32)
        if gray.ndim != 2 or gray.size == 0:
            raise InvalidImageError(f"expected a non-empty 2-D grayscale array, got shape {gray.shape}")
    if gray.dtype != np.uint8 and not np.isfinite(gray).all():
        raise InvalidImageError("image contains non-finite values")
    return gray


def _canvas_from_uint8(gray: np.ndarray) -> np.ndarray:
    """``_fit_and_centre(_to_mnist_polarity(gray))`` for 8-bit images, equal to the float32 result bit for bit
    but without float work on the whole image.

    A uint8 image has at most 256 levels, so the stretched (and inverted) value of each level is computed once,
    with the same float32 operations, into a table. The table is monotonic, so "ink above the threshold" is one
    integer comparison with a level, the border's median is the table's value at the border's middle level(s),
    and only the cropped content is turned into floats.
    """
    lo, hi = int(gray.min()), int(gray.max())
    if hi == lo:
        return np.zeros((CANVAS, CANVAS), dtype=np.float32)
    levels = (_LEVELS - float(lo)) / float(hi - lo)
    border = np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    n = border.size
    if n % 2:
        median = levels[np.partition(border, n // 2)[n // 2]]
    else:  # np.median: the float32 mean of the two middle values
        middle = np.partition(border, (n // 2 - 1, n // 2))
        median = (levels[middle[n // 2 - 1]] + levels[middle[n // 2]]) / np.float32(2)
    inverted = float(median) > 0.5
    if inverted:
        levels = 1.0 - levels
    on = np.flatnonzero(levels[lo : hi + 1] > INK_THRESHOLD) + lo  # the ink levels present in the image
    if on.size == 0:
        return np.zeros((CANVAS, CANVAS), dtype=np.float32)
    first, last = int(on[0]), int(on[-1])
    # Columns first (a reduction down the rows is the cheap one), then rows within the columns holding ink.
    if inverted and first == lo and last - lo + 1 == on.size:  # ink = the darkest levels
        cols = np.flatnonzero(gray.min(axis=0) <= last)
        band = gray[:, cols[0] : cols[-1] + 1]
        rows = np.flatnonzero(band.min(axis=1) <= last)
    elif not inverted and last == hi and hi - first + 1 == on.size:  # ink = the lightest levels
        cols = np.flatnonzero(gray.max(axis=0) >= first)
        band = gray[:, cols[0] : cols[-1] + 1]
        rows = np.flatnonzero(band.max(axis=1) >= first)
    else:  # a level table that is not monotonic (never seen): look every pixel up
        ink = (levels > INK_THRESHOLD)[gray]
        rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
        if rows.size == 0:
            return np.zeros((CANVAS, CANVAS), dtype=np.float32)
        band = gray[:, cols[0] : cols[-1] + 1]
    return _place(levels.take(band[rows[0] : rows[-1] + 1]))


def _photo_path(gray: np.ndarray, recipe: photo.Recipe, count: bool = False) -> tuple[np.ndarray, bool]:
    """Photos and scans (no flat background: noise, grain, lighting, shadow, table) have their light removed and
    their digit found first (handler/photo.py); clean pictures get version 1's canvas. With ``count`` also whether
    several digits stand side by side."""
    if photo.flat_background(gray):
        return _version_1_canvas(gray), count and photo.picture_several(gray)
    ink, several = photo.find_digit(gray, recipe, count)
    canvas = np.zeros((CANVAS, CANVAS), np.float32) if ink is None else _place(ink)
    if ink is not None and recipe.mnist_tone:
        canvas = photo.mnist_tone(canvas)
    return np.round(canvas * 255.0).astype(np.uint8), several


def _counted_v1(gray: np.ndarray) -> tuple[np.ndarray, bool]:
    """Version 1's canvas, and whether several digits stand side by side (photos looked at as version 3 does)."""
    several = photo.picture_several(gray) if photo.flat_background(gray) else photo.find_digit(gray, count=True)[1]
    return _version_1_canvas(gray), several


def to_canvas_v2(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Version 2 of the digits canvas: the first photo path (:data:`photo.V2`)."""
    return _photo_path(_gray_array(image, max_pixels), photo.V2)[0]


def to_canvas_v3(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Version 3 of the digits canvas: the photo path with the frame padded, sheet outlines dropped and MNIST's
    tone (:data:`photo.V3`); clean pictures still get version 1's canvas."""
    return _photo_path(_gray_array(image, max_pixels), photo.V3)[0]


def is_blank(tensor: np.ndarray) -> bool:
    """True for the model input of an image without any ink (uniform, or nothing above the threshold)."""
    return bool(np.ptp(tensor) == 0)  # every real stroke leaves some pixel above the background


def normalize(canvases: np.ndarray) -> np.ndarray:
    """uint8 canvases (N, 28, 28) -> float32 model input (N, 1, 28, 28), digits profile."""
    return DIGITS.normalize(canvases)


def preprocess(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """One image -> float32 (1, 28, 28): the exact tensor a digits model was trained on."""
    return DIGITS.preprocess(image, max_pixels)


def canvases_from_arrays(images: np.ndarray) -> np.ndarray:
    """The training path: raw uint8 images (N, H, W) -> canonical uint8 canvases (N, 28, 28)."""
    return DIGITS.canvases_from_arrays(images)


def to_full_frame(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Any image -> uint8 (28, 28) with the whole frame kept: grayscale, a light background (the border's
    median) inverted to dark, fitted into 28x28 with its aspect kept and padded with black. A 28x28 uint8
    array on a dark background, such as a Fashion-MNIST image, comes back unchanged. Images with more than
    8 bits per pixel are stretched to 0..255 first; 8-bit ones keep their levels, which garments need."""
    gray = _gray_array(image, max_pixels)
    if gray.dtype != np.uint8:
        lo, hi = float(gray.min()), float(gray.max())
        stretched = (gray - lo) * (255.0 / (hi - lo)) if hi - lo > 1e-6 else np.zeros(gray.shape, np.float32)
        gray = np.round(stretched).astype(np.uint8)
    border = np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    if float(np.median(border)) > 127.5:
        gray = 255 - gray
    h, w = gray.shape
    if (h, w) == (CANVAS, CANVAS):
        return np.ascontiguousarray(gray)
    scale = CANVAS / max(h, w)
    new_h, new_w = max(1, round(h * scale)), max(1, round(w * scale))
    picture = Image.fromarray(np.ascontiguousarray(gray), "L")
    resized = picture.resize((new_w, new_h), Image.Resampling.BOX if scale < 1 else Image.Resampling.BILINEAR)
    canvas = np.zeros((CANVAS, CANVAS), np.uint8)
    top, left = (CANVAS - new_h) // 2, (CANVAS - new_w) // 2
    canvas[top : top + new_h, left : left + new_w] = np.asarray(resized)
    return canvas


@dataclass(frozen=True)
class Profile:
    """A named preprocessing: image -> uint8 canvas, and the statistics that scale canvases into model input.

    ``version`` is bumped whenever the profile's output changes; metadata.json records name and version.
    """

    name: str
    version: str
    canvas: Callable[[ImageInput, int], np.ndarray]
    mean: float
    std: float
    #: The box the content is fitted into, for profiles that crop to it.
    box: int | None = None
    #: Digits profiles: a grayscale array -> (the canvas, whether several digits stand side by side in it).
    counted: Callable[[np.ndarray], tuple[np.ndarray, bool]] | None = None

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
        gray = _gray_array(image, max_pixels)
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


#: Digits as MNIST was made (crop to content, 20x20 box, centre of mass); MNIST statistics. Photos and scans have
#: their light removed and their digit found first (handler/photo.py).
DIGITS = Profile("digits", PREPROCESSING_VERSION, to_canvas_v3, MEAN, STD, BOX,
                 lambda gray: _photo_path(gray, photo.V3, count=True))
#: The digits profile before the photo path, for models built with it.
DIGITS_V1 = Profile("digits", "1", to_canvas, MEAN, STD, BOX, _counted_v1)
#: The first photo path, for models built with it.
DIGITS_V2 = Profile("digits", "2", to_canvas_v2, MEAN, STD, BOX, lambda gray: _photo_path(gray, photo.V2, count=True))
#: Whole frame kept; the customary Fashion-MNIST training-set statistics.
FULL_FRAME = Profile("full-frame", "1", to_full_frame, 0.2860, 0.3530)
#: The profile new models are built with, by name.
PROFILES = {profile.name: profile for profile in (DIGITS, FULL_FRAME)}
#: Every profile the handler serves, by (name, version).
SERVED = {(profile.name, profile.version): profile for profile in (DIGITS, DIGITS_V2, DIGITS_V1, FULL_FRAME)}


class ProfileError(ValueError):
    """metadata.json names a preprocessing this code does not implement."""


def profile_of(metadata: Mapping[str, Any]) -> Profile:
    """The profile a model's metadata.json records. Metadata from before profiles (no ``profile`` key) is
    ``digits``; an unknown name or another version raises ProfileError (one line)."""
    recorded = metadata.get("preprocessing") or {}
    name = recorded.get("profile", DIGITS.name)
    if name not in PROFILES:
        raise ProfileError(f"artifacts were built with preprocessing profile {name!r}, this handler implements "
                           f"{', '.join(repr(p) for p in PROFILES)}")
    profile = SERVED.get((name, recorded.get("version")))
    if profile is None:
        versions = ", ".join(repr(v) for n, v in SERVED if n == name)
        raise ProfileError(f"artifacts were built with {name} preprocessing version {recorded.get('version')!r}, "
                           f"this handler implements {versions}")
    return profile
