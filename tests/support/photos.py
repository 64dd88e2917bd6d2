"""JPEG "photos" of digits and the scale request PNGs are drawn at, for the preprocessing parity tests."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageFilter

#: Request images are drawn like serving/samples.py: dark strokes on white, enlarged 4x.
REQUEST_SCALE = 4

#: A phone picture of a digit written on paper, scaled down for upload.
PHOTO_SIZE = (640, 480)
PHOTO_QUALITY = 85


def photo_jpeg(image: np.ndarray, rng: np.random.Generator, size: tuple[int, int] = PHOTO_SIZE,
               quality: int = PHOTO_QUALITY) -> bytes:
    """A 28x28 light-on-black digit as a photographed note: bluish ink, blurred, drawn at 45-75% of the height
    somewhere on off-white paper with a lighting gradient, sensor noise and a colour cast; RGB JPEG."""
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    paper = 236 + 10 * (np.cos(angle) * (xx / width - 0.5) + np.sin(angle) * (yy / height - 0.5))
    paper = paper + rng.normal(0, 3, (height, width)).astype(np.float32)
    side = int(rng.uniform(0.45, 0.75) * height)
    digit = Image.fromarray(np.asarray(image, dtype=np.uint8)).resize((side, side), Image.Resampling.BICUBIC)
    ink = np.asarray(digit.filter(ImageFilter.GaussianBlur(side / 120)), dtype=np.float32)[..., None] / 255.0
    cast = np.array([rng.uniform(0.97, 1.0), 1.0, rng.uniform(0.97, 1.03)], np.float32)
    rgb = paper[..., None] * cast
    x0, y0 = int(rng.uniform(0, width - side)), int(rng.uniform(0, height - side))
    patch = rgb[y0:y0 + side, x0:x0 + side]
    rgb[y0:y0 + side, x0:x0 + side] = patch * (1 - ink) + np.array([30, 35, 70], np.float32) * ink
    buf = io.BytesIO()
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
