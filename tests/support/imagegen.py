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


def raw_row(data: bytes) -> dict:
    return {"body": data}


def json_row(data: bytes) -> dict:
    return {"body": {"data": base64.b64encode(data).decode()}}


def form_row(data: bytes) -> dict:
    return {"data": data}
