"""Printed digits for training: MNIST's handwriting alone reads a typeset "1" with a foot serif as "2".

Each digit is rendered from a random Debian DejaVu face (sans, serif, mono, condensed; regular, bold, oblique) at a
random size, offset and stroke width, then goes through the dataset preprocessing like the MNIST digits. They join
the training batches with their labels and never the gallery, so the k-NN answer still votes over real digits. The
tests check printed digits from other families (Liberation, FreeFont) that training never sees.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from handler.preprocessing import canvases_from_arrays

from .negatives import _fonts

SIZE = 56


def printed_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(canvases uint8 (n, 28, 28), digit labels int64 (n,)); empty where the DejaVu fonts are not installed."""
    fonts = [f for f in _fonts() if "MathTeX" not in f.name]
    if n <= 0 or not fonts:
        return np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.int64)
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(n):
        digit = i % 10
        font = ImageFont.truetype(str(fonts[int(rng.integers(len(fonts)))]), int(rng.integers(30, 50)))
        img = Image.new("L", (SIZE, SIZE))
        ImageDraw.Draw(img).text((SIZE / 2 + rng.uniform(-6, 6), SIZE / 2 + rng.uniform(-6, 6)), str(digit), font=font,
                                 fill=int(rng.integers(180, 256)), anchor="mm", stroke_width=int(rng.integers(0, 3)),
                                 stroke_fill=int(rng.integers(180, 256)))
        images.append(np.asarray(img))
        labels.append(digit)
    return canvases_from_arrays(np.stack(images)), np.asarray(labels, np.int64)
