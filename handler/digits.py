"""The digits profile's canvases, version by version (each version is frozen once a model records it).

- Version 1 (:func:`to_canvas`): the picture cropped to its content (handler/canvas.py), as MNIST was made.
- Version 2 (:func:`to_canvas_v2`): photos and scans, whose background is not one flat level, have their light
  divided out and their digit found among paper edges, shadows and table first (handler/photo.py, ``photo.V2``).
- Version 3 (:func:`to_canvas_v3`): the same, with the frame padded, sheet outlines dropped and MNIST's tone
  (``photo.V3``).
- Version 4 (:func:`to_canvas_v4`): the paper and the light on it found first (handler/paper.py), so that what lies
  beyond the sheet's edge and a shadow's boundary never reads as ink, then the digit as the ink on it (``photo.V4``).

A clean picture (MNIST, a drawing, a rendered digit) gets version 1's canvas in every version. Each version also
has a ``counted`` form: from one grayscale array, the canvas and whether several digits stand side by side.
"""

from __future__ import annotations

import numpy as np

from . import photo
from .canvas import CANVAS, clean_canvas, place
from .decoding import DEFAULT_MAX_PIXELS, ImageInput, gray_array


def photo_path(gray: np.ndarray, recipe: photo.Recipe, count: bool = False) -> tuple[np.ndarray, bool]:
    """Photos and scans (no flat background: noise, grain, lighting, shadow, table) have their light removed and
    their digit found first (handler/photo.py); clean pictures get version 1's canvas. With ``count`` also whether
    several digits stand side by side."""
    if photo.flat_background(gray):
        return clean_canvas(gray), count and photo.picture_several(gray)
    ink, several = photo.find_digit(gray, recipe, count)
    canvas = np.zeros((CANVAS, CANVAS), np.float32) if ink is None else place(ink)
    if ink is not None and recipe.mnist_tone:
        canvas = photo.mnist_tone(canvas)
    return np.round(canvas * 255.0).astype(np.uint8), several


def to_canvas(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Version 1: any image (bytes, PIL image or 2-D array) -> uint8 (28, 28), light digit on black, centred."""
    return clean_canvas(gray_array(image, max_pixels))


def counted_v1(gray: np.ndarray) -> tuple[np.ndarray, bool]:
    """Version 1's canvas, and whether several digits stand side by side (photos looked at as version 3 does)."""
    if photo.flat_background(gray):
        return clean_canvas(gray), photo.picture_several(gray)
    return clean_canvas(gray), photo.find_digit(gray, photo.V3, count=True)[1]


def to_canvas_v2(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Version 2 of the digits canvas: the first photo path (:data:`photo.V2`)."""
    return photo_path(gray_array(image, max_pixels), photo.V2)[0]


def counted_v2(gray: np.ndarray) -> tuple[np.ndarray, bool]:
    """Version 2's canvas and whether several digits stand side by side."""
    return photo_path(gray, photo.V2, count=True)


def to_canvas_v3(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Version 3 of the digits canvas: the photo path with the frame padded, sheet outlines dropped and MNIST's
    tone (:data:`photo.V3`); clean pictures still get version 1's canvas."""
    return photo_path(gray_array(image, max_pixels), photo.V3)[0]


def counted_v3(gray: np.ndarray) -> tuple[np.ndarray, bool]:
    """Version 3's canvas and whether several digits stand side by side."""
    return photo_path(gray, photo.V3, count=True)


def to_canvas_v4(image: ImageInput, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Version 4 of the digits canvas: version 3 with every pixel read against the light on its own surface
    (:data:`photo.V4`); clean pictures still get version 1's canvas."""
    return photo_path(gray_array(image, max_pixels), photo.V4)[0]


def counted_v4(gray: np.ndarray) -> tuple[np.ndarray, bool]:
    """Version 4's canvas and whether several digits stand side by side."""
    return photo_path(gray, photo.V4, count=True)
