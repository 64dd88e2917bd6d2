"""Digits preprocessing version 4 (handler/paper.py, photo.V4): the paper and the light on it are found first, so a
sheet's edge with a desk beyond it and a shadow's boundary across the sheet never read as ink; the digit is the ink
on the paper. Where version 3 fails a case, the test shows it on the same scene."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from support.photo_set import SCENES, phone_exam

from handler import paper, photo
from handler.preprocessing import to_canvas, to_canvas_v3, to_canvas_v4
from training import negatives, printed
from training.data import load_dataset


@pytest.fixture(scope="module")
def sample():
    return load_dataset("mnist-sample")


def jpeg(gray: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.clip(gray, 0, 255).astype(np.uint8), "L").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.ravel().astype(float), b.ravel().astype(float))[0, 1])


def sheet(digit: np.ndarray, at: tuple[int, int], side: int = 150, seed: int = 0) -> np.ndarray:
    """A 480x640 sheet of paper (light 235, noise) with the digit written in dark ink, its box at ``at``."""
    rng = np.random.default_rng(seed)
    page = 235 + rng.normal(0, 3, (480, 640))
    ink = np.asarray(Image.fromarray(digit).resize((side, side), Image.Resampling.BICUBIC), np.float32) / 255
    y, x = at
    page[y:y + side, x:x + side] *= 1 - 0.85 * ink
    return page


def bent_shadow(through: tuple[float, float], depth: float = 0.5, bend: float = 0.4) -> np.ndarray:
    """Multiplicative light of a shadow whose bent, soft boundary passes through ``through`` (x, y)."""
    yy, xx = np.mgrid[0:480, 0:640].astype(np.float32)
    across = (yy - through[1]) - bend * (xx - through[0]) ** 2 / 640
    return 1 - depth * 0.5 * (1 + np.tanh(across / 4))


def test_a_bent_shadow_boundary_is_no_ink_and_the_digit_on_it_is_read(sample):
    digit = sample.test_images[7]
    clean = to_canvas(digit)
    scene = sheet(digit, (120, 250)) * bent_shadow((325, 200))  # the boundary runs across the digit
    assert similarity(to_canvas_v4(jpeg(scene)), clean) > 0.8
    assert similarity(to_canvas_v3(jpeg(scene)), clean) < similarity(to_canvas_v4(jpeg(scene)), clean)
    work = photo._work_image(scene.astype(np.float32))
    ink = photo.ink_map(work, surfaces=True)
    strokes = photo._work_image(sheet(digit, (120, 250)).astype(np.float32)) < 150
    assert ink[~ndilate(strokes)].max() < 0.15  # nothing but the strokes reads as ink, the boundary included
    assert np.median(ink[strokes]) > 0.5


def ndilate(mask: np.ndarray, by: int = 4) -> np.ndarray:
    from scipy import ndimage

    return ndimage.binary_dilation(mask, iterations=by)


def turned_sheet_on_a_desk(digit: np.ndarray, turn: float, desk: int = 60) -> np.ndarray:
    """The sheet turned by ``turn`` degrees about the frame's centre on a desk, so its corners leave the frame
    and the desk shows in wedges."""
    page = Image.fromarray(np.clip(sheet(digit, (165, 245)), 0, 255).astype(np.uint8), "L")
    mask = Image.new("L", (640, 480), 255).resize((560, 420))
    framed = Image.new("L", (640, 480), 0)
    framed.paste(mask, (40, 30))
    turned = page.rotate(turn, Image.Resampling.BILINEAR)
    inside = np.asarray(framed.rotate(turn, Image.Resampling.BILINEAR), np.float32) / 255
    return np.asarray(turned, np.float32) * inside + desk * (1 - inside)


@pytest.mark.parametrize("turn", [25, -35])
def test_the_desk_beyond_a_turned_sheet_is_not_the_digit(sample, turn):
    digit = sample.test_images[11]
    body = jpeg(turned_sheet_on_a_desk(digit, turn) * bent_shadow((100, 420), 0.3, -0.8))
    clean = to_canvas(np.asarray(Image.fromarray(digit).rotate(turn, Image.Resampling.BILINEAR)))
    assert similarity(to_canvas_v4(body), clean) > 0.8


def test_the_paper_is_found_light_when_a_shadow_covers_the_frame_s_centre(sample):
    """Version 3 reads the polarity from the frame's centre; a deep shadow there made it a dark board."""
    scene = sheet(sample.test_images[3], (60, 420), side=120) * (1 - 0.55 * (np.arange(640) < 400))[None, :]
    work = photo._work_image(scene.astype(np.float32))
    assert paper.paper_is_light(work, photo.window(work.shape)) and not photo._light_background(work)
    assert not paper.paper_is_light(255 - work, photo.window(work.shape))  # chalk on a board stays a board


def test_reconstruction_fills_strokes_and_keeps_a_narrow_wedge_of_a_wide_region():
    image = np.full((60, 80), 200.0, np.float32)
    image[10:12, 10:40] = 40  # a stroke, narrower than the window
    image[:, 60:] = 90  # a wide dark region...
    for row in range(30):
        image[row, 60 - (30 - row) // 2 : 60] = 90  # ...with a wedge narrower than the window
    rebuilt = paper.reconstructed(image, 9)
    assert np.all(rebuilt[10:12, 10:40] == 200)  # the stroke is filled with the paper around it
    assert np.array_equal(rebuilt[:, 45:], image[:, 45:])  # the region and its wedge are kept whole


def test_the_training_inputs_are_the_same_in_versions_3_and_4(sample):
    """Every image training reads is a dataset-sized picture: the sample's 28x28 digits, and the outlier-exposure
    negatives and printed digits drawn at 56x56 before the profile's canvas. Version 4 gives such a frame version
    1's canvas as version 3 does, whatever it holds, so a model retrained with version 4 learns from the same
    tensors (and answers clean pictures the same)."""
    assert max(negatives.SIZE, printed.SIZE) <= photo.SMALL_FRAME
    images = np.concatenate([sample.train_images[::8], sample.test_images[::8]])
    assert all(np.array_equal(to_canvas_v4(img), to_canvas_v3(img)) for img in images)
    rng = np.random.default_rng(0)
    for _ in range(20):  # noise, grain and light in a 56x56 frame: still version 1's path
        frame = rng.normal(128, 40, (56, 56)) + np.linspace(0, 60, 56)[None, :]
        frame = np.clip(frame, 0, 255).astype(np.uint8)
        assert np.array_equal(to_canvas_v4(frame), to_canvas(frame))


def test_the_phone_exam_holds_every_scene_with_its_conditions(sample):
    """tests/support/photo_set.py's phone exam: classic photos and scans, then each scene, handwritten and printed."""
    digits, labels = sample.test_images[:12], sample.test_labels[:12]
    items = phone_exam(digits, labels, seed=2)
    assert [item.label for item in items] == labels.tolist()
    assert {item.scene for item in items} == {"classic", *SCENES}
    assert {item.source for item in items} == {"handwriting", "font"}
    for item in items:
        assert Image.open(io.BytesIO(item.body)).format in ("JPEG", "PNG")
        assert (item.geometry != "full") == (item.beyond != "none") == ("edge" in item.scene)
    assert phone_exam(digits[:3], labels[:3], seed=2) == items[:3]
