"""What `python -m pipeline` writes where the user says (compile --out, runtime --out, run-local --workdir and
--serve-workdir, a local KServe storage folder) replaces only what the same command wrote before: a user's file, a
folder of user files, a git repository and the current directory are refused on one line and left intact."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from pipeline import images
from pipeline.cli import main

IMAGE = "registry.example.com/ml/mnist-embedding-pipeline:1.2.3"
#: run-local options that make a run fail at its first task, should the path check ever let one start.
FAST_FAIL = ("--deploy-target", "none", "--data-source", "idx:/nonexistent")


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (a .git folder too) with its SHA-256."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _user_folder(root: Path) -> Path:
    (root / "7").mkdir(parents=True)
    (root / "7" / "digit_7.png").write_bytes(b"\x89PNG user image")
    (root / "notes.txt").write_text("mine")
    return root


def _git_repo(root: Path) -> Path:
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "README.md").write_text("a user's repository\n")
    return root


@pytest.fixture
def run(monkeypatch, capsys, tmp_path):
    """main(argv) -> (exit code, stdout, stderr lines), from tmp_path/cwd, without $PIPELINE_IMAGE."""
    monkeypatch.setenv(images.IMAGE_ENV, "")  # main() sets it; monkeypatch restores it afterwards
    monkeypatch.setenv(images.IMAGES_JSON_ENV, str(tmp_path / "no-images.json"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    def call(*argv: str) -> tuple[int, str, list[str]]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err.strip().splitlines()

    return call


def _refused(result: tuple[int, str, list[str]], *words: str) -> None:
    code, _, err = result
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("pipeline: error: ") and all(w in err[0] for w in words), err


@pytest.mark.parametrize("command", [["compile", "--image", IMAGE], ["runtime", "--allow-tag", "--image", IMAGE]])
def test_a_users_file_is_never_replaced(run, tmp_path, command):
    mine = tmp_path / "pipeline.yaml"
    mine.write_text("my own notes\n")
    _refused(run(*command, "--out", str(mine)), "--out", "was not written by this command")
    assert mine.read_text() == "my own notes\n"


@pytest.mark.parametrize("make", [_user_folder, _git_repo])
def test_a_folder_of_user_files_or_a_repository_is_never_written_into(run, tmp_path, make):
    folder = make(tmp_path / "folder")
    before = _snapshot(folder)
    _refused(run("compile", "--image", IMAGE, "--out", str(folder)), "--out", "is a folder")
    for flag in ("--workdir", "--serve-workdir"):
        _refused(run("run-local", flag, str(folder), *FAST_FAIL), flag)
    assert _snapshot(folder) == before


def test_run_local_refuses_the_current_directory_and_the_data_it_reads(run, tmp_path):
    _refused(run("run-local", "--workdir", ".", *FAST_FAIL), "--workdir", "current directory")
    data = tmp_path / "idx"
    data.mkdir()
    (data / "train-images-idx3-ubyte").write_bytes(b"user data")
    _refused(run("run-local", "--workdir", str(data / "runs"), "--data-source", f"idx:{data}"), "reads from")
    assert [p.name for p in data.iterdir()] == ["train-images-idx3-ubyte"]


def test_compile_replaces_the_package_it_wrote(run, tmp_path):
    from pipeline.cli import COMPILE_HEADER

    out = tmp_path / "pipeline.yaml"
    assert run("compile", "--image", IMAGE, "--out", str(out))[0] == 0
    assert out.read_text().startswith(COMPILE_HEADER)
    out.write_text(out.read_text() + "# edited\n")
    assert run("compile", "--image", IMAGE, "--out", str(out))[0] == 0
    assert "# edited" not in out.read_text()


@pytest.mark.parametrize("runtime", ["torchserve", "python"])
def test_runtime_never_writes_over_the_templates_it_reads(run, runtime):
    from serving.runtimes import SERVING_RUNTIMES

    for template in (rt.manifest for rt in SERVING_RUNTIMES.values()):
        before = template.read_bytes()
        _refused(run("runtime", "--runtime", runtime, "--allow-tag", "--image", IMAGE, "--out", str(template)),
                 "reads from")
        assert template.read_bytes() == before


def test_run_local_marks_its_workdir_and_writes_there_again(run, tmp_path):
    """A folder run-local made (marked, with a run inside) passes the path check of the next run; the run then
    stops at the data source, which the preflight checks next."""
    workdir = tmp_path / "runs"
    args = ("run-local", "--workdir", str(workdir), "--deploy-target", "none", "--data-source", "idx:/nonexistent")
    code, _, err = run(*args)
    assert code == 1 and "is not a folder" in err[0], err
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    _refused(run(*args), "--workdir", "did not make")
    (workdir / "notes.txt").unlink()
    from owned_paths import mark

    mark(workdir, "pipeline-run-local", "python -m pipeline run-local")
    (workdir / "mnist-embedding-2026-01-01-00-00-00-000000").mkdir()
    code, _, err = run(*args)
    assert code == 1 and "is not a folder" in err[0], err


def test_a_kserve_dry_run_never_replaces_a_users_folder(tmp_path):
    from pipeline.kserve_deploy import KServeError, publish

    staging = tmp_path / "staging"
    (staging / "config").mkdir(parents=True)
    (staging / "config" / "config.properties").write_text("x=1\n")
    (staging / "model-store").mkdir()
    store = tmp_path / "store"
    version = _user_folder(store / "1.0")
    before = _snapshot(version)
    with pytest.raises(KServeError, match="kserve_storage_uri .* did not make"):
        publish(staging, str(version))
    assert _snapshot(version) == before
    publish(staging, str(store / "2.0"))
    publish(staging, str(store / "2.0"))  # its own version folder: replaced
    assert sorted(_snapshot(store / "2.0")) == ["config/config.properties"]
