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
    #: :func:`phone_exam`'s conditions: the scene (SCENES, or "classic" for :func:`photo_exam`'s recipe), how the
    #: sheet lies when its edge is in the frame (GEOMETRIES, else "full") and what shows beyond it (BEYOND, else
    #: "none"), and whether the digit is handwritten (a held-out MNIST digit) or printed in an unseen font.
    scene: str = "classic"
    geometry: str = "full"
    beyond: str = "none"
    source: str = "handwriting"


def _digit_sheet(digit: np.ndarray, sheet: tuple[int, int], rng: np.random.Generator, ink: str, paper: str,
                 height_share: float, room: float = 0.9, turn: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The sheet (H, W, 3) float32 with the digit printed on it (ink height = height_share of the sheet), and the
    ink's coverage (H, W). The digit's box lies in the central `room` share of the sheet, turned by up to 12 degrees
    plus ``turn``."""
    width, height = sheet
    tone = np.array(PAPER_TONES[paper], np.float32)
    grain = rng.normal(0, 2.0, (height, width)).astype(np.float32)
    rgb = np.broadcast_to(tone, (height, width, 3)) + grain[..., None]
    side = max(12, int(height_share * height * 28 / 20))  # MNIST digits fill 20 of 28 pixels
    stroke = Image.fromarray(np.asarray(digit, np.uint8)).resize((side, side), Image.Resampling.BICUBIC)
    stroke = stroke.rotate(float(rng.uniform(-12, 12)) + turn, resample=Image.Resampling.BICUBIC)
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


# --- sheets that do not fill the frame, shadow boundaries (the phone exam) --------------------------------------

#: The phone exam's scenes: the sheet's edge in the frame, a shadow's boundary across the sheet, both.
SCENES = ("edge", "shadow", "edge+shadow")
#: How a sheet whose edge is in the frame lies: turned 15-40 degrees (corners in the frame), or shifted so that one
#: or two of its edges cross the frame.
GEOMETRIES = ("rotated", "offset")
#: What shows beyond the sheet's edge.
BEYOND = ("desk", "second sheet")
#: Printed digits come from the faces of the uploads exam, which training never reads (it prints DejaVu).
FONT_DIRS = ("/usr/share/fonts/truetype/liberation", "/usr/share/fonts/truetype/freefont")


def font_digit(label: int, font_path: str, rng: np.random.Generator, side: int = 112) -> np.ndarray:
    """A printed digit as a light-on-black square (uint8, side x side) framed like MNIST: its height about 20/28
    of the side, regular or drawn bolder (a stroke of up to 4% of the side)."""
    from PIL import ImageFont

    image = Image.new("L", (side, side), 0)
    font = ImageFont.truetype(font_path, int(side * 0.95))
    stroke = int(rng.choice([0, 0, 1, 2, 4]))
    draw = ImageDraw.Draw(image)
    box = draw.textbbox((0, 0), str(label), font=font, anchor="lt", stroke_width=stroke)
    scale = (side * 20 / 28) / max(box[3] - box[1], 1)
    font = ImageFont.truetype(font_path, max(8, int(side * 0.95 * scale)))
    draw.text((side / 2, side / 2), str(label), font=font, fill=255, anchor="mm", stroke_width=stroke, stroke_fill=255)
    return np.asarray(image)


def _desk(size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """A desk (H, W, 3): one of TABLES' tones, with wood grain or a mottled, low-frequency texture."""
    width, height = size
    tone = np.array(TABLES[str(rng.choice(list(TABLES)))], np.float32) * rng.uniform(0.85, 1.1)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    if rng.random() < 0.5:
        turn = rng.uniform(0, np.pi)
        along = np.cos(turn) * xx + np.sin(turn) * yy
        across = -np.sin(turn) * xx + np.cos(turn) * yy
        texture = 12 * np.sin(across / rng.uniform(3, 9) + 2 * np.sin(along / 90))
    else:
        coarse = rng.normal(0, 1, (height // 32 + 2, width // 32 + 2)).astype(np.float32)
        texture = 10 * np.asarray(Image.fromarray(coarse, "F").resize((width, height), Image.Resampling.BICUBIC))
    return tone + texture[..., None].astype(np.float32)


def _turn(geometry: str, rng: np.random.Generator) -> float:
    """How far a sheet lying this way is turned in the frame, degrees."""
    return float({"rotated": rng.choice([-1, 1]) * rng.uniform(15, 40), "offset": rng.uniform(-8, 8),
                  "full": rng.uniform(-4, 4)}[geometry])


def _placement(size: tuple[int, int], sheet_size: tuple[int, int], geometry: str, rng: np.random.Generator,
               turn: float | None = None) -> np.ndarray:
    """Where the sheet's four corners land in the frame (a little perspective on top of the turn and shift)."""
    width, height = size
    sw, sh = sheet_size
    turn = _turn(geometry, rng) if turn is None else turn
    centre = np.array([width / 2, height / 2]) + rng.uniform(-0.08, 0.08, 2) * [width, height]
    if geometry == "offset":  # push the sheet off one or two sides of the frame
        shift = rng.uniform(0.25, 0.45, 2) * [width, height] * rng.choice([-1, 1], 2)
        centre = centre + shift * ([1, 0] if rng.random() < 0.4 else [0, 1] if rng.random() < 0.5 else [1, 1])
    corners = np.array([[-sw / 2, -sh / 2], [sw / 2, -sh / 2], [sw / 2, sh / 2], [-sw / 2, sh / 2]])
    rotation = np.array([[np.cos(np.deg2rad(turn)), -np.sin(np.deg2rad(turn))],
                         [np.sin(np.deg2rad(turn)), np.cos(np.deg2rad(turn))]])
    return corners @ rotation.T + centre + rng.uniform(-0.05, 0.05, (4, 2)) * [sw, sh]


def _warp(plane: np.ndarray, size: tuple[int, int], corners: np.ndarray) -> np.ndarray:
    """A float plane of a sheet, put in the frame with its corners at ``corners`` (zero outside)."""
    h, w = plane.shape
    src = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float64)
    return np.asarray(Image.fromarray(np.ascontiguousarray(plane, np.float32), "F").transform(
        size, Image.Transform.PERSPECTIVE, _perspective_coefficients(src, corners), Image.Resampling.BILINEAR),
        np.float32)


def _shadow_boundary(size: tuple[int, int], rng: np.random.Generator, through: tuple[float, float]) -> np.ndarray:
    """Multiplicative light (H, W) of a shadow whose boundary crosses the frame through ``through``: a straight or
    gently bent line with a penumbra of 0.2-1.5% of the width, the shaded side 20-55% darker."""
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    turn = rng.uniform(0, 2 * np.pi)
    along = (xx - through[0]) * -np.sin(turn) + (yy - through[1]) * np.cos(turn)
    across = (xx - through[0]) * np.cos(turn) + (yy - through[1]) * np.sin(turn)
    across = across + rng.uniform(-0.6, 0.6) * along ** 2 / max(width, height)  # bent, as a hand's or a lamp's
    penumbra = rng.uniform(0.002, 0.015) * width
    shade = 0.5 * (1 + np.tanh(across / penumbra))
    return (1 - rng.uniform(0.2, 0.55) * shade).astype(np.float32)


def _sheet_scene(glyph: np.ndarray, rng: np.random.Generator, scene: str
                 ) -> tuple[np.ndarray, tuple[int, int], dict] | None:
    """The digit's sheet photographed with its edge (a desk or a second sheet beyond) and/or a shadow's boundary
    in the frame; None when the digit leaves the frame or the sheet's edge does not show."""
    size = PHOTO_SIZES[rng.integers(len(PHOTO_SIZES))]
    size = size[::-1] if rng.random() < 0.3 else size
    width, height = size
    ink, paper = str(rng.choice(list(INKS))), str(rng.choice(list(PAPER_TONES)))
    share = float(rng.uniform(0.12, 0.55))
    edge = scene != "shadow"
    geometry = str(rng.choice(GEOMETRIES)) if edge else "full"
    beyond = str(rng.choice(BEYOND)) if edge else "none"
    scale = {"full": 1.3, "rotated": rng.uniform(0.75, 1.05), "offset": 1.2}[geometry]
    sheet_size = (int(width * scale), int(height * scale))
    # The sheet lies turned, but the digit was written, or the phone held, upright to the camera: turned back.
    turn = _turn(geometry, rng)
    sheet, coverage = _digit_sheet(glyph, sheet_size, rng, ink, paper, share / scale, room=0.8, turn=turn)
    corners = _placement(size, sheet_size, geometry, rng, turn)
    inside = _warp(np.ones(sheet_size[::-1], np.float32), size, corners)[..., None]
    ink_seen = _warp(coverage, size, corners)
    margin = max(2, int(0.02 * min(width, height)))
    cut = max(ink_seen[:margin].max(), ink_seen[-margin:].max(), ink_seen[:, :margin].max(),
              ink_seen[:, -margin:].max())
    shown = float(inside.mean())
    if cut > 0.02 or ink_seen.sum() < 0.4 * coverage.sum() or (edge and not 0.35 < shown < 0.93):
        return None
    backdrop = _desk(size, rng)
    if beyond == "second sheet":  # another sheet under this one, turned its own way, on the desk
        other = np.array(PAPER_TONES[str(rng.choice(list(PAPER_TONES)))], np.float32) * rng.uniform(0.8, 1.02)
        grain = rng.normal(0, 2.0, (height, width, 1)).astype(np.float32)
        under = _warp(np.ones((height, width), np.float32), size,
                      _placement(size, (int(width * 1.3), int(height * 1.3)), "offset", rng))[..., None]
        backdrop = backdrop * (1 - under) + (other + grain) * under
    if edge and rng.random() < 0.5:  # the sheet's own thin shadow on what lies beyond its edge
        rim = np.asarray(Image.fromarray((inside[..., 0] * 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(
            rng.uniform(2, 6))), np.float32)[..., None] / 255
        backdrop = backdrop * (1 - rng.uniform(0.1, 0.3) * rim)
    warped = np.stack([_warp(sheet[..., c], size, corners) for c in range(3)], -1)
    rgb = warped * inside + backdrop * (1 - inside)
    if scene != "edge":
        ys, xs = np.nonzero(ink_seen > 0.3)
        pick = int(rng.integers(len(ys))) if len(ys) and rng.random() < 0.5 else None
        through = (float(xs[pick]), float(ys[pick])) if pick is not None else tuple(rng.uniform(0.2, 0.8, 2) * size)
        rgb = rgb * _shadow_boundary(size, rng, through)[..., None]
    return rgb, size, {"kind": "photo", "ink": ink, "table": "none" if not edge else beyond, "digit_height": share,
                       "scene": scene, "geometry": geometry, "beyond": beyond}


def sheet_photographed(glyph: np.ndarray, rng: np.random.Generator, scene: str) -> tuple[bytes, dict]:
    """:func:`_sheet_scene` with the camera of :func:`photographed` (light, colour cast, blur, noise, JPEG)."""
    while True:
        framed = _sheet_scene(glyph, rng, scene)
        if framed is not None:
            break
    rgb, size, conditions = framed
    width, height = size
    rgb = rgb * _lighting(size, rng, shadow=False)[..., None]
    rgb = rgb * np.array([rng.uniform(0.88, 1.05), 1.0, rng.uniform(0.85, 1.1)], np.float32)
    blurred = Image.fromarray(rgb.clip(0, 255).astype(np.uint8), "RGB").filter(
        ImageFilter.GaussianBlur(rng.uniform(0, 0.0025) * width))
    rgb = np.asarray(blurred, np.float32) + rng.normal(0, rng.uniform(1.5, 6), (height, width, 1)).astype(np.float32)
    quality = int(rng.integers(50, 96))
    return _encode(rgb, rng, quality, gray=False), {**conditions, "shadow": conditions["scene"] != "edge",
                                                    "quality": quality}


def phone_exam(digits: np.ndarray, labels: np.ndarray, seed: int = 0) -> list[ExamItem]:
    """The photo exam as phones take it: one upload per held-out digit (28x28 uint8, light on black), in order.
    Two in five follow :func:`photo_exam`'s recipe ("classic": photos and scans); the others are one of SCENES in
    equal shares. Half the items show the held-out handwritten digit, half the same digit printed in a face of
    FONT_DIRS (regular or bold)."""
    from pathlib import Path

    fonts = sorted(str(p) for d in FONT_DIRS for p in Path(d).glob("*.ttf"))
    assert len(fonts) >= 20, "fonts-liberation or fonts-freefont-ttf is missing (scripts/system-deps.sh installs them)"
    rng = np.random.default_rng([seed, 40])
    items = []
    for digit, label in zip(digits, labels):
        printed = rng.random() < 0.5
        glyph = font_digit(int(label), fonts[int(rng.integers(len(fonts)))], rng) if printed else digit
        draw = rng.random()
        if draw < 0.4:
            body, conditions = (scanned if draw < 0.1 else photographed)(glyph, rng)
        else:
            body, conditions = sheet_photographed(glyph, rng, SCENES[min(2, int((draw - 0.4) / 0.2))])
        items.append(ExamItem(body, int(label), **conditions, source="font" if printed else "handwriting"))
    return items


def photo_exam(digits: np.ndarray, labels: np.ndarray, seed: int = 0, scan_share: float = 0.25) -> list[ExamItem]:
    """One photographed or scanned upload per held-out digit (28x28 uint8, light on black), in order."""
    rng = np.random.default_rng(seed)
    items = []
    for digit, label in zip(digits, labels):
        body, conditions = (scanned if rng.random() < scan_share else photographed)(digit, rng)
        items.append(ExamItem(body, int(label), **conditions))
    return items


def conditions(item: ExamItem) -> list[str]:
    """The conditions an item of :func:`phone_exam` is reported under (docs/photos.md), "all" first."""
    keys = ["all", f"scene={item.scene}" + (f" {item.kind}" if item.scene == "classic" else ""),
            f"source={item.source}", f"ink={item.ink}", f"digit_height<0.15={item.digit_height < 0.15}"]
    if "edge" in item.scene:
        keys += [f"sheet={item.geometry}", f"beyond={item.beyond}"]
    return keys


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
    p.add_argument("--exam", choices=("photo", "phone"), default="photo", help="photo_exam or phone_exam")
    args = p.parse_args(argv)
    held_out = load_dataset("mnist-sample")
    pick = np.linspace(0, len(held_out.test_images) - 1, args.n).astype(int)
    exam = photo_exam if args.exam == "photo" else phone_exam
    contact_sheet(exam(held_out.test_images[pick], held_out.test_labels[pick], args.seed)).save(Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
