"""The photo exam: held-out handwritten digits as people photograph and scan them.

Each item is a held-out digit of the bundled MNIST sample (never a training image) printed onto a sheet of paper
and then photographed or scanned, as encoded bytes the way a phone or a scanner uploads them. The recipe, drawn per
item from a seeded generator (:func:`photo_exam`):

- paper: tone (white, cream, grey, recycled), its own fine grain; the digit printed in pen ink (black, blue) or
  pencil (grey, grainy, lighter), 8-70% of the frame's height, rotated up to 12 degrees, anywhere on the sheet;
- photos (3 in 4): the sheet under a perspective (tilted up to ~10% of its size per corner) and rotated, on a
  table (wood, dark, grey, light) visible at one or more edges, or filling the frame; a lighting gradient of 10-60
  grey levels, vignetting (up to 35% darker corners), half of them with a soft shadow across the sheet (15-45%
  darker), a colour cast, defocus blur, sensor noise; 640x480 to 1280x960, portrait or landscape; JPEG 50-95;
- scans (1 in 4): the sheet flat and straight to 3 degrees, even light with a faint scanner gradient, light
  noise, greyscale or colour, 850x1100 (100 dpi letter) or 1240x1754 (150 dpi A4); PNG or JPEG 75-95.

The exam checks a model through the served endpoint (tests/integration/test_photo_quality.py); docs/photos.md
shows samples and what the preprocessing made of them.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

PAPER_TONES = {"white": (246, 246, 244), "cream": (243, 236, 214), "grey": (222, 222, 218),
               "recycled": (228, 222, 205)}
INKS = {"black pen": (28, 28, 34), "blue pen": (30, 45, 120), "pencil": (95, 95, 100)}
TABLES = {"wood": (120, 82, 50), "dark": (45, 42, 40), "grey": (128, 128, 132), "light": (200, 198, 190)}
PHOTO_SIZES = ((640, 480), (800, 600), (1024, 768), (1280, 960))
SCAN_SIZES = ((850, 1100), (1240, 1754))


@dataclass(frozen=True)
class ExamItem:
    """One upload: its bytes, the digit's label and how it was made (for per-condition figures)."""

    body: bytes
    label: int
    kind: str  # "photo" or "scan"
    ink: str
    table: str  # "none" when the sheet fills the frame
    shadow: bool
    quality: int  # JPEG quality, 0 for PNG
    digit_height: float  # digit's height over the frame's height


def _digit_sheet(digit: np.ndarray, sheet: tuple[int, int], rng: np.random.Generator, ink: str, paper: str,
                 height_share: float, room: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """The sheet (H, W, 3) float32 with the digit printed on it (ink height = height_share of the sheet), and the
    ink's coverage (H, W). The digit's box lies in the central `room` share of the sheet."""
    width, height = sheet
    tone = np.array(PAPER_TONES[paper], np.float32)
    grain = rng.normal(0, 2.0, (height, width)).astype(np.float32)
    rgb = np.broadcast_to(tone, (height, width, 3)) + grain[..., None]
    side = max(12, int(height_share * height * 28 / 20))  # MNIST digits fill 20 of 28 pixels
    stroke = Image.fromarray(np.asarray(digit, np.uint8)).resize((side, side), Image.Resampling.BICUBIC)
    stroke = stroke.rotate(float(rng.uniform(-12, 12)), resample=Image.Resampling.BICUBIC)
    alpha = np.asarray(stroke, np.float32) / 255.0
    if ink == "pencil":
        alpha = alpha * rng.uniform(0.55, 0.85) * (1 + rng.normal(0, 0.15, alpha.shape)).clip(0.5, 1.3)
        alpha = alpha.clip(0, 1)
    x0 = int(width * (1 - room) / 2 + rng.uniform(0, 1) * max(0, width * room - side))
    y0 = int(height * (1 - room) / 2 + rng.uniform(0, 1) * max(0, height * room - side))
    h, w = min(side, height - y0), min(side, width - x0)
    a = alpha[:h, :w, None]
    rgb = rgb.copy()
    rgb[y0:y0 + h, x0:x0 + w] = rgb[y0:y0 + h, x0:x0 + w] * (1 - a) + np.array(INKS[ink], np.float32) * a
    coverage = np.zeros((height, width), np.float32)
    coverage[y0:y0 + h, x0:x0 + w] = a[..., 0]
    return rgb, coverage


def _perspective_coefficients(src: np.ndarray, dst: np.ndarray) -> list[float]:
    """Pillow's PERSPECTIVE coefficients mapping output points dst to input points src (four of each)."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(dst, src):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        rhs += [u, v]
    return list(np.linalg.solve(np.asarray(rows, np.float64), np.asarray(rhs, np.float64)))


def _lighting(size: tuple[int, int], rng: np.random.Generator, shadow: bool) -> np.ndarray:
    """Multiplicative light (H, W): a linear gradient, vignetting and optionally a soft-edged shadow."""
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = xx / width - 0.5, yy / height - 0.5
    angle = rng.uniform(0, 2 * np.pi)
    light = 1 + rng.uniform(10, 60) / 240 * (np.cos(angle) * u + np.sin(angle) * v)
    light *= 1 - rng.uniform(0, 0.35) * ((u ** 2 + v ** 2) / 0.5) ** 1.5
    if shadow:
        mask = Image.new("L", size, 0)
        corner = rng.integers(4)
        cx, cy = [(0, 0), (width, 0), (width, height), (0, height)][corner]
        reach = rng.uniform(0.3, 0.7)
        points = [(cx, cy), (cx + (width if cx == 0 else -width) * reach, cy),
                  (cx, cy + (height if cy == 0 else -height) * rng.uniform(0.4, 1.0))]
        ImageDraw.Draw(mask).polygon(points, fill=255)
        mask = mask.filter(ImageFilter.GaussianBlur(rng.uniform(0.005, 0.03) * width))
        light *= 1 - rng.uniform(0.15, 0.45) * np.asarray(mask, np.float32) / 255.0
    return light


def _encode(rgb: np.ndarray, rng: np.random.Generator, quality: int, gray: bool) -> bytes:
    image = Image.fromarray(rgb.clip(0, 255).round().astype(np.uint8), "RGB")
    if gray:
        image = image.convert("L")
    buf = io.BytesIO()
    if quality:
        image.save(buf, "JPEG", quality=quality)
    else:
        image.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def photographed(digit: np.ndarray, rng: np.random.Generator) -> tuple[bytes, dict]:
    """A held-out 28x28 light-on-black digit printed on paper and photographed; returns (JPEG bytes, conditions).
    A framing that cuts the digit off (a person would retake it) is drawn again."""
    while True:
        framed = _photo_frame(digit, rng)
        if framed is not None:
            break
    rgb, size, conditions = framed
    width, height = size
    shadow = bool(rng.random() < 0.5)
    rgb = rgb * _lighting(size, rng, shadow)[..., None]
    rgb = rgb * np.array([rng.uniform(0.88, 1.05), 1.0, rng.uniform(0.85, 1.1)], np.float32)
    blurred = Image.fromarray(rgb.clip(0, 255).astype(np.uint8), "RGB").filter(
        ImageFilter.GaussianBlur(rng.uniform(0, 0.0025) * width))
    rgb = np.asarray(blurred, np.float32) + rng.normal(0, rng.uniform(1.5, 6), (height, width, 1)).astype(np.float32)
    quality = int(rng.integers(50, 96))
    return _encode(rgb, rng, quality, gray=False), {**conditions, "shadow": shadow, "quality": quality}


def _photo_frame(digit: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, tuple[int, int], dict] | None:
    """The sheet with the digit, put in perspective on the table; None when the digit leaves the frame."""
    size = PHOTO_SIZES[rng.integers(len(PHOTO_SIZES))]
    if rng.random() < 0.3:
        size = size[::-1]
    width, height = size
    ink, paper = rng.choice(list(INKS)), rng.choice(list(PAPER_TONES))
    table = "none" if rng.random() < 0.3 else str(rng.choice(list(TABLES)))
    fill = 1.0 if table == "none" else rng.uniform(0.7, 0.95)
    share = float(rng.uniform(0.08, 0.6))
    scale = 1.15 if table == "none" else fill
    sheet_size = (int(width * scale), int(height * scale))
    sheet, coverage = _digit_sheet(digit, sheet_size, rng, ink, paper, share / scale, room=0.7)
    # Where the sheet's corners land in the frame: centred, shifted, each corner moved up to 10% (perspective).
    sw, sh = sheet_size
    centre = np.array([width / 2, height / 2]) + rng.uniform(-0.08, 0.08, 2) * [width, height]
    corners = np.array([[-sw / 2, -sh / 2], [sw / 2, -sh / 2], [sw / 2, sh / 2], [-sw / 2, sh / 2]])
    turn = np.deg2rad(rng.uniform(-8, 8))
    rotation = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
    dst = corners @ rotation.T + centre + rng.uniform(-0.1, 0.1, (4, 2)) * [sw, sh]
    src = np.array([[0, 0], [sw, 0], [sw, sh], [0, sh]], np.float64)
    coefficients = _perspective_coefficients(src, dst)
    def warp(plane: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(np.ascontiguousarray(plane, np.float32), "F").transform(
            size, Image.Transform.PERSPECTIVE, coefficients, Image.Resampling.BILINEAR), np.float32)

    ink_seen = warp(coverage)
    margin = max(2, int(0.02 * min(width, height)))
    edge = np.concatenate([ink_seen[:margin].ravel(), ink_seen[-margin:].ravel(), ink_seen[:, :margin].ravel(),
                           ink_seen[:, -margin:].ravel()])
    if edge.max() > 0.02 or ink_seen.sum() < 0.8 * coverage.sum() * 0.5:
        return None
    warped = np.stack([warp(sheet[..., c]) for c in range(3)], -1)
    inside = np.asarray(Image.new("F", sheet_size, 1.0).transform(size, Image.Transform.PERSPECTIVE, coefficients,
                                                                   Image.Resampling.BILINEAR), np.float32)[..., None]
    if table == "none":
        inside = np.ones_like(inside)
    tone = np.array(TABLES.get(table, (0, 0, 0)), np.float32)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    grain = 10 * np.sin(yy / rng.uniform(3, 9) + 2 * np.sin(xx / 90)) if table == "wood" else 0
    rgb = warped * inside + (tone + np.asarray(grain, np.float32)[..., None]) * (1 - inside)
    return rgb, size, {"kind": "photo", "ink": str(ink), "table": table, "digit_height": share}


def scanned(digit: np.ndarray, rng: np.random.Generator) -> tuple[bytes, dict]:
    """A held-out digit printed on paper and scanned; returns (PNG or JPEG bytes, conditions)."""
    size = SCAN_SIZES[rng.integers(len(SCAN_SIZES))]
    ink, paper = rng.choice(list(INKS)), rng.choice(list(PAPER_TONES))
    share = float(rng.uniform(0.05, 0.4))
    sheet, _ = _digit_sheet(digit, size, rng, ink, paper, share)
    image = Image.fromarray(sheet.clip(0, 255).astype(np.uint8), "RGB").rotate(
        float(rng.uniform(-3, 3)), resample=Image.Resampling.BILINEAR, fillcolor=PAPER_TONES[paper])
    width, height = size
    ramp = 1 - rng.uniform(0, 0.06) * np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    rgb = np.asarray(image, np.float32) * ramp + rng.normal(0, 1.5, (height, width, 1))
    quality = int(rng.integers(75, 96)) if rng.random() < 0.5 else 0
    return _encode(rgb, rng, quality, gray=bool(rng.random() < 0.5)), {
        "kind": "scan", "ink": str(ink), "table": "none", "shadow": False, "quality": quality, "digit_height": share}


def photo_exam(digits: np.ndarray, labels: np.ndarray, seed: int = 0, scan_share: float = 0.25) -> list[ExamItem]:
    """One photographed or scanned upload per held-out digit (28x28 uint8, light on black), in order."""
    rng = np.random.default_rng(seed)
    items = []
    for digit, label in zip(digits, labels):
        body, conditions = (scanned if rng.random() < scan_share else photographed)(digit, rng)
        items.append(ExamItem(body, int(label), **conditions))
    return items


def contact_sheet(items: list[ExamItem], tile: int = 160) -> Image.Image:
    """Each item's upload (thumbnail) beside the canvas the served digits preprocessing makes of it."""
    from handler.preprocessing import DIGITS

    columns = 4
    rows = (len(items) + columns - 1) // columns
    sheet = Image.new("RGB", (columns * 2 * tile, rows * tile), "white")
    for i, item in enumerate(items):
        upload = Image.open(io.BytesIO(item.body)).convert("RGB")
        upload.thumbnail((tile - 8, tile - 8))
        canvas = Image.fromarray(DIGITS.canvas(item.body, 50_000_000)).resize((tile - 8, tile - 8),
                                                                               Image.Resampling.NEAREST)
        x, y = (i % columns) * 2 * tile, (i // columns) * tile
        sheet.paste(upload, (x + 4, y + 4))
        sheet.paste(canvas.convert("RGB"), (x + tile + 4, y + 4))
    return sheet


def main(argv: list[str] | None = None) -> int:
    """PYTHONPATH=.:tests python -m support.photo_set OUT.png: a contact sheet of exam items for the docs."""
    from pathlib import Path

    from cli_common import Parser, positive_int
    from training.data import load_dataset

    p = Parser(prog="python -m support.photo_set", description=main.__doc__)
    p.add_argument("out", type=Path, help="PNG to write")
    p.add_argument("--n", type=positive_int, default=16, help="items")
    p.add_argument("--seed", type=int, default=0, help="exam seed")
    args = p.parse_args(argv)
    held_out = load_dataset("mnist-sample")
    pick = np.linspace(0, len(held_out.test_images) - 1, args.n).astype(int)
    contact_sheet(photo_exam(held_out.test_images[pick], held_out.test_labels[pick], args.seed)).save(Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
