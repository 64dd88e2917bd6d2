"""Compile options (pipeline.options) and the storage Secret's files as the deploy task's environment."""

import argparse

import pytest

from pipeline import options as O
from pipeline import params as P


def _options(*argv: str) -> O.CompileOptions:
    parser = argparse.ArgumentParser()
    O.add_arguments(parser)
    return O.from_namespace(parser.parse_args(list(argv)))


def test_defaults_give_every_task_resources():
    options = _options()
    assert set(options.resources) == set(O.TASKS) and options.resources == O.DEFAULT_RESOURCES
    assert options.storage_secret == P.STORAGE_SECRET.default and not options.secret_name_parameter
    assert options.image_pull_secrets == ()
    assert [p.name for p in options.run_params()] == [p.name for p in P.PARAMS]


def test_task_resources_one_task_or_all():
    options = _options("--task-memory", "all=1Gi/2Gi", "--task-cpu", "train=3", "--task-cpu", "evaluate=1/2")
    assert {r.memory_request for r in options.resources.values()} == {"1Gi"}
    assert {r.memory_limit for r in options.resources.values()} == {"2Gi"}
    assert (options.resources["train"].cpu_request, options.resources["train"].cpu_limit) == ("3", "3")
    assert (options.resources["evaluate"].cpu_request, options.resources["evaluate"].cpu_limit) == ("1", "2")
    assert options.resources["archive"].cpu_limit == O.DEFAULT_RESOURCES["archive"].cpu_limit


def test_secret_name_parameter_adds_the_run_parameter():
    options = _options("--secret-name-parameter", "--storage-secret", "team-storage", "--image-pull-secret", "a",
                       "--image-pull-secret", "b")
    (added,) = [p for p in options.run_params() if p.name == "storage_secret"]
    assert added.default == "team-storage"
    assert options.run_values({"epochs": 1}) == {"epochs": 1, "storage_secret": "team-storage"}
    assert options.image_pull_secrets == ("a", "b")
    assert _options().run_values({"epochs": 1}) == {"epochs": 1}


def test_storage_environment_reads_the_mounted_secret(tmp_path):
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("AKIA-test\n")
    (tmp_path / "AWS_SECRET_ACCESS_KEY").write_text("s3cr3t")
    (tmp_path / "gcs-key.json").write_text("{}")
    found = P.storage_environment(tmp_path, environ={"AWS_SECRET_ACCESS_KEY": "given"})
    assert found == {"AWS_ACCESS_KEY_ID": "AKIA-test", "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "gcs-key.json")}


def test_storage_environment_without_the_secret_is_empty(tmp_path):
    assert P.storage_environment(tmp_path / "not-mounted", environ={}) == {}


@pytest.mark.parametrize("argv", [["--task-cpu", "=1"], ["--task-cpu", "train="], ["--image-pull-secret", "A"]])
def test_unusable_options_raise_param_error(argv):
    with pytest.raises(P.ParamError):
        _options(*argv)


@pytest.mark.parametrize("command", [["runtime", "--image", "reg.example/s@sha256:" + "a" * 64],
                                     ["compile", "--image", "reg.example/p@sha256:" + "a" * 64]])
def test_an_unwritable_output_is_one_line(command, tmp_path, capsys):
    from pipeline.cli import main

    for out in (tmp_path, tmp_path / "file.yaml" / "below.yaml"):
        (tmp_path / "file.yaml").write_text("x")
        assert main([*command, "--out", str(out)]) == 2  # refused before the image or the package is looked at
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"pipeline: error: --out {out}: ") and "Traceback" not in line


@pytest.mark.parametrize("source, claim, mounted", [("pvc://training/mnist", "training", ""),
                                                    ("idx:pvc://training/mnist", "training", "other")])
def test_a_pvc_data_source_needs_its_claim_mounted(source, claim, mounted, capsys):
    """Refused before anything is sent: the load-data task would read another claim, or none."""
    from pipeline.cli import main

    argv = ["submit", "--image", "x", "--host", "http://127.0.0.1:9", "--data-source", source]
    assert main(argv + (["--data-pvc-claim", mounted] if mounted else [])) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(f"compile with --data-pvc-claim {claim}")
