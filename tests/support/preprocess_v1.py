"""handler/preprocessing.py as it was before the speed-up (preprocessing version "1"), frozen.

The reference today's implementation is compared with, tensor for tensor (tests/unit/test_preprocessing.py).
Not used for serving or training.
"""

from __future__ import annotations

import io
from typing import Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

#: Bumped whenever the output of this module changes; stored in metadata.json and
#: checked by the handler, so a model is never served with another preprocessing.
PREPROCESSING_VERSION = "1"

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
        img.load()
    except Exception as exc:
        raise InvalidImageError(f"corrupt or truncated {img.format or 'image'} data: {exc}") from None
    try:
        return ImageOps.exif_transpose(img)  # phone photos store their rotation in EXIF
    except Exception:
        return img  # malformed EXIF: use the pixels as stored


def _grayscale(img: Image.Image) -> np.ndarray:
    """Grayscale float array of an image of any mode; alpha composited onto a contrasting colour."""
    if img.mode in ("I", "I;16", "I;16L", "I;16B", "I;16N", "F"):
        return np.asarray(img, dtype=np.float32)
    has_alpha = img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)
    if not has_alpha:
        return np.asarray(img.convert("L"), dtype=np.float32)
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
    crop = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    h, w = crop.shape
    scale = BOX / max(h, w)
    new_h, new_w = max(1, round(h * scale)), max(1, round(w * scale))
    if (new_h, new_w) != (h, w):
        resized = Image.fromarray(crop).resize((new_w, new_h), Image.Resampling.BOX if scale < 1 else Image.Resampling.BILINEAR)
        crop = np.clip(np.asarray(resized, dtype=np.float32), 0.0, 1.0)
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
    if isinstance(image, (bytes, bytearray, memoryview)):
        image = decode_image(bytes(image), max_pixels)
    if isinstance(image, Image.Image):
        try:
            gray = _grayscale(image)
        except (ValueError, OSError) as exc:  # modes Pillow cannot convert, e.g. LAB
            raise InvalidImageError(f"unsupported image mode {image.mode}: {exc}") from None
    else:
        gray = np.asarray(image, dtype=np.float32)
        if gray.ndim != 2 or gray.size == 0:
            raise InvalidImageError(f"expected a non-empty 2-D grayscale array, got shape {gray.shape}")
    if not np.isfinite(gray).all():
        raise InvalidImageError("image contains non-finite values")
    canvas = _fit_and_centre(_to_mnist_polarity(gray))
    return np.round(canvas * 255.0).astype(np.uint8)


def is_blank(tensor: np.ndarray) -> bool:
    """True for the model input of an image without any ink (uniform, or nothing above the threshold)."""
    return bool(np.ptp(tensor) == 0)  # every real stroke leaves some pixel above the background


def normalize(canvases: np.ndarray) -> np.ndarray:
    """uint8 canvases (N, 28, 28) -> float32 model input (N, 1, 28, 28)."""
    x = np.asarray(canvases, dtype=np.float32) / 255.0
    return ((x - MEAN) / STD)[:, None, :, :].astype(np.float32)


def preprocess(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """One image -> float32 (1, 28, 28): the exact tensor the model was trained on."""
    return normalize(to_canvas(image, max_pixels)[None])[0]


def canvases_from_arrays(images: np.ndarray) -> np.ndarray:
    """The training path: raw uint8 images (N, H, W) -> canonical uint8 canvases (N, 28, 28)."""
    return np.stack([to_canvas(img) for img in images]) if len(images) else np.zeros((0, CANVAS, CANVAS), np.uint8)
