"""Nothing a user owns is ever replaced by training and archiving (#36, part 1): every command that writes where
it is pointed refuses, with one line and exit 2, a folder of the user's files, a git repository, the current
directory and what it reads from, and leaves every file as it was; what it made before it still replaces."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.image_tree import make_tree, tree_digest, user_folder

from cli_common import UsageError
from owned_paths import MARKER, marker_kind
from serving import archive
from training.__main__ import main as training_main
from training.build import build_artifacts, staged_directory
from training.config import TrainConfig
from training.outputs import ARTIFACTS_KIND


def git_repository(root: Path) -> Path:
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "README.md").write_text("a clone\n")
    return root


@pytest.fixture
def places(tmp_path):
    """A user's folder, a git repository, a small labelled data folder and an (empty) artifacts folder to read."""
    return {"user folder": user_folder(tmp_path / "mine"), "git repository": git_repository(tmp_path / "clone"),
            "data": make_tree(tmp_path / "data", {"cat": 4, "seven": 4}), "artifacts": tmp_path / "artifacts"}


def quick_training(data: Path) -> list[str]:
    """A build of seconds, so that a command that failed to refuse shows what it did instead of running for long."""
    return ["--data-source", f"folder:{data}", "--epochs", "1", "--negatives", "0", "--printed", "0", "--no-plots",
            "--threads", "1"]


def commands(places: dict[str, Path], target: Path) -> dict[str, tuple]:
    """Each command with `target` where it writes: (entry point, argv). Folders for the folder writers, a file
    the user owns inside `target` for the file writers."""
    data, artifacts = places["data"], places["artifacts"]
    owned_file = next(p for p in sorted(target.iterdir()) if p.is_file())
    return {
        "training --out": (training_main, [*quick_training(data), "--out", str(target)]),
        "training enroll --out": (training_main, ["enroll", "--artifacts", str(artifacts), "--data-source",
                                                  f"folder:{data}", "--out", str(target)]),
        "training report --out": (training_main, ["report", str(artifacts), "--out", str(owned_file)]),
        "training report --images --out": (training_main, ["report", str(artifacts), "--images", str(data),
                                                           "--out", str(owned_file)]),
        "training eval --out": (training_main, ["eval", "--artifacts", str(artifacts), "--out", str(owned_file)]),
        "./archive.sh --export-path": (archive.main, ["--artifacts", str(artifacts), "--no-train",
                                                      "--export-path", str(target)]),
    }


def run(entry, argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    try:
        code = entry(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err.strip().splitlines()


COMMANDS = ["training --out", "training enroll --out", "training report --out", "training report --images --out",
            "training eval --out", "./archive.sh --export-path"]


@pytest.mark.parametrize("where", ["user folder", "git repository"])
@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_leaves_a_users_folder_and_a_repository_intact(places, where, command, capsys):
    (places["artifacts"]).mkdir()
    target = places[where]
    before = tree_digest(target)
    entry, argv = commands(places, target)[command]
    code, err = run(entry, argv, capsys)
    assert code == 2, err
    assert len(err) == 1 and "error:" in err[0] and str(target) in err[0], err
    assert tree_digest(target) == before


@pytest.mark.parametrize("command, argv", [
    ("training", [*quick_training(Path("{data}")), "--out", "."]),
    ("enroll", ["enroll", "--artifacts", "{artifacts}", "--data-source", "folder:{data}", "--out", "."]),
    ("archive", ["--artifacts", "{artifacts}", "--no-train", "--export-path", "."]),
])
def test_dot_from_a_users_folder_is_refused(places, monkeypatch, command, argv, capsys):
    places["artifacts"].mkdir()
    mine = places["user folder"]
    before = tree_digest(mine)
    monkeypatch.chdir(mine)
    entry = archive.main if command == "archive" else training_main
    code, err = run(entry, [a.format(**places) for a in argv], capsys)
    assert code == 2 and len(err) == 1 and "is the current directory" in err[0], err
    assert tree_digest(mine) == before


def test_an_output_inside_what_the_command_reads_is_refused(places, capsys):
    data = places["data"]
    before = tree_digest(data)
    code, err = run(training_main, [*quick_training(data), "--out", str(data / "out")], capsys)
    assert code == 2 and len(err) == 1 and f"reads from {data}" in err[0], err
    code, err = run(training_main, ["report", str(data), "--images", str(data), "--out", str(data / "r.html")],
                    capsys)
    assert code == 2 and len(err) == 1 and "reads from" in err[0], err
    assert tree_digest(data) == before


def test_the_library_refuses_too_before_any_work(places):
    """Library callers (the pipeline, bench) get the same refusal from staged_directory and build_artifacts."""
    mine = places["user folder"]
    before = tree_digest(mine)
    with pytest.raises(UsageError, match="did not make"):
        with staged_directory(mine):
            pytest.fail("staged_directory yielded for a folder of the user's files")
    with pytest.raises(UsageError, match="is a git repository"):
        build_artifacts(f"folder:{places['data']}", places["git repository"], TrainConfig(epochs=1, negatives=0,
                                                                                         printed=0), plots=False)
    assert tree_digest(mine) == before
    assert sorted(p.name for p in mine.parent.iterdir() if p.name.startswith(".")) == []  # no staging left


def test_what_training_made_is_marked_and_replaced(tmp_path):
    out = tmp_path / "artifacts"
    with staged_directory(out) as staging:
        (staging / "model.pt").write_bytes(b"first")
    assert marker_kind(out) == ARTIFACTS_KIND  # published with the build
    (out / "train-notes.txt").write_text("a file the marker covers")
    with staged_directory(out) as staging:
        (staging / "model.pt").write_bytes(b"second")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "model.pt"]


def test_a_folder_from_before_the_marker_is_still_replaced(tmp_path):
    out = tmp_path / "artifacts"
    out.mkdir()
    for name in ("model.pt", "index.faiss", "labels.json", "metadata.json", "metrics.json", "train.json",
                 "index.json", "sources.json", "training_curve.png", "confusion_matrix.png", "embeddings_2d.png"):
        (out / name).write_bytes(b"old")
    with staged_directory(out) as staging:
        (staging / "model.pt").write_bytes(b"new")
    assert (out / "model.pt").read_bytes() == b"new" and marker_kind(out) == ARTIFACTS_KIND


def test_archive_names_the_fix_for_an_image_folder_without_destroying_it(places, tmp_path, capsys):
    for folder, fix in ((places["data"], f"--data-source folder:{places['data']} --out <new folder>"),
                        (places["user folder"], "train with --data-source folder:")):
        before = tree_digest(folder)
        code, err = run(archive.main, ["--artifacts", str(folder), "--export-path", str(tmp_path / "store")], capsys)
        assert code in (1, 2) and len(err) == 1 and "it looks like images" in err[0] and fix in err[0], err
        assert f"--out {folder}" not in err[0]
        assert tree_digest(folder) == before


def test_archive_never_suggests_training_into_a_folder_of_other_files(tmp_path, capsys):
    other = tmp_path / "papers"
    other.mkdir()
    (other / "thesis.pdf").write_bytes(b"%PDF")
    code, err = run(archive.main, ["--artifacts", str(other), "--export-path", str(tmp_path / "store")], capsys)
    assert code in (1, 2) and len(err) == 1 and "--out <new folder>" in err[0] and f"--out {other}" not in err[0]
    assert (other / "thesis.pdf").read_bytes() == b"%PDF"


def test_a_bare_image_folder_as_data_source_names_folder(places, tmp_path, capsys):
    """#36 part 4: not 'missing IDX file(s)' but the fix."""
    data = places["data"]
    code, err = run(training_main, ["--data-source", str(data), "--out", str(tmp_path / "new"), "--no-plots"], capsys)
    assert code == 1 and len(err) == 1, err
    assert f"--data-source folder:{data}" in err[0] and "missing IDX" not in err[0]
    assert not (tmp_path / "new").exists()
