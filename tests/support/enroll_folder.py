"""Folders of new labelled images for `training enroll` tests."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from training.data import load_dataset


def box_png(i: int) -> bytes:
    """A hollow rectangle, varied by i: a class no digit model has seen."""
    img = Image.new("L", (56, 56), 255)
    margin = 6 + i % 4
    ImageDraw.Draw(img).rectangle([margin, margin + i % 3, 56 - margin, 50 - i % 5], outline=0, width=4 + i % 3)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def write_new_folder(root: Path) -> Path:
    """root/box/*.png (6 rectangles, a new class) and root/7/*.png (5 sample sevens, an existing class)."""
    (root / "box").mkdir(parents=True)
    for i in range(6):
        (root / "box" / f"box{i}.png").write_bytes(box_png(i))
    ds = load_dataset("mnist-sample")
    (root / "7").mkdir()
    for i in np.flatnonzero(ds.train_labels == 7)[:5]:
        Image.fromarray(ds.train_images[i]).save(root / "7" / f"seven{i}.png")
    return root
