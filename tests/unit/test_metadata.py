"""handler.metadata.ModelMetadata: metadata.json of every schema loads, round-trips, and a malformed or newer
file is refused on one line."""

from __future__ import annotations

import json

import pytest

from handler.artifacts import open_set_settings, verify_artifacts
from handler.metadata import SCHEMA_VERSION, ArtifactError, Metrics, ModelMetadata

#: A schema-1 file as training wrote it before the open-set section: the threshold at the top level only.
SCHEMA_1_OLDEST = {"created": "2025-01-01T00:00:00+00:00", "dataset": {"name": "mnist-sample", "classes": ["0"]},
                   "embedding_dim": 64, "preprocessing": {"version": "1"}, "index": {"type": "flat"}, "k": 5,
                   "threshold": 0.8, "metrics": {"accuracy": 0.98, "open_set_rejection": 0.9},
                   "training": {"config": {"seed": 3}}, "versions": {}, "sha256": {"model.pt": "ab"}}


def test_a_schema_1_file_without_an_open_set_section_serves_its_top1_threshold():
    meta = ModelMetadata.from_json(SCHEMA_1_OLDEST)
    assert meta.schema_version == 1 and meta.threshold == 0.8 and meta.k == 5 and meta.seed == 3
    assert meta.metrics == Metrics(0.98, 0.9) and meta.drift_baseline is None
    settings = open_set_settings(meta)
    assert (settings["score"], settings["kth"], settings["threshold"]) == ("top1_distance", 1, 0.8)


def test_writing_gives_the_current_schema_with_the_threshold_once(tmp_path):
    meta = ModelMetadata.from_json({**SCHEMA_1_OLDEST, "open_set": {"score": "top1_distance", "kth": 1,
                                                                     "threshold": 0.8}})
    written = json.loads(meta.write(tmp_path).read_text())
    assert written["schema_version"] == SCHEMA_VERSION and "threshold" not in written
    assert written["open_set"]["threshold"] == 0.8
    again = ModelMetadata.read(tmp_path)
    assert again == meta.replace(schema_version=SCHEMA_VERSION)


def test_keys_this_code_does_not_know_are_kept_on_rewrite(tmp_path):
    meta = ModelMetadata.from_json({**SCHEMA_1_OLDEST, "lineage": {"run": "r-1"}})
    assert meta.extra == {"lineage": {"run": "r-1"}}
    assert json.loads(meta.write(tmp_path).read_text())["lineage"] == {"run": "r-1"}


@pytest.mark.parametrize("change,message", [
    ({"schema_version": SCHEMA_VERSION + 1}, f"schema version {SCHEMA_VERSION + 1} is newer than this code reads"),
    ({"schema_version": "2"}, "schema_version must be a positive integer"),
    ({"k": 0}, "k must be a positive integer"),
    ({"k": True}, "k must be a positive integer"),
    ({"metrics": {"accuracy": "high"}}, "metrics.accuracy"),
    ({"open_set": [0.8]}, "'open_set' must be an object"),
    ({"sha256": {"model.pt": 1}}, "sha256 must map file names"),
    ({"enrollment": {"added": 1}}, "enrollment must be a list"),
])
def test_a_malformed_or_newer_file_is_refused_on_one_line(change, message):
    with pytest.raises(ArtifactError, match=message) as error:
        ModelMetadata.from_json({**SCHEMA_1_OLDEST, **change}, "m/metadata.json")
    assert str(error.value).startswith("m/metadata.json: ") and "\n" not in str(error.value)


def test_files_before_schema_3_hold_a_torchscript_network_and_schema_3_names_its_format():
    assert ModelMetadata.from_json({**SCHEMA_1_OLDEST, "schema_version": 2}).model_file == "model.pt"
    meta = ModelMetadata.from_json({**SCHEMA_1_OLDEST, "schema_version": 3, "model_format": "aotinductor"})
    assert (meta.model_format, meta.model_file) == ("aotinductor", "model.pt2")
    assert meta.to_json()["model_format"] == "aotinductor" and "model_format" not in meta.extra
    with pytest.raises(ArtifactError, match=r"^m: model_format must be one of torchscript, aotinductor, got 'onnx'$"):
        ModelMetadata.from_json({**SCHEMA_1_OLDEST, "schema_version": 3, "model_format": "onnx"}, "m")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\udcff"])
def test_an_unreadable_file_is_an_artifact_error(tmp_path, content):
    (tmp_path / "metadata.json").write_text(content, errors="surrogateescape")
    with pytest.raises(ArtifactError, match="metadata.json: "):
        ModelMetadata.read(tmp_path)


def test_trained_artifacts_are_the_current_schema_and_verify(tiny_artifacts):
    raw = json.loads((tiny_artifacts / "metadata.json").read_text())
    assert raw["schema_version"] == SCHEMA_VERSION and "threshold" not in raw
    meta = verify_artifacts(tiny_artifacts)
    assert meta.to_json() == raw and meta.threshold == raw["open_set"]["threshold"] > 0
