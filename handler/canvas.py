"""A grayscale array -> the 28x28 canvas a model takes, as MNIST was made (digits) or whole (full-frame).

The digits canvas (:func:`clean_canvas`, version 1 of the digits profile, and every later version's canvas for a
clean picture): contrast stretched to 0..1 and turned to MNIST polarity (light strokes on black), cropped to the
content, fitted into a 20x20 box (aspect kept) and placed in a 28x28 canvas so that its centre of mass sits at the
centre. 8-bit images are handled as uint8 up to the crop (:func:`_canvas_from_uint8`, bit-identical to the float32
steps). The full-frame canvas (:func:`full_frame`) keeps the whole frame and only turns a light background dark.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

CANVAS = 28
BOX = 20
#: Pixels darker than this fraction of the stretched range count as background.
INK_THRESHOLD = 0.2

_LEVELS = np.arange(256, dtype=np.float32)


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
    return place(ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1])


def place(crop: np.ndarray) -> np.ndarray:
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


def clean_canvas(gray: np.ndarray) -> np.ndarray:
    """The digits canvas of a grayscale array cropped to its content (version 1): uint8 (28, 28)."""
    canvas = _canvas_from_uint8(gray) if gray.dtype == np.uint8 else _fit_and_centre(_to_mnist_polarity(gray))
    return np.round(canvas * 255.0).astype(np.uint8)


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
    return place(levels.take(band[rows[0] : rows[-1] + 1]))


def full_frame(gray: np.ndarray) -> np.ndarray:
    """A grayscale array -> uint8 (28, 28) with the whole frame kept: a light background (the border's median)
    inverted to dark, fitted into 28x28 with its aspect kept and padded with black. A 28x28 uint8 array on a dark
    background, such as a Fashion-MNIST image, comes back unchanged. Arrays with more than 8 bits per pixel are
    stretched to 0..255 first; 8-bit ones keep their levels, which garments need."""
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
