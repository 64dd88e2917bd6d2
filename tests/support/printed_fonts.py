"""Digits printed in font families training never reads (Debian's fonts-liberation and fonts-freefont-ttf, the
uploads exam's text faces: training prints its own digits with DejaVu only, training/printed.py)."""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw, ImageFont

from training.uploads import TEXT_FONT_DIRS


def printed_digits(seed: int = 0) -> list[tuple[bytes, str]]:
    """Every digit in every Liberation and FreeFont face, twice, at random sizes, offsets and stroke widths, in both
    polarities, as PNG or JPEG."""
    fonts = sorted(p for directory in TEXT_FONT_DIRS for p in directory.glob("*.ttf"))
    assert len(fonts) >= 20, "fonts-liberation or fonts-freefont-ttf is missing (scripts/system-deps.sh installs them)"
    rng = random.Random(seed)
    out = []
    for font_path in fonts:
        for digit in range(10):
            for _ in range(2):
                size = rng.choice([40, 64, 96])
                font = ImageFont.truetype(str(font_path), size)
                side = int(size * 1.6)
                image = Image.new("L", (side, side), 255)
                ImageDraw.Draw(image).text((side / 2 + rng.randint(-8, 8), side / 2 + rng.randint(-8, 8)), str(digit),
                                           font=font, fill=0, anchor="mm", stroke_width=rng.choice([0, 0, 1, 2]),
                                           stroke_fill=0)
                if rng.random() < 0.5:
                    image = Image.eval(image, lambda v: 255 - v)
                fmt = rng.choice(["PNG", "JPEG"])
                buf = io.BytesIO()
                image.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
                out.append((buf.getvalue(), str(digit)))
    return out
