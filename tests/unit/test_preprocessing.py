"""The shared image -> model-input contract (handler/preprocessing.py; decoding in handler/decoding.py, the canvas
in handler/canvas.py) on images drawn here with Pillow, and today's faster implementation of digits version 1
against the frozen version-1 implementation (tests/support/preprocess_v1.py).

The faster one gives every input the tensor v1 gives, bit for bit, or the same error, except colour (YCbCr) JPEGs,
which are decoded straight to luma. For those the tolerance is pinned down exactly: the decoded gray differs from
v1's convert("L") by at most one level per pixel (where v1's decoded RGB did not clip), and the tensor is v1's own
tensor of that gray image; on photos of digits the answers are v1's.

Photos and scans (digits versions 2 to 4, handler/photo.py and handler/paper.py): test_photo_preprocessing.py.
"""

from __future__ import annotations

import io
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw, ImageFile

from support import preprocess_v1 as v1
from support.drawn_images import ALPHA_CASES, CASES, draw_seven, encode, in_mode, lab_tiff, png_with_size
from support.hostile import Assets, build_corpus
from support.photos import REQUEST_SCALE, photo_jpeg

from handler import preprocessing
from handler.preprocessing import (
    BOX,
    CANVAS,
    DEFAULT_MAX_PIXELS,
    MEAN,
    STD,
    ImageTooLargeError,
    InvalidImageError,
    canvases_from_arrays,
    decode_image,
    normalize,
    preprocess,
    to_canvas,
)
from serving.samples import user_digit_png

CENTRE = (CANVAS - 1) / 2


def opened_mode(data: bytes) -> str:
    return Image.open(io.BytesIO(data)).mode


def assert_model_input(x: np.ndarray) -> None:
    assert x.dtype == np.float32
    assert x.shape == (1, CANVAS, CANVAS)
    assert np.isfinite(x).all()


def assert_mnist_canvas(canvas: np.ndarray) -> None:
    """uint8 28x28, light strokes on a black background: dark border, bright maximum."""
    assert canvas.dtype == np.uint8
    assert canvas.shape == (CANVAS, CANVAS)
    border = np.concatenate([canvas[0], canvas[-1], canvas[:, 0], canvas[:, -1]])
    assert border.max() <= 5, border
    assert canvas.max() >= 220  # lossy codecs leave isolated extreme pixels that the 20x20 fit averages down
    assert np.median(canvas) == 0  # most of the canvas is background


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.astype(np.float64).ravel(), b.astype(np.float64).ravel())[0, 1])


def centre_of_mass(canvas: np.ndarray) -> tuple[float, float]:
    c = canvas.astype(np.float64)
    idx = np.arange(c.shape[0])
    return float((c.sum(axis=1) * idx).sum() / c.sum()), float((c.sum(axis=0) * idx).sum() / c.sum())


def bounding_box(canvas: np.ndarray) -> tuple[int, int]:
    rows = np.flatnonzero(canvas.any(axis=1))
    cols = np.flatnonzero(canvas.any(axis=0))
    return int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)


def bmp_with_size(width: int, height: int) -> bytes:
    """A real 4x4 BMP whose BITMAPINFOHEADER is patched to claim width x height."""
    bmp = bytearray(encode(Image.new("L", (4, 4), 0), "BMP"))
    bmp[18:26] = struct.pack("<ii", width, height)
    return bytes(bmp)


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    """The canvas of the plain black-on-white "7" every other rendering is compared with."""
    canvas = to_canvas(encode(draw_seven()))
    assert_mnist_canvas(canvas)
    return canvas


@pytest.mark.parametrize(("mode", "fmt", "expected_mode"), CASES, ids=[f"{m}-{f}" for m, f, _ in CASES])
def test_every_format_and_mode_gives_the_reference_digit(reference, mode, fmt, expected_mode):
    data = encode(in_mode(mode), fmt)
    assert opened_mode(data) == expected_mode  # the decoder really hands this mode to the preprocessing
    assert_model_input(preprocess(data))
    canvas = to_canvas(data)
    assert_mnist_canvas(canvas)
    assert correlation(canvas, reference) > 0.95


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "P", "LA", "CMYK", "I;16", "1", "I", "F"])
def test_pil_image_input_matches_the_same_image_sent_as_bytes(reference, mode):
    img = in_mode(mode)
    assert_model_input(preprocess(img))
    canvas = to_canvas(img)
    assert_mnist_canvas(canvas)
    assert correlation(canvas, reference) > 0.95
    np.testing.assert_array_equal(canvas, to_canvas(encode(img, "TIFF")))  # TIFF stores every one of these modes


@pytest.mark.parametrize("case", list(ALPHA_CASES))
def test_alpha_is_composited_onto_the_colour_that_contrasts_with_the_ink(reference, case):
    mode, ink, paper = ALPHA_CASES[case]
    data = encode(draw_seven(mode=mode, ink=ink, paper=paper))
    assert opened_mode(data) == mode
    canvas = to_canvas(data)
    assert_mnist_canvas(canvas)
    assert np.abs(canvas.astype(int) - reference).max() <= 1


def palette_seven_with_transparent_background() -> Image.Image:
    """Palette image: index 0 (black, transparent) is the background, index 1 (also black) the ink."""
    img = draw_seven(mode="P", ink=1, paper=0)
    img.putpalette([0, 0, 0] * 256)
    return img


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_palette_transparency_hides_a_background_of_the_ink_colour(reference, fmt):
    img = palette_seven_with_transparent_background()
    data = encode(img, fmt, transparency=0)
    opened = Image.open(io.BytesIO(data))
    assert opened.mode == "P" and opened.info.get("transparency") == 0
    canvas = to_canvas(data)
    assert_mnist_canvas(canvas)
    assert np.abs(canvas.astype(int) - reference).max() <= 1
    img.info["transparency"] = 0
    np.testing.assert_array_equal(to_canvas(img), canvas)


@pytest.mark.parametrize(
    ("ink", "paper"),
    [(255, 0), (100, 140), (140, 100)],
    ids=["white-on-black", "dark-grey-on-grey", "light-grey-on-grey"],
)
def test_polarity_and_contrast_do_not_change_the_canvas(reference, ink, paper):
    canvas = to_canvas(encode(draw_seven(ink=ink, paper=paper)))
    assert np.abs(canvas.astype(int) - reference).max() <= 1


def test_off_centre_digit_is_fitted_into_the_20px_box_and_centred_by_mass():
    img = draw_seven(size=(200, 120), mode="RGBA", ink=(0, 0, 0, 255), paper=(255, 255, 255, 255),
                     origin=(140, 70), scale=0.75)
    canvas = to_canvas(encode(img))
    assert_mnist_canvas(canvas)
    cy, cx = centre_of_mass(canvas)
    assert abs(cy - CENTRE) <= 1 and abs(cx - CENTRE) <= 1, (cy, cx)
    assert max(bounding_box(canvas)) == BOX


@pytest.mark.parametrize("size", [(1, 10000), (10000, 1)], ids=["1x10000", "10000x1"])
def test_extreme_aspect_ratio_line_becomes_a_20px_line(size):
    img = Image.new("L", size, 255)
    ImageDraw.Draw(img).line([(0, 4000), (0, 6000)] if size[0] == 1 else [(4000, 0), (6000, 0)], fill=0)
    canvas = to_canvas(encode(img))
    assert canvas.dtype == np.uint8 and canvas.shape == (CANVAS, CANVAS)
    assert sorted(bounding_box(canvas)) == [1, BOX]
    assert_model_input(preprocess(encode(img)))


BLANK_IMAGES = {
    "white": lambda: Image.new("L", (40, 30), 255),
    "black": lambda: Image.new("L", (40, 30), 0),
    "grey-rgb": lambda: Image.new("RGB", (30, 40), (90, 120, 200)),
    "transparent": lambda: Image.new("RGBA", (32, 32), (0, 0, 0, 0)),
    "1x1": lambda: Image.new("L", (1, 1), 17),
}


@pytest.mark.parametrize("name", list(BLANK_IMAGES))
def test_uniform_image_gives_an_all_zero_canvas(name):
    data = encode(BLANK_IMAGES[name]())
    np.testing.assert_array_equal(to_canvas(data), np.zeros((CANVAS, CANVAS), np.uint8))
    np.testing.assert_allclose(preprocess(data), np.full((1, CANVAS, CANVAS), -MEAN / STD, np.float32), rtol=1e-6)


def invalid_inputs() -> dict[str, tuple[bytes, str]]:
    png = encode(draw_seven())
    jpeg = encode(draw_seven(), "JPEG")
    return {
        "empty": (b"", "empty"),
        "random": (np.random.default_rng(0).bytes(500), "not an image"),
        "text": (b"hello, I am not a picture\n", "not an image"),
        "truncated-png": (png[: len(png) // 2], "truncated"),
        "truncated-jpeg": (jpeg[: len(jpeg) // 2], "truncated"),
    }


@pytest.mark.parametrize("name", list(invalid_inputs()))
def test_undecodable_input_raises_invalid_image_error_400(name):
    data, fragment = invalid_inputs()[name]
    with pytest.raises(InvalidImageError) as excinfo:
        preprocess(data)
    assert type(excinfo.value) is InvalidImageError
    assert excinfo.value.status == 400
    assert fragment in str(excinfo.value).lower()


@pytest.fixture
def pixel_loads(monkeypatch) -> list[str]:
    """Records every decode of pixel data by a Pillow file plugin."""
    calls: list[str] = []
    original = ImageFile.ImageFile.load

    def spy(self):
        calls.append(self.format)
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    return calls


@pytest.mark.parametrize(
    ("data", "pixels"),
    [
        (png_with_size(30000, 30000), "900000000"),
        (bmp_with_size(30000, 30000), "900000000"),
        (png_with_size(5000, 5000), "25000000"),
        (png_with_size(4000, DEFAULT_MAX_PIXELS // 4000 + 1), str(4000 * (DEFAULT_MAX_PIXELS // 4000 + 1))),
    ],
    ids=["png-30000x30000", "bmp-30000x30000", "png-5000x5000", "png-just-over-default"],
)
def test_oversized_header_raises_413_before_decoding_pixels(pixel_loads, data, pixels):
    with pytest.raises(ImageTooLargeError) as excinfo:
        preprocess(data)
    assert excinfo.value.status == 413
    assert pixels in str(excinfo.value)
    assert pixel_loads == []
    decode_image(encode(draw_seven()))
    assert set(pixel_loads) == {"PNG"}  # the spy does see a real decode


def test_max_pixels_limit_is_inclusive_and_configurable():
    data = encode(draw_seven(size=(100, 50)))
    assert_model_input(preprocess(data, max_pixels=5000))
    with pytest.raises(ImageTooLargeError, match="5000 pixels exceeds the limit of 4999"):
        preprocess(data, max_pixels=4999)


@pytest.fixture(scope="module")
def mnist_digits() -> tuple[np.ndarray, np.ndarray]:
    """Two real MNIST test digits of each class, raw uint8 28x28."""
    from training.data.sample import load_mnist_sample

    ds = load_mnist_sample()
    picks = np.concatenate([np.flatnonzero(ds.test_labels == d)[:2] for d in range(10)])
    return ds.test_images[picks], ds.test_labels[picks]


def test_served_png_equals_the_training_tensor_for_real_mnist_digits(mnist_digits):
    images, _ = mnist_digits
    for image in images:
        png = encode(Image.fromarray(image))
        expected = normalize(canvases_from_arrays(image[None]))[0]
        served = preprocess(png)
        assert served.dtype == expected.dtype
        np.testing.assert_array_equal(served, expected)


def test_training_canvases_are_mnist_canvases(mnist_digits):
    images, _ = mnist_digits
    canvases = canvases_from_arrays(images)
    assert canvases.shape == (len(images), CANVAS, CANVAS) and canvases.dtype == np.uint8
    for canvas in canvases:
        assert max(bounding_box(canvas)) == BOX
        cy, cx = centre_of_mass(canvas)
        assert abs(cy - CENTRE) <= 1 and abs(cx - CENTRE) <= 1


def test_empty_batch_of_arrays_gives_empty_canvases():
    out = canvases_from_arrays(np.zeros((0, 28, 28), np.uint8))
    assert out.shape == (0, CANVAS, CANVAS) and out.dtype == np.uint8


@pytest.mark.parametrize(
    "array",
    [np.zeros((28, 28, 3)), np.zeros(28), np.full((28, 28), np.nan), np.full((28, 28), np.inf)],
    ids=["3-d", "1-d", "nan", "inf"],
)
def test_array_that_is_not_a_finite_2d_image_is_invalid(array):
    with pytest.raises(InvalidImageError):
        to_canvas(array)


def test_empty_2d_array_is_invalid():
    with pytest.raises(InvalidImageError):
        to_canvas(np.zeros((0, 5), np.uint8))


def test_normalize_applies_the_mnist_statistics():
    canvases = np.stack([np.zeros((CANVAS, CANVAS), np.uint8), np.full((CANVAS, CANVAS), 255, np.uint8)])
    x = normalize(canvases)
    assert x.shape == (2, 1, CANVAS, CANVAS) and x.dtype == np.float32
    np.testing.assert_allclose(x[0], -MEAN / STD, rtol=1e-6)
    np.testing.assert_allclose(x[1], (1 - MEAN) / STD, rtol=1e-6)


def test_cielab_tiff_is_refused_as_an_invalid_image_not_a_crash():
    data = lab_tiff()
    assert opened_mode(data) == "LAB"
    with pytest.raises(InvalidImageError, match="unsupported image mode LAB"):
        preprocess(data)


def test_exif_orientation_is_applied_before_preprocessing(reference):
    sideways = draw_seven().transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6  # viewer rotates 90 degrees clockwise, giving the upright digit back
    canvas = to_canvas(encode(sideways, "JPEG", exif=exif, quality=95))
    assert correlation(canvas, reference) > 0.95


def seed_images() -> list[bytes]:
    """Small valid images in every non-TIFF format, the starting points of the corruption fuzzer."""
    img = draw_seven(size=(16, 16), scale=0.25)
    return [encode(img.convert(mode), fmt) for fmt in ("PNG", "JPEG", "BMP", "GIF", "WEBP") for mode in ("L", "RGB")]


SEEDS = seed_images()


@st.composite
def corrupted_images(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 6))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


def assert_valid_or_invalid_image_error(data: bytes) -> None:
    try:
        out = preprocess(data)
    except InvalidImageError as exc:
        assert str(exc)
        return
    assert_model_input(out)


@settings(max_examples=150, deadline=None, database=None)
@given(st.binary(max_size=512) | st.sampled_from([b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"BM", b"GIF89a"]).flatmap(
    lambda magic: st.binary(max_size=256).map(lambda tail: magic + tail)))
def test_random_bytes_raise_only_invalid_image_error(data):
    assert_valid_or_invalid_image_error(data)


@settings(max_examples=150, deadline=None, database=None)
@given(corrupted_images())
def test_corrupted_images_raise_only_invalid_image_error(data):
    assert_valid_or_invalid_image_error(data)


CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4, "P": 1}


@st.composite
def random_images(draw) -> Image.Image:
    mode = draw(st.sampled_from(sorted(CHANNELS)))
    width, height = draw(st.integers(1, 64)), draw(st.integers(1, 64))
    n = width * height * CHANNELS[mode]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        raw = rng.bytes(n)
    else:
        raw = bytes([draw(st.integers(0, 255))]) * n  # uniform images too
    img = Image.frombytes(mode, (width, height), raw)
    if mode == "P":
        img.putpalette(rng.bytes(768))
    return img


@settings(max_examples=80, deadline=None, database=None)
@given(random_images(), st.booleans())
def test_random_valid_images_always_give_a_finite_model_input(img, as_bytes):
    assert_model_input(preprocess(encode(img) if as_bytes else img))


# --- today's digits version 1 against the frozen v1 (tests/support/preprocess_v1.py) -----------------------------

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


# SEEDS: the same small valid images the contract's corruption fuzzer starts from (seed_images, above).
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


VARIED_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4, "P": 1, "LA": 2}


@st.composite
def varied_images(draw) -> Image.Image:
    mode = draw(st.sampled_from(sorted(VARIED_CHANNELS)))
    width, height = draw(st.integers(1, 80)), draw(st.integers(1, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["noise", "uniform", "two-level", "drawn"]))
    n = width * height * VARIED_CHANNELS[mode]
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
        raw = np.repeat(levels[..., None], VARIED_CHANNELS[mode], axis=2).tobytes()
    img = Image.frombytes(mode, (width, height), raw)
    if mode == "P":
        img.putpalette(rng.bytes(768))
        if draw(st.booleans()):
            img.info["transparency"] = int(rng.integers(0, 256))
    return img


@settings(max_examples=300, deadline=None, database=None)
@given(varied_images(), st.sampled_from(["image", "PNG", "TIFF", "BMP", "GIF", "WEBP-lossless", "JPEG-L", "array"]))
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
