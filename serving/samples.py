"""Digit images as users send them (held-out MNIST digits, dark ink on white, enlarged, PNG): the one generator
used by the quick start's samples, the benchmarks, the soak test and the tests."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def user_digit_png(canvas: np.ndarray, scale: int = 3) -> bytes:
    """A 28x28 light-on-black digit as a user would send it: dark on white, enlarged `scale` times, PNG."""
    picture = Image.fromarray(255 - np.asarray(canvas, dtype=np.uint8))
    if scale != 1:
        picture = picture.resize((28 * scale, 28 * scale), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    return buf.getvalue()


def held_out_digits() -> list[np.ndarray]:
    """The first held-out image of each digit 0-9 of the bundled MNIST sample (offline)."""
    from training.data.sample import load_mnist_sample

    ds = load_mnist_sample()
    return [ds.test_images[int(np.flatnonzero(ds.test_labels == digit)[0])] for digit in range(10)]


def write_samples(out: Path, scale: int = 4) -> list[Path]:
    """samples/digit_<d>.png for d in 0-9, like a scanned digit."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for digit, canvas in enumerate(held_out_digits()):
        path = out / f"digit_{digit}.png"
        path.write_bytes(user_digit_png(canvas, scale))
        written.append(path)
    return written
