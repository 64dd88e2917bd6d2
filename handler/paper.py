"""The light on the paper, and on whatever else is in the frame, that follows the sheet's edge and a shadow's boundary.

Version 3's paper estimate is a morphological closing: it removes anything darker than its surroundings and
narrower than the window (the strokes), and keeps a straight edge. But it also fills every part of a darker region
that is narrower than the window: the corner of a desk where a turned sheet's corner cuts the frame, a bent shadow's
boundary, the sliver between two sheets. There the estimate is the lit paper's brightness over a darker surface,
the surface reads as ink, and where the digit is near, the digit joins it or is cut to fit beside it.

:func:`surface_light` instead takes the closing *by reconstruction* (Vincent 1993): a darker region that is wider
than the window somewhere is kept whole, however narrow its other parts, and only regions that the window removes
entirely, the strokes, are filled with the light around them. Each pixel then reads against the light on its own
surface: on the paper, the paper in shadow or not; beyond the sheet's edge, the desk or the other sheet. It is
computed on a reduced copy (the light varies slowly, except across the boundaries the reconstruction keeps), by
eroding the dilated copy step by step, never below the copy itself, until it settles.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

#: The reconstruction runs on a copy of at most this many pixels on its longer side...
LIGHT_SIDE = 128
#: Strokes up to about this many reduced pixels wide are filled before the reconstruction.
STROKE_WINDOW = 5
#: Geodesic erosions between two checks whether the reconstruction has settled.
STEPS = 8


def _reduced(image: np.ndarray, factor: int) -> np.ndarray:
    """Mean of factor x factor blocks (edge blocks repeated to a whole block)."""
    h, w = image.shape
    padded = np.pad(image, ((0, -h % factor), (0, -w % factor)), mode="edge")
    return padded.reshape(padded.shape[0] // factor, factor, padded.shape[1] // factor, factor).mean(axis=(1, 3))


def _eroded(image: np.ndarray) -> np.ndarray:
    """3x3 grey erosion (the frame's edge repeated), by slicing: the reconstruction's inner step."""
    rows = image.copy()
    np.minimum(rows[1:], image[:-1], out=rows[1:])
    np.minimum(rows[:-1], image[1:], out=rows[:-1])
    out = rows.copy()
    np.minimum(out[:, 1:], rows[:, :-1], out=out[:, 1:])
    np.minimum(out[:, :-1], rows[:, 1:], out=out[:, :-1])
    return out


def reconstructed(low: np.ndarray, window: int) -> np.ndarray:
    """Closing by reconstruction of a light-background image: every dark region the window removes entirely is
    filled to the level at which it joins a region the window keeps; the others are kept as they are. The marker
    (the dilation) is eroded step by step, never below the image, until nothing changes."""
    light = ndimage.grey_dilation(low, size=window)
    for _ in range(low.size):
        settled = light
        for _ in range(STEPS):
            light = np.maximum(_eroded(light), low)
        if np.array_equal(light, settled):
            break
    return light


def paper_is_light(work: np.ndarray, window: int) -> bool:
    """Whether the paper is lighter than the strokes, read where something stands out: near ink (and near an edge or
    a shadow's boundary) most pixels are paper, and paper is near the lightest level around it when it is light,
    near the darkest when it is a dark board. Unlike the frame's brightness this holds when a shadow or a desk
    covers the frame's centre."""
    factor = max(1, int(np.ceil(max(work.shape) / LIGHT_SIDE)))
    low = _reduced(work, factor)
    size = max(3, (window // factor) | 1)
    top, bottom = ndimage.grey_dilation(low, size=size), ndimage.grey_erosion(low, size=size)
    spread = top - bottom
    busy = spread > max(0.1 * float(spread.max()), 1e-6)
    if not busy.any():
        return True
    return float(np.median((low[busy] - bottom[busy]) / spread[busy])) > 0.5


def surface_light(smooth: np.ndarray, window: int, light: bool = True) -> np.ndarray:
    """The light on the surface under each pixel of a smoothed work image (dark strokes on light paper, or with
    ``light`` False light strokes on a dark board), neither the paper's light over the desk or the shadow beside it
    nor the shadow's over the paper. The reduced copy's light is brought back to full size between the darkest and
    the lightest of its neighbours, where a small closing of the full image puts it: a boundary stays sharp."""
    h, w = smooth.shape
    factor = max(1, int(np.ceil(max(h, w) / LIGHT_SIDE)))
    image = smooth if light else -smooth
    # Strokes narrower than a few reduced pixels are filled with the light around them first: reconstructed, a
    # stroke that crosses into a darker shadow would keep its lit part as a peninsula of that shadow.
    low = ndimage.grey_closing(_reduced(image, factor), size=STROKE_WINDOW)
    rebuilt = reconstructed(low, max(3, (window // factor) | 1))

    def full_size(reduced: np.ndarray) -> np.ndarray:
        return np.repeat(np.repeat(reduced, factor, axis=0), factor, axis=1)[:h, :w]

    darkest = full_size(ndimage.grey_erosion(rebuilt, size=3))
    lightest = full_size(ndimage.grey_dilation(rebuilt, size=3))
    near = ndimage.grey_closing(image, size=2 * factor + 1)
    full = np.clip(near, darkest, lightest)
    return (full if light else -full).astype(np.float32)
