"""bench's frozen oracles and the project's test copies of them are the same: one v1, one photo generator."""

from __future__ import annotations

import numpy as np
from support import photos

from bench import data
from settings import REPO


def test_the_two_copies_of_preprocess_v1_are_identical():
    bench_copy = (REPO / "bench" / "preprocess_v1.py").read_bytes()
    assert bench_copy == (REPO / "tests" / "support" / "preprocess_v1.py").read_bytes()


def test_the_two_photo_generators_make_the_same_jpegs():
    digits = np.random.default_rng(3).integers(0, 256, (3, 28, 28), dtype=np.uint8)
    made = {}
    for name, module in (("bench", data), ("tests", photos)):
        rng = np.random.default_rng(11)
        made[name] = [module.photo_jpeg(digit, rng) for digit in digits]
    assert made["bench"] == made["tests"]
    assert (data.REQUEST_SCALE, data.PHOTO_SIZE, data.PHOTO_QUALITY) == (
        photos.REQUEST_SCALE, photos.PHOTO_SIZE, photos.PHOTO_QUALITY)
