"""The per-profile int8 default: ``quantize=auto`` (the default of `python -m training`, TrainConfig and the
pipeline) builds int8 for the digits profile and float for full-frame, ``--quantize none`` builds the float model
(with model.onnx), and what train.json, metadata.json and the pipeline record is the resolved value, never auto."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from handler.artifacts import MODEL_FILE, ONNX_FILE, quantization, verify_artifacts
from handler.preprocessing import PROFILES
from training import export as export_module
from training import steps
from training.__main__ import parse_args
from training.config import PROFILE_QUANTIZATION, QUANTIZE_CHOICES, resolve_quantize
from training.data import Dataset
from training.params import CONFIG_FIELDS, TRAINING_PARAMS
from training.train import TrainConfig

from support.training_cli import config_from_cli

SMALL = dict(epochs=1, embedding_dim=16, width=8, seed=0)


def test_auto_resolves_per_profile_and_an_explicit_choice_wins():
    assert resolve_quantize("auto", "digits") == "int8"
    assert resolve_quantize("auto", "full-frame") == "none"
    assert resolve_quantize("none", "digits") == "none"
    assert resolve_quantize("int8", "full-frame") == "int8"
    assert resolve_quantize("auto", "a-profile-nobody-measured") == "none"  # float unless int8 was shown to qualify
    with pytest.raises(ValueError, match="quantize must be one of auto, none, int8, got 'int4'"):
        resolve_quantize("int4", "digits")


def test_every_profile_has_a_decided_default():
    assert set(PROFILE_QUANTIZATION) == set(PROFILES)


def test_auto_is_the_default_of_the_config_the_cli_and_the_pipeline(monkeypatch, tmp_path):
    from pipeline import params

    assert TrainConfig().quantize == "auto"
    assert parse_args([]).quantize == "auto" and parse_args(["--quantize", "none"]).quantize == "none"
    assert config_from_cli(monkeypatch, ["--out", str(tmp_path / "a")]).quantize == "auto"
    assert config_from_cli(monkeypatch, ["--out", str(tmp_path / "b"), "--quantize", "none"]).quantize == "none"
    (param,) = [p for p in params.PARAMS if p.name == "quantize"]
    assert param.default == "auto" and param.choices == QUANTIZE_CHOICES == ("auto", "none", "int8")


@pytest.fixture(scope="module")
def digits(prepared_sample) -> Dataset:
    """1,024 training and 256 held-out canvases of the bundled sample (digits profile)."""
    s = prepared_sample
    return Dataset("digits-subset", s.train_images[:1024], s.train_labels[:1024], s.test_images[:256],
                   s.test_labels[:256], s.classes, profile=s.profile)


@pytest.fixture(scope="module")
def trained(digits):
    """One briefly trained network and its history, trained once: these tests are about what is exported."""
    from training.train import train_model

    config = TrainConfig(**SMALL, negatives=0, printed=0)
    return train_model(digits.inputs("train"), digits.train_labels, digits.inputs("test"), digits.test_labels,
                       len(digits.classes), config, 5, log=lambda _: None)


@pytest.fixture
def trained_with(monkeypatch, trained) -> list[TrainConfig]:
    """train_model returns a copy of ``trained``; the list collects the configs the build trained with."""
    configs: list[TrainConfig] = []

    def fake_train_model(*args, **kwargs):
        configs.append(args[5])
        model, history = trained
        return copy.deepcopy(model), history

    monkeypatch.setattr(steps, "train_model", fake_train_model)
    return configs


@pytest.mark.parametrize(("profile", "choice", "built"), [
    ("digits", "auto", "int8"), ("digits", "none", "none"), ("full-frame", "auto", "none"),
    ("full-frame", "int8", "int8")])
def test_a_build_records_the_resolved_scheme_and_writes_model_onnx_only_for_float(digits, trained_with, tmp_path,
                                                                                   profile, choice, built):
    data = replace(digits, profile=profile)
    lines: list[str] = []
    info = steps.train_and_export(data, TrainConfig(**SMALL, quantize=choice), tmp_path, log=lines.append)
    assert [c.quantize for c in trained_with] == [built]
    recorded = json.loads((tmp_path / steps.TRAIN_FILE).read_text())
    assert recorded["config"]["quantize"] == info["config"]["quantize"] == built
    assert (recorded["quantization"] or {}).get("scheme", "none") == built
    assert (tmp_path / MODEL_FILE).is_file()
    onnx_expected = built == "none" and export_module.onnx_modules() is not None
    assert (tmp_path / ONNX_FILE).is_file() == onnx_expected
    assert (recorded["onnx_opset"] is not None) == onnx_expected
    said = [line for line in lines if line.startswith("quantize auto:")]
    hint = " (--quantize none builds the float model: GPU serving, model.onnx)" if built == "int8" else ""
    assert said == ([f"quantize auto: {built} for the {profile} profile{hint}"] if choice == "auto" else [])


def test_the_default_digit_build_is_int8_in_metadata_too(digits, trained_with, tmp_path):
    steps.train_and_export(digits, TrainConfig(**SMALL), tmp_path, log=lambda _: None)
    steps.build_gallery(digits, tmp_path, log=lambda _: None)
    metadata = steps.evaluate_and_finalize(digits, tmp_path, plots=False, log=lambda _: None)
    assert metadata == verify_artifacts(tmp_path)
    assert quantization(metadata) == "int8" and metadata["training"]["config"]["quantize"] == "int8"
    assert ONNX_FILE not in metadata["sha256"]


def test_a_failed_int8_build_names_the_float_flag(digits, trained_with, tmp_path, monkeypatch):
    from training import quantize as quantize_module

    monkeypatch.setattr(quantize_module, "MAX_EMBEDDING_DIFF", 1e-9)
    with pytest.raises(quantize_module.QuantizationError,
                       match=r"calibration failed \(--quantize none builds the float model\)$"):
        steps.train_and_export(digits, TrainConfig(**SMALL), tmp_path, log=lambda _: None)


@pytest.mark.parametrize(("profile", "built", "accuracy_key"), [
    ("digits", "int8", "float_knn_accuracy"), ("full-frame", "none", "knn_accuracy")])
def test_the_pipeline_train_task_records_the_resolved_scheme(digits, trained, trained_with, tmp_path, profile, built,
                                                             accuracy_key):
    from kfp.dsl import Dataset as DatasetArtifact
    from kfp.dsl import Model

    from pipeline.components import train

    data = replace(digits, profile=profile)
    data.save(tmp_path / "data.npz")
    model = Model(name="model", uri=str(tmp_path / "model"))
    words = {p.name: p.default for p in TRAINING_PARAMS if p.name in CONFIG_FIELDS}  # quantize: its default
    words.update(epochs=1, embedding_dim=16, width=8, seed=0)
    train.python_func(dataset=DatasetArtifact(name="dataset", uri=str(tmp_path / "data.npz")), k=5, model=model,
                      **words)
    assert model.metadata["quantize"] == built
    other = {"knn_accuracy", "float_knn_accuracy"} - {accuracy_key}
    assert model.metadata[accuracy_key] == trained[1].epochs[-1]["knn_accuracy"] and not other & set(model.metadata)
