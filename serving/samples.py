"""Sample digit images for trying the endpoint: held-out MNIST digits drawn as a user would send them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def write_samples(out: Path, scale: int = 4) -> list[Path]:
    """One PNG per digit from the held-out split, dark ink on white and enlarged, like a scanned digit."""
    from training.data.sample import load_mnist_sample

    ds = load_mnist_sample()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for digit in range(10):
        image = ds.test_images[np.flatnonzero(ds.test_labels == digit)[0]]
        picture = Image.fromarray(255 - image).resize((28 * scale, 28 * scale), Image.Resampling.BICUBIC)
        path = out / f"digit_{digit}.png"
        picture.save(path)
        written.append(path)
    return written
