"""Images and TorchServe request rows made by the tests (no committed binaries)."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


def png_bytes(image: Image.Image | np.ndarray) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def user_digit_png(canvas: np.ndarray, scale: int = 3) -> bytes:
    """A 28x28 MNIST digit as a user would send it: dark ink on white, enlarged."""
    picture = Image.fromarray(255 - canvas).resize((28 * scale, 28 * scale), Image.Resampling.BICUBIC)
    return png_bytes(picture)


def raw_row(data: bytes) -> dict:
    return {"body": data}


def json_row(data: bytes) -> dict:
    return {"body": {"data": base64.b64encode(data).decode()}}


def form_row(data: bytes) -> dict:
    return {"data": data}
