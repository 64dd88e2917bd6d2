"""Folders of labelled images (``root/<label>/NN.png|jpg``) drawn inside the tests, for the folder layout."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw


def drawing(label: str, i: int) -> Image.Image:
    """A dark shape on white, like a photo of ink on paper: a ring for "cat", a seven otherwise; `i` shifts it."""
    img = Image.new("L", (40 + i, 48), 255)
    draw = ImageDraw.Draw(img)
    if label == "cat":
        draw.ellipse((6 + i % 4, 8, 30 + i % 4, 40), outline=0, width=4)
    else:
        draw.line((8, 8 + i % 5, 32, 8 + i % 5), fill=0, width=4)
        draw.line((32, 8 + i % 5, 14, 42), fill=0, width=4)
    return img


def make_tree(root: Path, counts: dict[str, int]) -> Path:
    """``root/<label>/NN.png|jpg`` alternating formats, plus a notes.txt per label and a hidden directory, which the
    folder layout skips."""
    for label, n in counts.items():
        (root / label).mkdir(parents=True)
        for i in range(n):
            fmt, ext = ("PNG", "png") if i % 2 else ("JPEG", "JPG")
            drawing(label, i).save(root / label / f"{i:02d}.{ext}", fmt)
        (root / label / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    return root
