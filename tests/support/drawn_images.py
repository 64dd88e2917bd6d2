"""Digits drawn with Pillow in every format and mode the preprocessing accepts (the preprocessing tests and the
fast-path parity tests share them)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image, ImageDraw


FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP", "TIFF")


def draw_seven(size=(64, 64), ink=0, paper=255, mode="L", origin=(0, 0), scale=1.0) -> Image.Image:
    """A thick handwritten-like "7": a top bar and a diagonal down to the bottom left."""
    img = Image.new(mode, size, paper)
    x0, y0 = origin
    w, h = 64 * scale, 64 * scale
    points = [(x0 + 0.2 * w, y0 + 0.2 * h), (x0 + 0.8 * w, y0 + 0.2 * h), (x0 + 0.4 * w, y0 + 0.85 * h)]
    ImageDraw.Draw(img).line(points, fill=ink, width=max(1, round(8 * scale)), joint="curve")
    return img


def encode(img: Image.Image, fmt: str = "PNG", **params) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def png_with_size(width: int, height: int) -> bytes:
    """A real 4x4 PNG whose IHDR is patched to claim width x height (CRC fixed, pixel data left small)."""
    png = encode(Image.new("L", (4, 4), 0))
    (length,) = struct.unpack(">I", png[8:12])
    chunk = bytearray(png[12 : 16 + length])  # type + data
    chunk[4:12] = struct.pack(">II", width, height)
    crc = struct.pack(">I", zlib.crc32(bytes(chunk)))
    return png[:12] + bytes(chunk) + crc + png[16 + length + 4 :]


def in_mode(mode: str) -> Image.Image:
    """The reference "7" converted to a Pillow mode, with a 16-bit range for I;16."""
    if mode == "I;16":
        levels = np.asarray(draw_seven(), dtype=np.uint16)
        return Image.fromarray(np.where(levels > 127, 60000, 1000).astype(np.uint16))
    if mode == "RGB":
        return draw_seven(mode="RGB", ink=(20, 30, 120), paper=(250, 240, 220))  # blue ink, cream paper
    return draw_seven().convert(mode)


CASES = [
    ("L", "PNG", "L"),
    ("L", "JPEG", "L"),
    ("L", "BMP", "L"),
    ("L", "GIF", "P"),
    ("L", "WEBP", "RGB"),
    ("L", "TIFF", "L"),
]
CASES += [("RGB", fmt, "P" if fmt == "GIF" else "RGB") for fmt in FORMATS]
CASES += [
    ("RGBA", "PNG", "RGBA"),
    ("RGBA", "TIFF", "RGBA"),
    ("P", "PNG", "P"),
    ("P", "GIF", "P"),
    ("P", "TIFF", "P"),
    ("LA", "PNG", "LA"),
    ("LA", "TIFF", "LA"),
    ("CMYK", "JPEG", "CMYK"),
    ("CMYK", "TIFF", "CMYK"),
    ("I;16", "PNG", "I;16"),
    ("I;16", "TIFF", "I;16"),
    ("1", "PNG", "1"),
    ("1", "BMP", "1"),
    ("F", "TIFF", "F"),
]


ALPHA_CASES = {
    "dark-ink-on-transparent-black": ("RGBA", (0, 0, 0, 255), (0, 0, 0, 0)),
    "dark-ink-on-transparent-white": ("RGBA", (0, 0, 0, 255), (255, 255, 255, 0)),
    "light-ink-on-transparent-white": ("RGBA", (255, 255, 255, 255), (255, 255, 255, 0)),
    "light-ink-on-transparent-black": ("RGBA", (255, 255, 255, 255), (0, 0, 0, 0)),
    "grey-dark-ink-on-transparent": ("LA", (0, 255), (0, 0)),
    "grey-light-ink-on-transparent": ("LA", (255, 255), (255, 0)),
}


def lab_tiff() -> bytes:
    """A well-formed CIELab TIFF (PhotometricInterpretation 8), which Pillow opens as mode LAB."""
    img = draw_seven().convert("RGB")
    lab = Image.merge("LAB", (img.getchannel(0), Image.new("L", img.size, 128), Image.new("L", img.size, 128)))
    return encode(lab, "TIFF")
