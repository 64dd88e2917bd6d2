"""The faster preprocessing against the frozen version-1 implementation (tests/support/preprocess_v1.py).

Every input gives the tensor v1 gives, bit for bit, or the same error, except colour (YCbCr) JPEGs, which
are decoded straight to luma. For those the tolerance is pinned down exactly: the decoded gray differs from
v1's convert("L") by at most one level per pixel (where v1's decoded RGB did not clip), and the tensor is v1's
own tensor of that gray image; on photos of digits the answers are v1's.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
from support.hostile import Assets, build_corpus
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw
from support.drawn_images import ALPHA_CASES, CASES, draw_seven, encode, in_mode, lab_tiff, png_with_size
from support.photos import REQUEST_SCALE, photo_jpeg
from support import preprocess_v1 as v1

from serving.samples import user_digit_png
from handler import preprocessing

#: Version 1 of the digits profile as the handler implements it today (it serves models built with version 1).
fast = SimpleNamespace(preprocess=preprocessing.DIGITS_V1.preprocess,
                       canvases_from_arrays=preprocessing.DIGITS_V1.canvases_from_arrays,
                       to_canvas=preprocessing.to_canvas, decode_image=preprocessing.decode_image,
                       InvalidImageError=preprocessing.InvalidImageError)


def outcome(module, data) -> tuple[str, object]:
    """("ok", tensor) or ("error", (class name, status, message)) of one implementation."""
    try:
        return "ok", module.preprocess(data)
    except module.InvalidImageError as exc:
        return "error", (type(exc).__name__, exc.status, str(exc))


def assert_same(data) -> None:
    old, new = outcome(v1, data), outcome(fast, data)
    assert old[0] == new[0], (old, new)
    if old[0] == "ok":
        assert new[1].dtype == old[1].dtype and new[1].shape == old[1].shape
        np.testing.assert_array_equal(new[1], old[1])
    else:
        assert new[1] == old[1]


def is_colour_jpeg(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.format == "JPEG" and img.mode == "RGB"
    except Exception:
        return False


def luma(data: bytes) -> Image.Image:
    """A colour JPEG decoded the way today's preprocessing decodes it: luma only, EXIF applied."""
    return fast.decode_image(data)


def assert_within_tolerance(data: bytes) -> None:
    """Colour JPEG: gray within one level of v1's wherever v1's decoded RGB did not clip (where it clipped, Y is
    the luma of the unclipped colour), and exactly v1's tensor of that gray."""
    assert is_colour_jpeg(data)
    rgb = v1.decode_image(data)
    gray = np.asarray(luma(data), dtype=np.int16)
    difference = np.abs(gray - np.asarray(rgb.convert("L"), dtype=np.int16))
    clipped = np.isin(np.asarray(rgb), (0, 255)).any(axis=2)
    assert difference[~clipped].max(initial=0) <= 1
    np.testing.assert_array_equal(fast.preprocess(data), v1.preprocess(luma(data)))


EXACT_CASES = [case for case in CASES if case[:2] != ("RGB", "JPEG")]


@pytest.mark.parametrize(("mode", "fmt", "_"), EXACT_CASES, ids=[f"{m}-{f}" for m, f, _ in EXACT_CASES])
def test_every_format_and_mode_gives_v1s_tensor(mode, fmt, _):
    assert_same(encode(in_mode(mode), fmt))


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "P", "LA", "CMYK", "I;16", "1", "I", "F", "YCbCr"])
def test_pil_images_of_every_mode_give_v1s_tensor(mode):
    img = in_mode(mode) if mode != "YCbCr" else draw_seven(mode="RGB").convert("YCbCr")
    np.testing.assert_array_equal(fast.preprocess(img), v1.preprocess(img))


@pytest.mark.parametrize("case", list(ALPHA_CASES))
def test_alpha_gives_v1s_tensor(case):
    mode, ink, paper = ALPHA_CASES[case]
    assert_same(encode(draw_seven(mode=mode, ink=ink, paper=paper)))


def test_palette_transparency_gives_v1s_tensor():
    img = draw_seven(mode="P", ink=1, paper=0)
    img.putpalette([0, 0, 0] * 256)
    for fmt in ("PNG", "GIF"):
        assert_same(encode(img, fmt, transparency=0))


def with_orientation(img: Image.Image, fmt: str, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(img, fmt, exif=exif)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "TIFF"])
def test_every_exif_orientation_gives_v1s_tensor(fmt, orientation):
    seven = draw_seven(size=(64, 48))  # not square, so a missed rotation changes the tensor
    assert_same(with_orientation(seven, fmt, orientation))
    if fmt in ("JPEG", "WEBP"):  # colour: a JPEG within the luma tolerance, a WebP exactly
        data = with_orientation(draw_seven(size=(64, 48), mode="RGB", ink=(20, 30, 120)), fmt, orientation)
        (assert_within_tolerance if fmt == "JPEG" else assert_same)(data)


def test_malformed_exif_is_ignored_as_before():
    data = bytearray(with_orientation(draw_seven(), "JPEG", 6))
    start = data.find(b"Exif\x00\x00")
    data[start + 6 : start + 14] = b"XX\x00*\xff\xff\xff\xff"  # unknown byte order, offset past the end
    assert_same(bytes(data))


def test_training_path_gives_v1s_canvases_for_the_whole_mnist_sample():
    from training.data.sample import load_mnist_sample

    sample = load_mnist_sample()
    for images in (sample.train_images, sample.test_images):
        np.testing.assert_array_equal(fast.canvases_from_arrays(images), v1.canvases_from_arrays(images))


def test_enlarged_png_request_bodies_give_v1s_tensors():
    from training.data.sample import load_mnist_sample

    for image in load_mnist_sample().test_images[:300]:
        assert_same(user_digit_png(image, REQUEST_SCALE))


@pytest.mark.parametrize("polarity", ["dark-on-light", "light-on-dark"])
def test_every_level_against_the_ink_threshold_gives_v1s_tensor(polarity):
    """One stroke at each of the 256 levels beside a full-range pair: the threshold and stretch tables at
    every level, including levels whose stretched value is exactly the threshold (51/255 = 0.2)."""
    for level in range(256):
        canvas = np.zeros((24, 30), np.uint8)
        canvas[0, 0], canvas[-1, -1] = 0, 255
        canvas[5:15, 8:11] = level
        canvas[18, 20:26] = 255 - level
        image = canvas if polarity == "light-on-dark" else 255 - canvas
        np.testing.assert_array_equal(fast.to_canvas(image), v1.to_canvas(image))
        assert_same(encode(Image.fromarray(image)))


def test_border_median_exactly_at_the_middle_gives_v1s_tensor():
    for lo, hi in ((0, 255), (10, 11), (100, 101), (0, 1), (7, 200)):
        image = np.full((20, 20), lo, np.uint8)
        image[:, 10:] = hi  # the border is half lo, half hi: its median is exactly 0.5 after stretching
        image[8:12, 3:6] = hi
        np.testing.assert_array_equal(fast.to_canvas(image), v1.to_canvas(image))
        np.testing.assert_array_equal(fast.to_canvas(image.T.copy()), v1.to_canvas(image.T.copy()))


@pytest.mark.parametrize(
    "array",
    [np.zeros((28, 28, 3), np.uint8), np.zeros(28, np.uint8), np.zeros((0, 5), np.uint8), np.full((3, 3), np.nan),
     np.arange(30.0).reshape(5, 6), (np.arange(30) % 2).astype(bool).reshape(5, 6), np.arange(30).reshape(5, 6)],
    ids=["3-d", "1-d", "empty", "nan", "float", "bool", "int64"])
def test_arrays_of_every_kind_give_v1s_answer(array):
    assert_same(array)


def test_hostile_corpus_bodies_and_images_give_v1s_answers(prepared_sample):
    seven = prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == 7)[0])]
    one = prepared_sample.test_images[int(np.flatnonzero(prepared_sample.test_labels == 1)[0])]
    for item in build_corpus(Assets(seven, one)):
        for data in (item.body, item.image):
            if data is not None and len(data) < 2_000_000:
                (assert_within_tolerance if is_colour_jpeg(data) else assert_same)(data)


def test_undecodable_and_oversized_inputs_raise_v1s_errors():
    jpeg = encode(draw_seven(mode="RGB"), "JPEG")
    for data in (b"", b"\xff\xd8\xff", jpeg[: len(jpeg) // 2], jpeg[:200], png_with_size(30000, 30000), lab_tiff()):
        assert_same(data)


SEEDS = [encode(draw_seven(size=(16, 16), scale=0.25).convert(mode), fmt)
         for fmt in ("PNG", "JPEG", "BMP", "GIF", "WEBP") for mode in ("L", "RGB")]


@settings(max_examples=400, deadline=None, database=None)
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
       st.integers(0, 10_000))
def test_corrupted_images_give_v1s_answer(seed, flips, cut):
    data = bytearray(seed)
    for position, value in flips:
        data[position % len(data)] = value
    data = bytes(data[: max(1, cut % (len(data) + 1))])
    old, new = outcome(v1, data), outcome(fast, data)
    assert old[0] == new[0], (old, new)  # luma-only decoding fails exactly where the colour decode failed
    if old[0] == "error":
        assert new[1] == old[1]
    elif is_colour_jpeg(data):
        assert_within_tolerance(data)
    else:
        np.testing.assert_array_equal(new[1], old[1])


CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4, "P": 1, "LA": 2}


@st.composite
def random_images(draw) -> Image.Image:
    mode = draw(st.sampled_from(sorted(CHANNELS)))
    width, height = draw(st.integers(1, 80)), draw(st.integers(1, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["noise", "uniform", "two-level", "drawn"]))
    n = width * height * CHANNELS[mode]
    if kind == "noise":
        raw = rng.bytes(n)
    elif kind == "uniform":
        raw = bytes([draw(st.integers(0, 255))]) * n
    else:
        a, b = draw(st.integers(0, 255)), draw(st.integers(0, 255))
        mask = rng.random((height, width)) < 0.3 if kind == "two-level" else np.zeros((height, width), bool)
        if kind == "drawn":
            sketch = Image.new("L", (width, height), 0)
            ImageDraw.Draw(sketch).line([tuple(rng.integers(0, max(width, height), 2)) for _ in range(3)], fill=1,
                                        width=int(rng.integers(1, 6)))
            mask = np.asarray(sketch, bool)
        levels = np.where(mask, a, b).astype(np.uint8)
        raw = np.repeat(levels[..., None], CHANNELS[mode], axis=2).tobytes()
    img = Image.frombytes(mode, (width, height), raw)
    if mode == "P":
        img.putpalette(rng.bytes(768))
        if draw(st.booleans()):
            img.info["transparency"] = int(rng.integers(0, 256))
    return img


@settings(max_examples=300, deadline=None, database=None)
@given(random_images(), st.sampled_from(["image", "PNG", "TIFF", "BMP", "GIF", "WEBP-lossless", "JPEG-L", "array"]))
def test_random_images_give_v1s_tensor(img, how):
    if how == "image":
        data = img
    elif how == "array":
        data = np.asarray(img.convert("L"))
    elif how == "JPEG-L":
        data = encode(img.convert("L"), "JPEG")
    elif how == "WEBP-lossless":
        data = encode(img.convert("RGBA" if "A" in img.mode else "RGB"), "WEBP", lossless=True)
    elif how == "BMP" and img.mode == "LA":
        data = encode(img.convert("L"), how)
    else:
        data = encode(img, how)
    assert_same(data)


@pytest.fixture(scope="module")
def photos() -> tuple[list[bytes], np.ndarray]:
    """JPEG photos of 200 held-out digits (support.photos.photo_jpeg), with their labels."""
    from training.data.sample import load_mnist_sample

    sample = load_mnist_sample()
    rng = np.random.default_rng(7)
    return [photo_jpeg(img, rng) for img in sample.test_images[:200]], sample.test_labels[:200]


def test_colour_jpeg_photos_are_within_the_luma_tolerance(photos):
    bodies, _ = photos
    identical = 0
    for data in bodies:
        assert_within_tolerance(data)
        identical += bool(np.array_equal(fast.preprocess(data), v1.preprocess(data)))
    assert identical >= 0.85 * len(bodies)  # measured: 94% (a one-level change rarely moves the crop)


def test_colour_jpeg_photos_get_v1s_answers(tiny_artifacts, photos):
    from handler.service import EmbeddingService

    service = EmbeddingService.from_dir(tiny_artifacts)
    bodies, labels = photos
    answers = {}
    for name, module in (("v1", v1), ("fast", fast)):
        batch = np.stack([module.preprocess(data) for data in bodies])
        answers[name] = [a["pred"] for a in service.searcher.classify(service.embed(batch))]
    changed = sum(a != b for a, b in zip(answers["v1"], answers["fast"]))
    assert changed <= 0.02 * len(bodies)
    accuracy = {name: np.mean([p == str(y) for p, y in zip(found, labels)]) for name, found in answers.items()}
    assert abs(accuracy["fast"] - accuracy["v1"]) <= 0.02, accuracy
