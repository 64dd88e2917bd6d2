"""Folders of labelled images (``root/<label>/NN.png|jpg``) drawn inside the tests, for the folder layout."""

from __future__ import annotations

import hashlib
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


def user_folder(root: Path) -> Path:
    """A folder a user owns: ``7/digit_7.png`` (a real PNG) and ``notes.txt``."""
    (root / "7").mkdir(parents=True)
    drawing("7", 0).save(root / "7" / "digit_7.png", "PNG")
    (root / "notes.txt").write_text("my notes\n")
    return root


def tree_digest(root: Path) -> str:
    """SHA-256 over every path under `root` (folders too, hidden ones included) and every file's bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def digit_folder(root: Path, per_class: int = 4, classes: tuple[int, ...] = (3, 7)) -> Path:
    """The user's own digits: ``root/<digit>/NN.png`` from the bundled sample's held-out images, plus a blank page
    in ``7/`` (answered unknown, no ink), a file that is not an image in ``7/`` (refused), a drawing in ``cat/`` (a
    label the gallery lacks) and one unlabelled digit at the top."""
    import numpy as np

    from training.data import load_dataset

    sample = load_dataset("mnist-sample")
    for digit in classes:
        (root / str(digit)).mkdir(parents=True)
        for n, i in enumerate(np.flatnonzero(sample.test_labels == digit)[:per_class]):
            Image.fromarray(sample.test_images[i]).save(root / str(digit) / f"{n:02d}.png")
    Image.new("L", (40, 40), 255).save(root / "7" / "blank.png")
    (root / "7" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really" * 5)
    (root / "cat").mkdir()
    drawing("cat", 1).save(root / "cat" / "ring.png")
    Image.fromarray(sample.test_images[0]).save(root / "unsorted.png")
    return root
