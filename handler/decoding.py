"""Request bytes -> a grayscale array: the decoding every preprocessing profile starts from.

Only Pillow's decoders for :data:`FORMATS` ever see request bytes; an image with more pixels than the limit is
refused before its pixels are decoded.

JPEG luma: colour (YCbCr) JPEGs are decoded straight to grayscale (``draft("L")``: libjpeg returns its Y channel
without chroma IDCT, upsampling or colour conversion, about 40% less time than decoding to RGB and converting, on
640x480 photos). Y is the ITU-R 601 luma ``convert("L")`` computes up to the RGB's rounding, so a pixel moves by at
most one level (more where RGB clips), and the crop only where a pixel at the ink threshold moves
(tests/unit/test_preprocessing.py pins this down; bench.preprocess measures held-out accuracy both ways).
Only rotated images are copied by the EXIF step.
"""

from __future__ import annotations

import io
from typing import Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

#: Images with more pixels than this are refused before their pixels are decoded.
DEFAULT_MAX_PIXELS = 16_000_000
#: The only decoders that ever see request bytes (phone JPEGs with several pictures open as JPEG too).
FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF")

ImageInput = Union[bytes, bytearray, memoryview, Image.Image, np.ndarray]

EXIF_ORIENTATION = 0x0112
_ROTATED = frozenset(range(2, 9))  # orientations exif_transpose turns
_WIDE_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")


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


def gray_array(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
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
