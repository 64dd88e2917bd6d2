"""The uploads exam (training/uploads.py): deterministic, every category present, real encoded files, no digit
look-alikes, scored on the served path, and made of nothing outlier exposure (training/negatives.py) reads."""

from __future__ import annotations

import builtins
import io
import string
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFont

import training.negatives as negatives
import training.uploads as uploads
from handler.preprocessing import DIGITS, decode_image
from handler.service import EmbeddingService
from training.evaluate import OOD_SETS, load_ood_set, model_inputs, open_set_scores
from training.negatives import synthetic_negatives, training_sources
from training.uploads import CATEGORIES, DIGIT_LIKE, LETTERS, ExamSourceError, exam_sources, exam_uploads

SMALL = 0.08  # share of the full exam the quick tests generate (every category still has items)


@pytest.fixture(scope="module")
def small_exam() -> list[uploads.Upload]:
    return exam_uploads(scale=SMALL)


def test_the_exam_is_deterministic_and_the_seed_matters(small_exam):
    assert exam_uploads(scale=SMALL) == small_exam
    other = exam_uploads(seed=1, scale=SMALL)
    assert [u.category for u in other] == [u.category for u in small_exam]
    assert sum(a.data != b.data for a, b in zip(other, small_exam)) > len(small_exam) // 2


def test_every_category_is_present_with_its_share(small_exam):
    counts = {category: sum(u.category == category for u in small_exam) for category in CATEGORIES}
    assert counts == {category: max(1, round(n * SMALL)) for category, (_, n) in CATEGORIES.items()}
    assert 500 <= sum(n for _, n in CATEGORIES.values()) <= 1500


def test_items_are_png_or_jpeg_files_of_their_upload_size(small_exam):
    sizes = set()
    for upload in small_exam:
        image = decode_image(upload.data)
        assert image.format in ("PNG", "JPEG"), upload.source
        sizes.add(image.size)
    assert len(sizes) > len(small_exam) // 2  # sizes as uploaded, not one canonical frame
    assert any(max(size) >= 300 for size in sizes) and any(max(size) <= 32 for size in sizes)


def test_no_single_glyph_looks_like_a_digit(small_exam):
    brief = set("OoQDIlijJZzSsbGTLBgqPyAhY") | set(string.digits)
    assert brief <= DIGIT_LIKE
    assert not set(LETTERS) & DIGIT_LIKE
    for upload in small_exam:
        if upload.category in ("letters", "ui-glyphs", "emoji"):
            assert len(upload.text) == 1 and upload.text not in DIGIT_LIKE, upload.source
        if upload.category in ("words", "documents"):
            assert not any(ch.isdigit() for ch in upload.text), upload.source
    assert not any(chr(cp).isdigit() for cp in uploads.emoji_codepoints())
    assert all(not any(part in p.name for part in uploads.ICON_EXCLUDE) for p in sum(uploads.icon_files(), ()))


def test_a_missing_source_is_one_line_naming_the_package(monkeypatch):
    monkeypatch.setattr(uploads, "GLYPHICONS", Path("/nonexistent/glyphicons-halflings-regular.ttf"))
    monkeypatch.setattr(uploads, "PACKAGES", {**uploads.PACKAGES,
                                              Path("/nonexistent/glyphicons-halflings-regular.ttf"): "fonts-x"})
    with pytest.raises(ExamSourceError, match=r"^/nonexistent/glyphicons-halflings-regular.ttf: missing.*"
                                              r"apt-get install fonts-x\)$"):
        exam_uploads(scale=SMALL)


# --- sources: the exam and outlier exposure never share one --------------------------------------------------

class OpenedFiles:
    """Records every file opened from Python (io.open, builtins.open) or handed to FreeType (ImageFont.truetype)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: set[Path] = set()
        real_open, real_truetype = io.open, ImageFont.truetype

        def recording_open(file, *args, **kwargs):
            if isinstance(file, (str, Path)):
                self.paths.add(Path(file).resolve())
            return real_open(file, *args, **kwargs)

        def recording_truetype(font=None, *args, **kwargs):
            if isinstance(font, (str, Path)):
                self.paths.add(Path(font).resolve())
            return real_truetype(font, *args, **kwargs)

        monkeypatch.setattr(io, "open", recording_open)
        monkeypatch.setattr(builtins, "open", recording_open)
        monkeypatch.setattr(ImageFont, "truetype", recording_truetype)


def _clear_caches(*modules) -> None:
    """Forget every lru_cache of the modules, so their files are opened again while recorded."""
    for module in modules:
        for value in vars(module).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()


def _under(path: Path, roots) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _resolved(paths) -> list[Path]:
    return [Path(p).resolve() for p in paths]


def test_declared_sources_are_disjoint():
    exam, training = _resolved(exam_sources()), _resolved(training_sources())
    for path in exam:
        assert not _under(path, training), f"{path} is read by training and used by the exam"
    for path in training:
        assert not _under(path, exam), f"{path} is used by the exam and read by training"


def test_outlier_exposure_opens_no_exam_source(monkeypatch):
    """Fails as soon as training/negatives.py reads a file the exam is made of, declared or not."""
    _clear_caches(negatives)
    opened = OpenedFiles(monkeypatch)
    synthetic_negatives(3 * len(negatives.KINDS), seed=5)  # every kind, three times
    exam = _resolved(exam_sources())
    assert opened.paths, "recorded nothing: the recorder is broken"
    leaked = sorted(p for p in opened.paths if _under(p, exam))
    assert not leaked, f"outlier exposure reads exam sources: {leaked}"
    undeclared = sorted(p for p in opened.paths if not _under(p, _resolved(training_sources()))
                        and p.suffix in (".ttf", ".otf", ".png", ".jpg", ".npz", ".gz"))
    assert not undeclared, f"training_sources() does not list {undeclared}"


def test_the_recorder_sees_the_exam_open_its_sources(monkeypatch):
    """The check above can fail: the same recorder around the exam sees exam files."""
    _clear_caches(uploads)
    opened = OpenedFiles(monkeypatch)
    exam_uploads(scale=SMALL)
    exam = _resolved(exam_sources())
    assert sum(_under(p, exam) for p in opened.paths) >= 8


# --- scoring: the served path -----------------------------------------------------------------------------------

def test_uploads_is_an_ood_set_of_the_exams_files(monkeypatch, small_exam):
    assert "uploads" in OOD_SETS
    real = uploads.exam_uploads
    monkeypatch.setattr(uploads, "exam_uploads", lambda seed: real(seed, scale=SMALL))
    assert load_ood_set("uploads") == [u.data for u in small_exam]


def test_model_inputs_take_files_of_any_size_as_the_service_does(small_exam):
    files = [u.data for u in small_exam[:20]]
    inputs = model_inputs(DIGITS, files)
    assert inputs.shape == (20, 1, 28, 28) and inputs.dtype == np.float32
    assert np.array_equal(inputs, np.stack([DIGITS.preprocess(f) for f in files]))
    arrays = np.stack([np.asarray(Image.open(io.BytesIO(f)).convert("L").resize((40, 30))) for f in files])
    assert np.array_equal(model_inputs(DIGITS, arrays), DIGITS.normalize(DIGITS.canvases_from_arrays(arrays)))
    assert model_inputs(DIGITS, []).shape == (0, 1, 28, 28)


def test_exam_scores_give_the_services_unknown_flags(tiny_artifacts, small_exam):
    service = EmbeddingService.from_dir(tiny_artifacts)
    files = [u.data for u in small_exam]
    answers, timings = service.answer(files)
    assert timings.rejected == 0
    scores = open_set_scores(service, files, batch=16)
    assert [a["unknown"] for a in answers] == (scores > service.searcher.threshold).tolist()
