"""Photos and scans of digits on paper: remove the light, find the digit, hand its ink to the digits canvas.

A photo of a digit on paper is not a clean picture: the light falls off across the sheet, corners darken, a hand
or a phone casts a shadow, the table shows at the edges, and the camera adds noise, blur and JPEG blocks. Cropping
"to the content" (digits preprocessing version 1) then crops to the lighting. This module, used by versions 2 and 3
(:class:`Recipe`: version 3 also pads the frame, drops a sheet's outline and gives the canvas MNIST's tone):

1. estimates the paper's brightness at every pixel with a morphological closing (a window wider than any pen
   stroke keeps the paper and removes the ink; unlike a blur it keeps the sharp edge of a shadow or of the sheet)
   and divides it out, so every pixel becomes "how much darker than its own paper" (0 on paper and on the table,
   whatever the light);
2. thresholds that ink map above the camera's noise, labels its connected components (scipy.ndimage) and keeps the
   digit: the heaviest component that does not touch the frame (paper edges, table, shadows do), with the
   fragments close to it (a 5's bar, a broken pencil line);
3. returns the ink of that box only, scaled 0..1 and zero elsewhere, which the digits profile then fits and centres
   exactly as it does for MNIST.

:func:`flat_background` decides whether an image needs this: a clean picture (one background level, as MNIST, a
drawing or a rendered digit) keeps the version 1 path bit for bit, so models see the same canvases for clean inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image
from scipy import ndimage

from .paper import paper_is_light, surface_light

#: Images are analysed at most this many pixels on their longer side (the digit ends up 20 pixels high).
WORK_SIDE = 512
#: The paper estimate's window, as a share of the longer side: wider than the strokes of a digit as large as 60% of
#: the frame. A wider window keeps bolder strokes but fills more of a table's edge and a shadow's corner with "ink";
#: redoing the estimate with a window three times wider for bold digits lost more than it won (docs/photos.md).
WINDOW_SHARE = 0.1
#: Version 4's surface light (handler/paper.py) removes strokes narrower than this share of the longer side: it keeps
#: a desk's corner and a shadow whole, so it can be wider than WINDOW_SHARE and keep bold strokes too.
SURFACE_SHARE = 0.2
#: Version 4: a surface whose light is under this share of the lit paper's is not paper (a desk beyond the sheet);
#: paper in the deepest shadow keeps about half its light.
PAPER_LIGHT = 0.4
#: Version 4: a digit is ink standing alone on its paper; other ink within a digit's size around it weighing more
#: than this share of the digit's makes the canvas blank (a scene or a texture, not a digit on paper).
CLUTTER = 1.0
#: A picture whose most common level covers this share of its pixels has a flat background (version 1's path).
FLAT_SHARE = 0.5
#: Frames no larger than this on both sides keep version 1's path whatever their background: no phone or scanner
#: makes them, and a garment filling a 28x28 Fashion-MNIST frame must stay whole (the open-set exam).
SMALL_FRAME = 64
#: Ink is what is darker than its paper by more than this share of the darkest stroke...
INK_SHARE = 0.3
#: ...and by more than this many noise deviations (the noise estimated from the ink map's median absolute deviation).
NOISE_SIGMAS = 6.0
#: Nothing is a digit unless its darkest stroke is this much darker than its paper (the faintest pencil is about 0.3).
MIN_CONTRAST = 0.15
#: Fragments kept beside the digit: within this share of the digit's box size, at least this share of its mass.
NEAR_SHARE = 0.35
MIN_FRAGMENT = 0.03
#: A component whose pixels fill less than this share of its box, around another one, is an outline (a sheet's
#: edge), not a digit: a digit's strokes fill 10-50% of its box.
OUTLINE_FILL = 0.06
#: The digit's box holds the ink above this share of its strongest stroke (preprocessing.INK_THRESHOLD's value).
BOX_INK = 0.2
#: Share of a canvas's ink pixels that :func:`mnist_tone` saturates: about 42% of the ink pixels of an MNIST canvas
#: are at full strength (>= 0.95; the bundled sample's held-out split), against 7% of a photo's canvas before it.
SATURATED_SHARE = 0.4
#: Canvas pixels above this count as ink for that share (the anti-aliased fringe is lower).
TONE_INK = 0.05
#: :func:`several`: a mark is an ink component holding at least this share of the ink's mass; marks closer than
#: this share of the tallest mark's height in columns belong to one digit; a digit is digit-sized at this share of
#: the tallest one's height or more, and two stand on one line when their rows overlap by this share of the shorter.
MARK_SHARE = 0.1
DIGIT_GAP = 0.1
DIGIT_HEIGHT = 0.5
SAME_LINE = 0.5


@dataclass(frozen=True)
class Recipe:
    """What the photo path does beyond version 2 of the preprocessing. Version 2 (every step off) stays as it was for
    the models built with it; version 3 takes all three."""

    #: Repeat the frame's edge outward by a window before the paper estimate (a narrow strip of table stays table).
    pad_frame: bool
    #: A sheet's outline is neither the digit nor one of its fragments.
    drop_outlines: bool
    #: Give the canvas MNIST's saturated stroke core (:func:`mnist_tone`).
    mnist_tone: bool
    #: Read each pixel against the light on its own surface (handler/paper.py): a sheet's edge or a shadow's
    #: boundary never reads as ink.
    surfaces: bool = False


V2 = Recipe(pad_frame=False, drop_outlines=False, mnist_tone=False)
V3 = Recipe(pad_frame=True, drop_outlines=True, mnist_tone=True)
V4 = Recipe(pad_frame=True, drop_outlines=True, mnist_tone=True, surfaces=True)


def _work_image(gray: np.ndarray) -> np.ndarray:
    """float32 copy of a 2-D grayscale image, shrunk (box filter) to at most WORK_SIDE on its longer side."""
    h, w = gray.shape
    picture = Image.fromarray(np.ascontiguousarray(gray, dtype=np.float32), "F")
    scale = WORK_SIDE / max(h, w)
    if scale < 1:
        picture = picture.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BOX)
    return np.asarray(picture, dtype=np.float32)


def _light_background(gray: np.ndarray) -> bool:
    """Whether the sheet is lighter than the strokes: the median of the frame's central quarter (where the sheet is,
    whatever the table around it) lies in the upper half of the image's range."""
    h, w = gray.shape
    centre = gray[h // 4 : h - h // 4 or h, w // 4 : w - w // 4 or w]
    lo, hi = np.percentile(gray[::2, ::2], (0.5, 99.5))
    return float(np.median(centre[::2, ::2])) > (lo + hi) / 2


def several(boxes: list[tuple[slice, slice]], mass: np.ndarray) -> bool:
    """Whether ink components (their boxes and masses) hold several digits side by side: marks grouped by the
    columns they span (a gap narrower than DIGIT_GAP joins them), two digit-sized groups on one line ("42" written
    with a gap). A single digit broken into parts is one group: its parts share columns or nearly touch."""
    total = float(np.sum(mass))
    marks = sorted((box for box, m in zip(boxes, mass) if total > 0 and m >= MARK_SHARE * total),
                   key=lambda box: box[1].start)
    if len(marks) < 2:
        return False
    gap = DIGIT_GAP * max(rows.stop - rows.start for rows, _ in marks)
    groups: list[list[int]] = []  # [top, bottom, left, right] of each column group, left to right
    for rows, cols in marks:
        if groups and cols.start < groups[-1][3] + gap:
            group = groups[-1]
            group[:] = [min(group[0], rows.start), max(group[1], rows.stop), group[2], max(group[3], cols.stop)]
        else:
            groups.append([rows.start, rows.stop, cols.start, cols.stop])
    tallest = max(bottom - top for top, bottom, _, _ in groups)
    digits = [(top, bottom) for top, bottom, _, _ in groups if bottom - top >= DIGIT_HEIGHT * tallest]
    return any(min(b1, b2) - max(t1, t2) >= SAME_LINE * min(b1 - t1, b2 - t2)
               for i, (t1, b1) in enumerate(digits) for t2, b2 in digits[i + 1:])


def picture_several(gray: np.ndarray) -> bool:
    """:func:`several` for a clean picture (the version 1 path), whose ink is what that path crops to (beyond a
    fifth of the range from the background's level); its marks are the runs of columns holding ink. Most pictures
    hold one run and cost two reductions over the image."""
    lo, hi = gray.min(), gray.max()
    if float(hi) - float(lo) < 1e-6:
        return False
    border = np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    light = float(np.partition(border, border.size // 2)[border.size // 2]) > (float(lo) + float(hi)) / 2
    level = float(lo) + ((1 - BOX_INK) if light else BOX_INK) * (float(hi) - float(lo))
    if gray.dtype == np.uint8:  # the same test in integers: g < x is g < ceil(x), g > x is g > floor(x)
        level = int(np.ceil(level)) if light else int(np.floor(level))
    cols = np.flatnonzero(gray.min(axis=0) < level if light else gray.max(axis=0) > level)
    breaks = np.flatnonzero(np.diff(cols) > 1)
    if breaks.size == 0:  # one run of columns: one mark
        return False
    boxes, mass = [], []
    for start, stop in zip(cols[np.r_[0, breaks + 1]], cols[np.r_[breaks, cols.size - 1]] + 1):
        part = gray[:, start:stop] < level if light else gray[:, start:stop] > level
        rows = np.flatnonzero(part.any(axis=1))
        boxes.append((slice(int(rows[0]), int(rows[-1]) + 1), slice(int(start), int(stop))))
        mass.append(float(np.count_nonzero(part)))
    return several(boxes, np.asarray(mass))


def window(shape: tuple[int, int]) -> int:
    """The paper estimate's window in pixels (odd) for an image of this shape."""
    return max(3, int(round(WINDOW_SHARE * max(shape))) | 1)


def background(work: np.ndarray, light: bool, pad_frame: bool = True, surfaces: bool = False) -> np.ndarray:
    """The background's brightness at every pixel: a closing (light paper) or opening (dark board) of the lightly
    smoothed image, which removes anything narrower than the window and keeps the edges of wider regions; with
    ``surfaces`` no brighter (light paper) or darker (dark board) than the light on each pixel's own surface."""
    size = window(work.shape)
    if not pad_frame:
        smooth = ndimage.gaussian_filter(work, 1.0)
        return ndimage.grey_closing(smooth, size=size) if light else ndimage.grey_opening(smooth, size=size)
    # The frame's edge rows and columns are repeated outward by a window before the closing: a strip of table along
    # the frame narrower than the window is then as wide as the window and stays table instead of being filled with
    # paper (it read as ink there and joined a digit that came near that edge of the sheet).
    smooth = np.pad(ndimage.gaussian_filter(work, 1.0), size, mode="edge")
    if surfaces:  # the light on each pixel's own surface, with a window wide enough for bold strokes
        estimate = surface_light(smooth, int(round(SURFACE_SHARE * max(work.shape))), light)
    else:
        estimate = ndimage.grey_closing(smooth, size=size) if light else ndimage.grey_opening(smooth, size=size)
    return estimate[size:-size, size:-size]


def flat_background(gray: np.ndarray) -> bool:
    """True for a picture whose background is one exact level over most of it (MNIST, a drawing, a rendered
    digit, a clean export): it keeps version 1's canvas bit for bit. Photos and scans have noise, grain and light,
    so no single level covers half of them; they go through :func:`digit_ink`."""
    if max(gray.shape) <= SMALL_FRAME:  # a dataset-sized frame (MNIST, Fashion-MNIST) is a picture, not a photo
        return True
    if gray.dtype == np.uint8:
        counts = np.bincount(gray.ravel(), minlength=256)
    else:
        lo, hi = float(gray.min()), float(gray.max())
        if hi - lo < 1e-6:
            return True
        counts = np.bincount(np.round((gray.ravel() - lo) * (255.0 / (hi - lo))).astype(np.int64), minlength=256)
    return bool(counts.max() >= FLAT_SHARE * gray.size)


def ink_map(work: np.ndarray, pad_frame: bool = True, surfaces: bool = False) -> np.ndarray:
    """How much darker (light paper) or brighter (dark board) than its own background each pixel is, 0..1."""
    light = _light_background(work) or (surfaces and paper_is_light(work, window(work.shape)))
    estimate = background(work, light, pad_frame, surfaces)
    if light:
        # Relative to the paper under it, so a shadow does not weaken the ink; but never to less than half the
        # lit paper, or the noise of a dark table would be magnified into strokes.
        lit = float(np.percentile(estimate[::2, ::2], 95))
        ink = np.clip((estimate - work) / np.maximum(estimate, max(0.5 * lit, 1.0)), 0.0, 1.0)
        if surfaces:  # what lies on a surface far darker than the lit paper is beyond the sheet: a desk
            ink[estimate < PAPER_LIGHT * lit] = 0.0
        return ink
    top = max(float(work.max() - estimate.min()), 1e-6)
    return np.clip((work - estimate) / top, 0.0, 1.0)


def digit_ink(gray: np.ndarray, recipe: Recipe = V3) -> np.ndarray | None:
    """The digit of a photo or scan as a float32 crop of its ink (0 background, 1 the strongest stroke), or None
    when nothing stands out of the noise."""
    return find_digit(gray, recipe)[0]


def find_digit(gray: np.ndarray, recipe: Recipe = V3, count: bool = False) -> tuple[np.ndarray | None, bool]:
    """:func:`digit_ink`'s crop and, with ``count``, whether several digits stand side by side (:func:`several`)
    among the marks it chose from (the same ink map: no second pass over the photo)."""
    return _find_digit(ink_map(_work_image(gray), recipe.pad_frame, recipe.surfaces), recipe.drop_outlines, count,
                       recipe.surfaces)


def _without_outlines(candidates: np.ndarray, boxes: list, area: np.ndarray) -> np.ndarray:
    """The candidates less the outlines: a thin frame of ink (its pixels under OUTLINE_FILL of its box) around
    another candidate, as the edge of a sheet on a darker table leaves when the whole sheet is in the frame. Kept
    when nothing else is left."""
    def encloses(a: int, b: int) -> bool:
        (ar, ac), (br, bc) = boxes[a], boxes[b]
        return ar.start < br.start and ac.start < bc.start and ar.stop > br.stop and ac.stop > bc.stop

    def box_area(a: int) -> int:
        rows, cols = boxes[a]
        return (rows.stop - rows.start) * (cols.stop - cols.start)

    outlines = {int(i) for i in candidates if area[i] < OUTLINE_FILL * box_area(int(i))
                and any(encloses(int(i), int(j)) for j in candidates if j != i)}
    kept = np.array([i for i in candidates if int(i) not in outlines], dtype=candidates.dtype)
    return kept if kept.size else candidates


def _find_digit(ink: np.ndarray, drop_outlines: bool = True, count: bool = False, on_paper: bool = False
                ) -> tuple[np.ndarray | None, bool]:
    """From an ink map: the digit's ink crop (0..1), None without ink (or, with ``on_paper``, when the digit does
    not stand alone on its paper); and with ``count`` whether the candidate marks hold several digits side by
    side."""
    smooth = ndimage.gaussian_filter(ink, 0.8)
    peak = float(smooth.max())
    sample = smooth[::3, ::3]  # the paper's level and noise in the ink map: median and median absolute deviation
    paper = float(np.median(sample))
    noise = 1.4826 * float(np.median(np.abs(sample - paper)))
    if peak - paper < MIN_CONTRAST:
        return None, False
    level = max(INK_SHARE * peak, paper + NOISE_SIGMAS * noise)
    if level >= peak:
        return None, False
    labels, n = ndimage.label(smooth > level, structure=np.ones((3, 3)))
    if n == 0:
        return None, False
    index = np.arange(1, n + 1)
    mass = ndimage.sum_labels(smooth, labels, index)
    boxes = ndimage.find_objects(labels)
    h, w = labels.shape
    inner = np.array([box[0].start > 0 and box[1].start > 0 and box[0].stop < h and box[1].stop < w
                      for box in boxes])
    candidates = np.flatnonzero(inner) if inner.any() else np.arange(n)
    if drop_outlines:
        candidates = _without_outlines(candidates, boxes, ndimage.sum_labels(np.ones_like(smooth), labels, index))
    crowded = count and several([boxes[i] for i in candidates], mass[candidates])
    keep, box = _digit_parts(candidates, mass, boxes, drop_outlines)
    if on_paper and not crowded and _cluttered(keep, box, mass, boxes):
        return None, False
    return _digit_crop(ink, labels, keep, box, paper + 3.0 * noise), crowded


def _cluttered(keep: set[int], box: tuple[int, int, int, int], mass: np.ndarray, boxes: list) -> bool:
    """Whether ink other than the digit's, within a digit's size around it, outweighs CLUTTER times the digit: a
    digit on paper stands alone on it; a "digit" found in a scene or a texture has its like all around."""
    top, bottom, left, right = box
    side = max(bottom - top, right - left)
    around = [i for i, (rows, cols) in enumerate(boxes) if i not in keep
              and rows.start < bottom + side and rows.stop > top - side and cols.start < right + side
              and cols.stop > left - side]
    return float(mass[around].sum()) > CLUTTER * float(mass[sorted(keep)].sum())


def _digit_parts(candidates: np.ndarray, mass: np.ndarray, boxes: list, drop_outlines: bool
                 ) -> tuple[set[int], tuple[int, int, int, int]]:
    """The heaviest candidate with the fragments close to it: their indices and their box (top, bottom, left,
    right)."""
    main = int(candidates[np.argmax(mass[candidates])])
    top, bottom = boxes[main][0].start, boxes[main][0].stop
    left, right = boxes[main][1].start, boxes[main][1].stop
    keep = {main}
    main_side = max(bottom - top, right - left)
    grown = True
    while grown:  # take in fragments near the box, which then grows
        grown = False
        reach = NEAR_SHARE * max(bottom - top, right - left)
        for i in candidates:
            if i in keep or mass[i] < MIN_FRAGMENT * mass[main]:
                continue
            rows, cols = boxes[i]
            if drop_outlines and max(rows.stop - rows.start, cols.stop - cols.start) > main_side:  # a sheet's edge
                continue
            if (rows.start < bottom + reach and rows.stop > top - reach
                    and cols.start < right + reach and cols.stop > left - reach):
                keep.add(int(i))
                top, bottom = min(top, rows.start), max(bottom, rows.stop)
                left, right = min(left, cols.start), max(right, cols.stop)
                grown = True
    return keep, (top, bottom, left, right)


def _digit_crop(ink: np.ndarray, labels: np.ndarray, keep: set[int], box: tuple[int, int, int, int],
                floor: float) -> np.ndarray:
    """The ink of the digit's parts (``keep``, within ``box``) and of their soft edges, as a 0..1 crop."""
    h, w = labels.shape
    top, bottom, left, right = box
    mask = np.isin(labels[top:bottom, left:right], np.array(sorted(keep)) + 1)
    edge = np.count_nonzero(mask & ~ndimage.binary_erosion(mask, border_value=0))
    width = 2.0 * np.count_nonzero(mask) / max(edge, 1)  # a stroke of width w and length L: area wL, outline 2L
    # The strokes' soft edges lie below the threshold: keep the ink within a stroke's width of the chosen parts.
    pad = max(1, int(round(0.5 * width)))
    top, left = max(0, top - pad), max(0, left - pad)
    bottom, right = min(h, bottom + pad), min(w, right + pad)
    near = ndimage.distance_transform_edt(~np.isin(labels[top:bottom, left:right], np.array(sorted(keep)) + 1)) <= pad
    strokes = ink[top:bottom, left:right] * near
    strongest = float(np.percentile(strokes[near], 99))
    crop = np.clip((strokes - floor) / max(strongest - floor, 1e-6), 0.0, 1.0).astype(np.float32)
    # The box as version 1 takes it on a clean picture: where the ink is above a fifth of its range.
    rows, cols = np.flatnonzero(crop.max(axis=1) > BOX_INK), np.flatnonzero(crop.max(axis=0) > BOX_INK)
    crop = crop[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1] if rows.size else crop
    return crop


def mnist_tone(canvas: np.ndarray) -> np.ndarray:
    """A photo's 0..1 canvas with MNIST's tone: its ink scaled so that the strongest SATURATED_SHARE of its ink
    pixels reach 1 (an MNIST stroke has a saturated core and a soft fringe; a photographed stroke, divided by its
    paper and resized, is soft throughout)."""
    ink = canvas[canvas > TONE_INK]
    if ink.size == 0:
        return canvas
    full = float(np.quantile(ink, 1.0 - SATURATED_SHARE))
    return np.clip(canvas / max(full, 1e-6), 0.0, 1.0).astype(np.float32)
