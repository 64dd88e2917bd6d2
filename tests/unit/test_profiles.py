"""Preprocessing profiles (handler/profiles.py, handler/preprocessing.py): the registry and its check at import, the
full-frame profile's contract, how a build picks a profile and records it, and the handler serving a full-frame model
with the profile its metadata names."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from support.handler_context import make_context, run_batch
from support.idx_fixtures import write_idx

from handler.artifacts import METADATA_FILE
from handler.embedding_handler import EmbeddingHandler
from handler.preprocessing import (
    CANVAS,
    DIGITS,
    DIGITS_V1,
    FULL_FRAME,
    PROFILES,
    InvalidImageError,
    ProfileError,
    profile_of,
    to_full_frame,
)
from handler.profiles import (ENTRIES, QUANTIZATION, REGISTRY, SERVED, ProfileEntry, RegistryError, TrainingDefaults,
                              Version, check_registry)
from handler.service import EmbeddingService
from training.__main__ import main as training_main
from training.config import DATASET_PROFILES, PROFILE_CHOICES, PROFILE_QUANTIZATION, resolve_profile, resolve_quantize
from training.data import Dataset
from training.data.idx import FASHION_CLASSES
from training.steps import prepare_data
from training.train import PROFILE_DEFAULTS, TrainConfig, augment, resolve_profile_defaults


def png(array: np.ndarray, mode: str = "L") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode).save(buffer, "PNG")
    return buffer.getvalue()


def garment(seed: int, label: int = 0) -> np.ndarray:
    """A Fashion-MNIST-like picture: a light shape filling most of a black 28x28 frame, varied levels."""
    rng = np.random.default_rng(seed)
    image = np.zeros((CANVAS, CANVAS), np.uint8)
    top, left = 2 + label % 3, 4 + label % 5
    image[top : CANVAS - 2, left : CANVAS - left] = rng.integers(40, 256, (CANVAS - 2 - top, CANVAS - 2 * left))
    return image


dark_border_images = st.integers(0, 2**32 - 1).map(lambda seed: garment(seed, seed % 10))


@settings(max_examples=50, deadline=None)
@given(dark_border_images)
def test_full_frame_leaves_a_centred_28x28_picture_as_it_is(image):
    """Training reads Fashion-MNIST arrays through the same function: they must come out untouched, and the
    same picture posted as PNG must give the very tensor training used."""
    np.testing.assert_array_equal(to_full_frame(image), image)
    np.testing.assert_array_equal(FULL_FRAME.preprocess(png(image)), FULL_FRAME.normalize(image[None])[0])


def test_full_frame_turns_a_light_background_dark():
    image = garment(3)
    np.testing.assert_array_equal(to_full_frame(png(255 - image)), image)


def test_full_frame_keeps_the_aspect_and_pads_with_black():
    wide = np.full((40, 80), 200, np.uint8)  # a uniform light bar on a dark frame, twice as wide as high
    wide[0], wide[-1], wide[:, 0], wide[:, -1] = 0, 0, 0, 0
    canvas = to_full_frame(png(wide))
    rows = np.flatnonzero(canvas.max(axis=1) > 0)
    assert canvas.shape == (CANVAS, CANVAS)
    assert rows[0] == 7 and rows[-1] == 20  # 80 -> 28 wide, 40 -> 14 high, centred: rows 7..20
    assert canvas[:7].max() == 0 and canvas[21:].max() == 0
    assert canvas[10:18, 2:26].min() > 150  # the bar itself, brightness kept (no contrast stretch)


def test_full_frame_keeps_8_bit_levels_and_stretches_wider_ones():
    image = (garment(5) // 2).astype(np.uint8)  # a dim picture: levels up to 127
    assert to_full_frame(image).max() == image.max()  # garments' brightness is information
    wide = garment(5).astype(np.uint16) * 256  # 16-bit PNG
    assert to_full_frame(Image.fromarray(wide.astype(np.int32), "I")).max() == 255


@pytest.mark.parametrize("bad", [np.zeros((0, 5), np.uint8), np.zeros((3, 3, 3), np.uint8),
                                 np.array([[np.nan, 1.0], [0.0, 1.0]], np.float32)], ids=["empty", "3-d", "nan"])
def test_full_frame_refuses_what_it_cannot_read_with_a_clear_error(bad):
    with pytest.raises(InvalidImageError):
        to_full_frame(bad)


def test_a_blank_image_is_a_blank_tensor_in_both_profiles():
    white = png(np.full((30, 50), 255, np.uint8))
    for profile in PROFILES.values():
        assert np.ptp(profile.preprocess(white)) == 0


def test_profile_of_reads_metadata_and_refuses_what_it_does_not_implement():
    assert profile_of({"version": "1"}) is DIGITS_V1  # metadata from before profiles
    assert profile_of(DIGITS.record()) is DIGITS
    assert profile_of(FULL_FRAME.record()) is FULL_FRAME
    with pytest.raises(ProfileError, match="profile 'sketches'"):
        profile_of({"profile": "sketches", "version": "1"})
    with pytest.raises(ProfileError, match="full-frame preprocessing version '9'"):
        profile_of({"profile": "full-frame", "version": "9"})


def test_every_view_of_the_profiles_is_read_from_the_one_registry():
    assert [entry.name for entry in REGISTRY] == list(PROFILES) == list(ENTRIES)
    assert PROFILE_QUANTIZATION == {entry.name: entry.quantize for entry in REGISTRY}
    assert PROFILE_DEFAULTS == {entry.name: vars(entry.training) for entry in REGISTRY}
    assert DATASET_PROFILES == {"fashion-mnist": "full-frame"}
    assert list(SERVED) == [(e.name, v.version) for e in REGISTRY for v in e.versions]
    for entry in REGISTRY:  # the profile new models get is the entry's first version, served like the others
        assert PROFILES[entry.name] is SERVED[entry.name, entry.versions[0].version]
        assert resolve_quantize("auto", entry.name) == entry.quantize in QUANTIZATION
        for version in entry.versions:
            profile = SERVED[entry.name, version.version]
            assert (profile.canvas, profile.counted, profile.mean, profile.std) == (
                version.canvas, version.counted, entry.mean, entry.std)


def test_an_entry_without_one_of_its_parts_cannot_be_written():
    digits = ENTRIES["digits"]
    with pytest.raises(TypeError, match="quantize"):
        ProfileEntry("sketches", 0.1, 0.3, 20, versions=digits.versions, training=digits.training)
    with pytest.raises(TypeError, match="pool"):
        TrainingDefaults(max_rotation=0.0, hflip=False, erase=0.0)


@pytest.mark.parametrize("change, message", [
    (lambda e: replace(e, quantize="int4"), "quantize must be one of"),
    (lambda e: replace(e, versions=()), "versions must be listed once each"),
    (lambda e: replace(e, versions=(e.versions[0], e.versions[0])), "versions must be listed once each"),
    (lambda e: replace(e, versions=(Version("4", None),)), "version 4: its canvas is not callable"),
    (lambda e: replace(e, training={"pool": "avg"}), "training must be TrainingDefaults"),
    (lambda e: replace(e, name="full-frame"), "profile 'full-frame' is registered twice"),
    (lambda e: replace(e, datasets=("fashion-mnist",)), "dataset 'fashion-mnist' is claimed by two profiles"),
    (lambda e: replace(e, std=0.0), "do not scale"),
], ids=["quantize", "no-version", "twice", "canvas", "training", "name", "dataset", "std"])
def test_the_registry_check_names_what_is_wrong(change, message):
    check_registry(REGISTRY)
    with pytest.raises(RegistryError, match=message):
        check_registry((change(REGISTRY[0]), *REGISTRY[1:]))


def test_a_registered_pool_training_does_not_know_fails_when_training_is_imported():
    """The check runs at import (a subprocess imports afresh), not at the first training of that profile."""
    script = ("import dataclasses, handler.profiles as p\n"
              "e = p.ENTRIES['digits']\n"
              "p.ENTRIES = {**p.ENTRIES, 'sketches': dataclasses.replace(e, name='sketches', "
              "training=dataclasses.replace(e.training, pool='max'))}\n"
              "import training.train\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "RegistryError" in done.stderr and "'sketches': 'max'" in done.stderr, done.stderr
    fine = subprocess.run([sys.executable, "-c", script.replace("pool='max'", "pool='flatten'")],
                          capture_output=True, text=True, timeout=120)
    assert fine.returncode == 0, fine.stderr


def test_auto_profile_follows_the_dataset_and_a_flag_overrides_it():
    assert resolve_profile("auto", "fashion-mnist") == "full-frame"
    assert resolve_profile("auto", "mnist") == resolve_profile("auto", "mnist-sample") == "digits"
    assert resolve_profile("digits", "fashion-mnist") == "digits"
    assert set(PROFILE_CHOICES) == {"auto", *PROFILES}
    with pytest.raises(ValueError, match="unknown preprocessing profile"):
        resolve_profile("sketches", "mnist")


def fashion_like(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    labels = np.arange(n) % 10
    return np.stack([garment(seed * 100_000 + i, int(y)) for i, y in enumerate(labels)]), labels


def test_prepare_data_reads_fashion_mnist_full_frame_unchanged():
    train_images, train_labels = fashion_like(40, 0)
    test_images, test_labels = fashion_like(20, 1)
    ds = Dataset("fashion-mnist", train_images, train_labels, test_images, test_labels, FASHION_CLASSES)
    data = prepare_data("unused", dataset=ds)
    assert data.profile == "full-frame"
    np.testing.assert_array_equal(data.train_images, train_images)
    assert prepare_data("unused", dataset=ds, profile="digits").profile == "digits"


def test_hflip_mirrors_about_half_of_the_batch_and_nothing_else():
    x = torch.from_numpy(FULL_FRAME.normalize(fashion_like(64, 2)[0]))
    out = augment(x, torch.Generator().manual_seed(0), max_shift=0.0, max_rotation=0.0, hflip=True, profile=FULL_FRAME)
    same = [torch.allclose(o, i, atol=1e-5) for o, i in zip(out, x)]
    mirrored = [torch.allclose(o, i.flip(-1), atol=1e-5) for o, i in zip(out, x)]
    assert all(s or m for s, m in zip(same, mirrored))
    assert 16 <= sum(mirrored) <= 48
    assert {name: aug["hflip"] for name, aug in PROFILE_DEFAULTS.items()} == {"digits": False, "full-frame": True}


def test_random_erasing_blanks_one_rectangle_in_about_the_asked_share():
    x = torch.from_numpy(FULL_FRAME.normalize(np.full((200, CANVAS, CANVAS), 200, np.uint8)))
    background = float(FULL_FRAME.normalize(np.zeros((1, 1, 1), np.uint8)).reshape(()))
    out = augment(x, torch.Generator().manual_seed(1), 0.0, 0.0, profile=FULL_FRAME, erase=0.5)
    erased = (out[:, 0] - background).abs() < 1e-6
    touched = erased.flatten(1).any(dim=1)
    assert 70 <= int(touched.sum()) <= 130
    for mask in erased[touched]:  # one axis-aligned rectangle of 2-25% of the frame
        rows, cols = torch.nonzero(mask.any(dim=1)).flatten(), torch.nonzero(mask.any(dim=0)).flatten()
        box = mask[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
        assert bool(box.all()) and 0.015 * CANVAS**2 <= int(mask.sum()) <= 0.26 * CANVAS**2
    untouched = augment(x, torch.Generator().manual_seed(1), 0.0, 0.0, profile=FULL_FRAME)
    assert torch.allclose(untouched, x, atol=1e-5)


def test_augmentation_follows_the_profile_unless_set():
    digits, garments = resolve_profile_defaults(TrainConfig(), "digits"), resolve_profile_defaults(TrainConfig(), "full-frame")
    assert (digits.max_rotation, digits.hflip, digits.erase, digits.pool) == (10.0, False, 0.0, "avg")
    assert (garments.max_rotation, garments.hflip, garments.erase, garments.pool) == (0.0, True, 0.5, "flatten")
    assert resolve_profile_defaults(TrainConfig(max_rotation=5.0, erase=0.0), "full-frame").max_rotation == 5.0


@pytest.fixture(scope="module")
def full_frame_artifacts(tmp_path_factory):
    """A model trained by the CLI on a Fashion-MNIST-named IDX directory: auto picks full-frame."""
    root = tmp_path_factory.mktemp("profiles")
    data = root / "fashion-mnist"
    data.mkdir()
    for prefix, (images, labels) in {"train": fashion_like(300, 3), "t10k": fashion_like(60, 4)}.items():
        write_idx(data / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(data / f"{prefix}-labels-idx1-ubyte.gz", labels.astype(np.uint8))
    out = root / "artifacts"
    assert training_main(["--data-source", f"idx:{data}", "--out", str(out), "--epochs", "1", "--width", "8",
                          "--embedding-dim", "16", "--no-plots", "--threads", "1"]) == 0
    return out, data


def test_the_build_records_the_profile_and_the_service_applies_it(full_frame_artifacts):
    out, _ = full_frame_artifacts
    metadata = json.loads((out / METADATA_FILE).read_text())
    assert metadata["preprocessing"] == FULL_FRAME.record()
    config = metadata["training"]["config"]
    assert (config["hflip"], config["erase"], config["pool"]) == (True, 0.5, "flatten")
    assert metadata["dataset"]["classes"] == list(FASHION_CLASSES)
    service = EmbeddingService.from_dir(out)
    assert service.profile is FULL_FRAME
    pictures = fashion_like(8, 9)[0]
    served, _ = service.answer([png(p) for p in pictures])
    offline = service.searcher.classify(service.embed(FULL_FRAME.normalize(pictures)))
    assert [a["pred"] for a in served] == [a["pred"] for a in offline]
    assert [a["dist"] for a in served] == [a["dist"] for a in offline]
    light_paper, _ = service.answer([png(255 - p) for p in pictures])  # a photo on white paper: same answers
    assert [a["pred"] for a in light_paper] == [a["pred"] for a in offline]


def test_the_handler_serves_a_full_frame_model(full_frame_artifacts):
    """The same handler as for digits, with the profile metadata.json names (refusals: tests/unit/test_handler.py)."""
    out, _ = full_frame_artifacts
    handler = EmbeddingHandler()
    context = make_context(out)
    handler.initialize(context)
    answers, statuses = run_batch(handler, context, [{"body": png(p)} for p in fashion_like(4, 7)[0]])
    assert statuses == [200] * 4 and all(a["pred"] in FASHION_CLASSES for a in answers)


def test_the_flag_overrides_auto_and_an_unknown_profile_is_a_one_line_cli_error(full_frame_artifacts, tmp_path,
                                                                                capsys):
    _, data = full_frame_artifacts
    out = tmp_path / "digits"
    assert training_main(["--data-source", f"idx:{data}", "--out", str(out), "--epochs", "1", "--width", "8",
                          "--embedding-dim", "16", "--no-plots", "--threads", "1", "--preprocessing", "digits"]) == 0
    assert json.loads((out / METADATA_FILE).read_text())["preprocessing"]["profile"] == "digits"
    with pytest.raises(SystemExit) as exit_info:
        training_main(["--data-source", f"idx:{data}", "--out", str(tmp_path / "x"), "--preprocessing", "sketches"])
    assert exit_info.value.code == 2 and "invalid choice: 'sketches'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_curve_uses_a_gallery_sample_until_the_last_epoch(monkeypatch, prepared_sample):
    """Intermediate epochs measure against CURVE_GALLERY training images, the last against all of them, and the
    sample does not change what is trained (its own RNG)."""
    import training.train as train

    x, y = prepared_sample.inputs("train")[:300], prepared_sample.train_labels[:300]
    tx, ty = prepared_sample.inputs("test")[:100], prepared_sample.test_labels[:100]
    config = TrainConfig(epochs=2, width=4, embedding_dim=8, negatives=0, printed=0)
    whole, whole_history = train.train_model(x, y, tx, ty, 10, config, 5, log=lambda _: None)
    monkeypatch.setattr(train, "CURVE_GALLERY", 50)
    sampled, history = train.train_model(x, y, tx, ty, 10, config, 5, log=lambda _: None)
    assert [e["gallery"] for e in history.epochs] == [50, 300]
    assert [e["gallery"] for e in whole_history.epochs] == [300, 300]
    assert history.epochs[-1]["knn_accuracy"] == whole_history.epochs[-1]["knn_accuracy"]
    for a, b in zip(whole.state_dict().values(), sampled.state_dict().values()):
        assert torch.equal(a, b)
