"""settings: the one place names, ports, limits and threads come from."""

from __future__ import annotations

import pytest

import settings
from pipeline.params import ParamError, validate
from serving.archive import ArchiveError, build_mar


@pytest.mark.parametrize("name", ["-embedding", "_x", "emb.v2", "émbedding", "a b", ""])
def test_archive_and_pipeline_refuse_the_same_model_names(tmp_path, name):
    with pytest.raises(settings.SettingsError, match="invalid model name"):
        settings.check_model_name(name)
    with pytest.raises(ArchiveError, match="invalid model name"):
        build_mar(tmp_path, tmp_path, model_name=name)
    with pytest.raises(ParamError, match=f"model_name={name!r}: {settings.MODEL_NAME_RULE}"):
        validate({"model_name": name})


@pytest.mark.parametrize("name", ["embedding", "Embedding-2", "e_1"])
def test_valid_model_names_pass(name):
    assert settings.check_model_name(name) == name


def test_endpoints_come_from_config_properties_and_a_missing_key_is_named():
    props = settings.properties()
    endpoints = settings.Endpoints.from_properties(props)
    assert endpoints.inference == props["inference_address"]
    assert endpoints.ports()["gRPC inference"] == int(props["grpc_inference_port"])
    broken = {k: v for k, v in props.items() if k != "metrics_address"}
    with pytest.raises(settings.SettingsError, match="config.properties has no metrics_address"):
        settings.Endpoints.from_properties(broken)


def test_max_request_size_is_read_from_config_properties():
    assert settings.max_request_size() == int(settings.read_properties(settings.CONFIG_FILE)["max_request_size"])


def test_the_config_files_carry_the_settings_serving_numbers():
    """model-config.yaml (packed into the .mar) and config.properties must hold these as literals."""
    import yaml

    model_config = yaml.safe_load(settings.MODEL_CONFIG_FILE.read_text())
    props = settings.read_properties(settings.CONFIG_FILE)
    assert model_config["minWorkers"] == model_config["maxWorkers"] == settings.WORKERS
    assert int(props["default_workers_per_model"]) == settings.WORKERS
    assert model_config["handler"]["threads"] == settings.WORKER_THREADS
    assert model_config["responseTimeout"] == settings.REQUEST_TIMEOUT_S
    assert int(props["default_response_timeout"]) == settings.REQUEST_TIMEOUT_S
    assert model_config["handler"]["max_image_pixels"] == settings.MAX_IMAGE_PIXELS


def test_the_images_and_the_serving_runtime_give_workers_the_settings_thread_count():
    import re

    import yaml

    for dockerfile in (settings.REPO / "Dockerfile", settings.REPO / "serving" / "Dockerfile"):
        assert re.findall(r"\bOMP_NUM_THREADS=(\d+)", dockerfile.read_text()) == [str(settings.WORKER_THREADS)]
    runtime = yaml.safe_load((settings.REPO / "deploy" / "kserve" / "servingruntime.yaml").read_text())
    env = {e["name"]: e.get("value") for c in runtime["spec"]["containers"] for e in c.get("env", [])}
    assert env["OMP_NUM_THREADS"] == str(settings.WORKER_THREADS)


@pytest.mark.parametrize("value,expected", [("3", 3), ("4,2", 4), ("0", settings.DEFAULT_THREADS),
                                            ("", settings.DEFAULT_THREADS), ("x", settings.DEFAULT_THREADS)])
def test_env_threads(monkeypatch, value, expected):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert settings.env_threads() == expected


def test_cache_root_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert settings.cache_root() == tmp_path / "mnist-embedding"


def test_the_library_pixel_limit_is_the_served_one():
    """handler/preprocessing.py keeps a default for offline callers (the handler inside a .mar cannot import
    settings); it must be the limit the settings give the server."""
    from handler.preprocessing import DEFAULT_MAX_PIXELS

    assert DEFAULT_MAX_PIXELS == settings.MAX_IMAGE_PIXELS


@pytest.mark.parametrize("line", ["max_request_size: 100", "max_request_size 100", "vmargs=-Xmx512m \\",
                                  "inference_address=http\\://127.0.0.1\\:8080", "load_models"])
def test_properties_the_reader_cannot_read_as_java_does_are_refused(tmp_path, line):
    path = tmp_path / "config.properties"
    path.write_text(f"# comment\n! comment\n\nmetrics_mode=prometheus\n{line}\n")
    with pytest.raises(settings.SettingsError, match=r"config\.properties:5: "):
        settings.read_properties(path)


def test_properties_key_value_lines_are_read_with_comments_and_blanks_skipped(tmp_path):
    path = tmp_path / "config.properties"
    path.write_text("# c\n! c\n\n  a = 1 \nb=x=y\nc=\n")
    assert settings.read_properties(path) == {"a": "1", "b": "x=y", "c": ""}
