"""Digits preprocessing versions 2, 3 and 4: photos and scans have their light removed and their digit found
(handler/photo.py); clean pictures keep version 1's canvas bit for bit; models keep the version they were built
with (versions 2 and 3 frozen as they were). Version 4's own cases: tests/unit/test_photo_surfaces.py."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from PIL import Image, ImageDraw
from support.photo_set import photo_exam

from handler.preprocessing import (
    DIGITS,
    DIGITS_V1,
    DIGITS_V2,
    DIGITS_V3,
    SERVED,
    is_blank,
    profile_of,
    to_canvas,
    to_canvas_v2,
    to_canvas_v3,
    to_canvas_v4,
)
from training.data import load_dataset


@pytest.fixture(scope="module")
def sample():
    return load_dataset("mnist-sample")


def jpeg(gray: np.ndarray, quality: int = 85) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.clip(gray, 0, 255).astype(np.uint8), "L").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def on_paper(digit: np.ndarray, size: tuple[int, int] = (480, 640), ramp: float = 35.0, noise: float = 3.0,
             seed: int = 0, side: int = 200, at: tuple[int, int] = (140, 220)) -> np.ndarray:
    """A 28x28 light-on-black digit as dark ink on paper lit by a ramp of `ramp` grey levels, with sensor noise."""
    rng = np.random.default_rng(seed)
    h, w = size
    paper = 235 - ramp * np.linspace(0, 1, w)[None, :] + rng.normal(0, noise, (h, w))
    ink = np.asarray(Image.fromarray(digit).resize((side, side), Image.Resampling.BICUBIC), np.float32) / 255
    y, x = at
    paper[y:y + side, x:x + side] = paper[y:y + side, x:x + side] * (1 - 0.85 * ink)
    return paper


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of two canvases."""
    return float(np.corrcoef(a.ravel().astype(float), b.ravel().astype(float))[0, 1])


def test_clean_pictures_keep_version_1_bit_for_bit(sample):
    """Every MNIST image (what training reads) and a rendered PNG take version 1's path: same canvases, so a
    clean input is answered as before and the model trains on the same data."""
    images = np.concatenate([sample.train_images[::4], sample.test_images])
    assert np.array_equal(DIGITS.canvases_from_arrays(images), DIGITS_V1.canvases_from_arrays(images))
    drawn = Image.new("L", (120, 90), 255)
    ImageDraw.Draw(drawn).line([(30, 20), (60, 70), (90, 20)], fill=0, width=7)
    buf = io.BytesIO()
    drawn.save(buf, "PNG")
    assert np.array_equal(to_canvas_v2(buf.getvalue()), to_canvas(buf.getvalue()))
    assert np.array_equal(to_canvas_v3(buf.getvalue()), to_canvas(buf.getvalue()))
    assert np.array_equal(to_canvas_v4(buf.getvalue()), to_canvas(buf.getvalue()))


PHOTO_VERSIONS = pytest.mark.parametrize("photo_canvas", [to_canvas_v2, to_canvas_v3, to_canvas_v4],
                                         ids=["v2", "v3", "v4"])


@PHOTO_VERSIONS
def test_a_lighting_ramp_is_removed_and_the_digit_found(sample, photo_canvas):
    """Version 1 crops to the ramp (the ramp is "content"); versions 2 and 3 give the digit's own canvas."""
    digit = sample.test_images[3]
    clean = to_canvas(digit)
    body = jpeg(on_paper(digit, ramp=35))
    assert similarity(to_canvas(body), clean) < 0.5
    assert similarity(photo_canvas(body), clean) > 0.85


@PHOTO_VERSIONS
def test_a_table_at_the_edge_and_a_shadow_edge_are_not_the_digit(sample, photo_canvas):
    digit = sample.test_images[7]
    clean = to_canvas(digit)
    scene = on_paper(digit, ramp=20)
    scene[:, :60] = 70  # the table beside the sheet
    scene[:, 560:] *= 0.6  # a shadow across the right of the sheet
    assert similarity(photo_canvas(jpeg(scene)), clean) > 0.85


def test_an_empty_sheet_under_uneven_light_is_blank():
    """No digit: nothing stands out of the noise, so the canvas is blank and the service answers unknown."""
    for seed in range(3):
        body = jpeg(on_paper(np.zeros((28, 28), np.uint8), ramp=50, noise=4, seed=seed), quality=60)
        assert is_blank(DIGITS.preprocess(body))


@PHOTO_VERSIONS
def test_light_strokes_on_a_dark_board_are_found(sample, photo_canvas):
    digit = sample.test_images[11]
    board = 255 - on_paper(digit, ramp=30)  # chalk on a board lit unevenly
    assert similarity(photo_canvas(jpeg(board)), to_canvas(digit)) > 0.85


@pytest.fixture(scope="module")
def exam_items(sample):
    digits, labels = sample.test_images[:160:4], sample.test_labels[:160:4]
    return digits, photo_exam(digits, labels, seed=3)


@PHOTO_VERSIONS
def test_photo_exam_items_give_the_clean_canvas_of_their_digit(exam_items, photo_canvas):
    """Items of the photo exam (tests/support/photo_set.py): most canvases match the clean one closely."""
    digits, items = exam_items
    scores = [similarity(photo_canvas(item.body), to_canvas(d)) for item, d in zip(items[:10], digits[:10])]
    assert np.median(scores) > 0.85, scores


def test_version_3_gives_a_photo_mnist_s_saturated_stroke_core(exam_items):
    """About 42% of an MNIST canvas's ink pixels are at full strength; a photographed stroke divided by its paper
    is soft throughout (version 2: under 15% on most items). Version 3 scales the ink to MNIST's share."""
    _, items = exam_items

    def saturated(canvas: np.ndarray) -> float:
        ink = canvas[canvas > 12]
        return float(np.mean(ink >= 242)) if ink.size else float("nan")

    v2 = np.nanmedian([saturated(to_canvas_v2(item.body)) for item in items])
    v3 = [saturated(to_canvas_v3(item.body)) for item in items]
    assert v2 < 0.15
    assert 0.35 <= np.nanmedian(v3) <= 0.5 and np.nanmin(v3) >= 0.3, v3


def test_version_2_is_frozen_for_the_models_built_with_it(sample):
    """Version 3 changed the photo path; version 2 models keep its old canvases. The digest is of the canvases the
    version 2 code gave before version 3 existed (commit 8ff7295), on photos with a table beside the sheet."""
    digest = hashlib.sha256()
    for i, index in enumerate((3, 7, 11)):
        scene = on_paper(sample.test_images[index], ramp=20 + 10 * i, seed=i)
        scene[:, :40 + 10 * i] = 70
        digest.update(to_canvas_v2(jpeg(scene)).tobytes())
    assert digest.hexdigest() == "c4570b8977f1bd33a62f6f12a02a0bf74261136c2cb4ebe016f193aa80416d3c"


def test_version_3_is_frozen_for_the_models_built_with_it(sample):
    """Version 4 changed the photo path; version 3 models keep its canvases. The digest is of the canvases the
    version 3 code gave before version 4 existed (commit eeb8a49), on photos with a table beside the sheet and a
    shadow across it."""
    digest = hashlib.sha256()
    for i, index in enumerate((3, 7, 11)):
        scene = on_paper(sample.test_images[index], ramp=20 + 10 * i, seed=i)
        scene[:, :40 + 10 * i] = 70
        scene[300:, :] *= 0.7
        digest.update(to_canvas_v3(jpeg(scene)).tobytes())
    assert digest.hexdigest() == "9e6c401bab1c9bdd615597c54fcce1a15cd3743b473e8d40e4f3fa15e8721511"


def test_models_are_served_with_their_version_and_unknown_versions_refused():
    assert profile_of({"preprocessing": {"profile": "digits", "version": "1"}}) is DIGITS_V1
    assert profile_of({"preprocessing": {"profile": "digits", "version": "2"}}) is DIGITS_V2
    assert profile_of({"preprocessing": {"profile": "digits", "version": "3"}}) is DIGITS_V3
    assert profile_of({"preprocessing": DIGITS.record()}) is DIGITS
    assert DIGITS.version == "4" and DIGITS.canvas is to_canvas_v4 and ("digits", "1") in SERVED
    with pytest.raises(ValueError, match="digits preprocessing version '5'.*'4', '3', '2', '1'"):
        profile_of({"preprocessing": {"profile": "digits", "version": "5"}})


def test_dataset_sized_frames_keep_version_1_whatever_their_background():
    """A 28x28 garment fills its frame (no flat background): it must stay whole, not be cut to one component."""
    rng = np.random.default_rng(0)
    shirt = np.zeros((28, 28), np.uint8)
    shirt[2:26, 3:25] = rng.integers(60, 256, (24, 22))
    assert np.array_equal(to_canvas_v2(shirt), to_canvas(shirt))
    assert np.array_equal(to_canvas_v3(shirt), to_canvas(shirt))
    assert np.array_equal(to_canvas_v4(shirt), to_canvas(shirt))
