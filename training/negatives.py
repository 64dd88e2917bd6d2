"""Synthetic non-digits for outlier exposure (Hendrycks et al. 2019, "Deep Anomaly Detection with Outlier
Exposure", ICLR): training shows the model images that are not digits and pushes their embeddings away from
every class, so that the k-NN distance of an unseen non-digit grows.

Drawn with Pillow only: scribbles, filled and textured shapes, and letters/symbols rendered from the Debian
DejaVu fonts (glyphs that look like digits, such as O, l, S, Z, B, are left out). Never Fashion-MNIST: that
set is the open-set exam (``python -m training eval --ood fashion``), and nothing the uploads exam
(training/uploads.py, ``--ood uploads``) is made of: not the icon themes, Glyphicons, Font Awesome, Noto Color
Emoji, the Liberation or FreeFont faces, matplotlib's charts or sample data, nor segno. :func:`training_sources`
lists what is read; tests/unit/test_uploads_exam.py fails when a file the exam uses is opened here. Every image
then goes through the serving preprocessing (crop to content, fit, centre) like a request would.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from handler.preprocessing import canvases_from_arrays

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
#: Letters and symbols that no digit resembles (no O/o/Q/D for 0, I/l/i/j/J for 1, Z/z for 2, S/s for 5,
#: b/G for 6, T/L for 7, B for 8, g/q/P/y for 9, A/h/Y for 4).
GLYPHS = ("CEFHKMNRUVWXacefkmnrtuvwx#%&@*+=?!$€¥£§¶∞ΩΨΦΣΔΛΞΠΓθλμπφψω∫≈≠≡√∂∇⊕⊗"
          "★☆♠♣♥♦♪♫☺☼⌘✓✗✚✦❖←→↑↓↔⇔∎◆◇○●□■△▲▽▼")
KINDS = ("scribble", "shapes", "texture", "glyph")
SIZE = 56  # drawing canvas; preprocessing then fits the content into the 20x20 box


def training_sources() -> tuple[Path, ...]:
    """The folders whose files outlier exposure reads (the uploads exam must use none of them)."""
    return (FONT_DIR,)


@lru_cache(maxsize=1)
def _fonts() -> tuple[Path, ...]:
    return tuple(sorted(FONT_DIR.glob("DejaVu*.ttf")))


def _scribble(rng: np.random.Generator, draw: ImageDraw.ImageDraw) -> None:
    """Several random polylines at once: tangles of strokes, not one pen stroke that could be a digit."""
    for _ in range(int(rng.integers(3, 7))):
        points = [tuple(rng.uniform(2, SIZE - 2, 2)) for _ in range(int(rng.integers(3, 7)))]
        draw.line(points, fill=int(rng.integers(160, 256)), width=int(rng.integers(2, 7)), joint="curve")


def _shapes(rng: np.random.Generator, draw: ImageDraw.ImageDraw) -> None:
    """Filled ellipses, rectangles and polygons, some overlapping: silhouettes of objects."""
    for _ in range(int(rng.integers(1, 4))):
        x0, y0 = rng.uniform(0, SIZE * 0.5, 2)
        x1, y1 = x0 + rng.uniform(SIZE * 0.3, SIZE * 0.9), y0 + rng.uniform(SIZE * 0.3, SIZE * 0.9)
        fill = int(rng.integers(90, 256))
        kind = rng.integers(3)
        if kind == 0:
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif kind == 1:
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        else:
            draw.polygon([tuple(rng.uniform(0, SIZE, 2)) for _ in range(int(rng.integers(3, 8)))], fill=fill)


def _texture(rng: np.random.Generator) -> np.ndarray:
    """A shape filled with stripes, a checkerboard or noise, on black."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    angle, period = rng.uniform(0, np.pi), rng.uniform(3, 12)
    kind = rng.integers(3)
    if kind == 0:
        pattern = (np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period) > 0) * 1.0
    elif kind == 1:
        pattern = ((xx // period + yy // period) % 2) * 1.0
    else:
        pattern = rng.uniform(0.3, 1.0, (SIZE, SIZE))
    mask = Image.new("L", (SIZE, SIZE))
    _shapes(rng, ImageDraw.Draw(mask))
    return np.asarray(mask, np.float32) / 255.0 * pattern * 255.0


def _glyph(rng: np.random.Generator, draw: ImageDraw.ImageDraw) -> None:
    """One or two letters/symbols from a random DejaVu font (skipped where the fonts are not installed)."""
    fonts = _fonts()
    if not fonts:
        _scribble(rng, draw)
        return
    font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(rng.integers(28, 48)))
    text = "".join(GLYPHS[int(i)] for i in rng.integers(len(GLYPHS), size=int(rng.integers(1, 3))))
    draw.text((rng.uniform(0, 12), rng.uniform(0, 12)), text, fill=int(rng.integers(160, 256)), font=font)


def synthetic_negatives(n: int, seed: int = 0) -> np.ndarray:
    """n non-digit images as preprocessed uint8 canvases (n, 28, 28), the four kinds in turn; blank draws
    (a glyph a font lacks) are redrawn as scribbles."""
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        if kind == "texture":
            images.append(_texture(rng).astype(np.uint8))
            continue
        img = Image.new("L", (SIZE, SIZE))
        draw = ImageDraw.Draw(img)
        {"scribble": _scribble, "shapes": _shapes, "glyph": _glyph}[kind](rng, draw)
        array = np.asarray(img)
        if array.max() == 0:
            _scribble(rng, draw)
            array = np.asarray(img)
        images.append(array)
    return canvases_from_arrays(np.stack(images)) if images else np.zeros((0, 28, 28), np.uint8)
