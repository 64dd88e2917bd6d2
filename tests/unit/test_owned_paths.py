"""owned_paths: a command replaces only what it made, and refuses every path a user owns."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cli_common import UsageError
from owned_paths import mark, marker_kind, replaceable_dir, replaceable_file, starts_with


def _user_folder(root: Path) -> Path:
    (root / "7").mkdir(parents=True)
    (root / "7" / "digit_7.png").write_bytes(b"\x89PNG user image")
    (root / "notes.txt").write_text("mine")
    return root


def test_missing_and_empty_folders_may_be_written(tmp_path):
    assert replaceable_dir(tmp_path / "new", "artifacts", "--out") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert replaceable_dir(tmp_path / "empty", "artifacts", "--out") == tmp_path / "empty"


def test_a_folder_of_user_files_is_refused(tmp_path):
    folder = _user_folder(tmp_path / "mine")
    with pytest.raises(UsageError, match="did not make") as info:
        replaceable_dir(folder, "artifacts", "--out")
    assert "\n" not in str(info.value) and "--out" in str(info.value)


def test_a_marked_folder_of_the_same_kind_may_be_replaced(tmp_path):
    folder = tmp_path / "artifacts"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"x")
    mark(folder, "artifacts", "python -m training")
    assert marker_kind(folder) == "artifacts"
    assert replaceable_dir(folder, "artifacts", "--out") == folder
    with pytest.raises(UsageError):
        replaceable_dir(folder, "model-store", "--export-path")


def test_legacy_folders_are_recognised_by_their_names_only(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    for name in ("model.pt", "metadata.json", "confusion.png"):
        (folder / name).write_bytes(b"x")
    assert replaceable_dir(folder, "artifacts", "--out", known=("model.pt", "metadata.json", "*.png"))
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(UsageError):
        replaceable_dir(folder, "artifacts", "--out", known=("model.pt", "metadata.json", "*.png"))


@pytest.mark.parametrize("which", ["cwd", "parent of cwd", "home", "root"])
def test_places_that_are_never_replaced(tmp_path, monkeypatch, which):
    work = tmp_path / "work"
    work.mkdir()
    mark(work, "artifacts", "test")  # even a marker does not make these replaceable
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    target = {"cwd": Path("."), "parent of cwd": Path(".."), "home": tmp_path / "home", "root": Path("/")}[which]
    with pytest.raises(UsageError):
        replaceable_dir(target, "artifacts", "--out")


def test_a_git_repository_is_refused_even_when_marked(tmp_path):
    repo = tmp_path / "clone"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    mark(repo, "artifacts", "test")
    with pytest.raises(UsageError, match="git repository"):
        replaceable_dir(repo, "artifacts", "--out")


def test_what_the_command_reads_is_refused_inside_and_above(tmp_path):
    images = _user_folder(tmp_path / "images")
    with pytest.raises(UsageError, match="reads from"):
        replaceable_dir(images / "out", "artifacts", "--out", reads=[images])
    with pytest.raises(UsageError, match="reads from"):
        replaceable_dir(tmp_path, "artifacts", "--out", reads=[images])
    assert replaceable_dir(tmp_path / "elsewhere", "artifacts", "--out", reads=[images, None, ""])


def test_files_are_replaced_only_when_recognised(tmp_path):
    page = tmp_path / "report.html"
    assert replaceable_file(page, "--out") == page
    page.write_text("<!doctype html><!-- mine -->")
    with pytest.raises(UsageError, match="not written by this command"):
        replaceable_file(page, "--out", starts_with(b"<!-- embedding report -->"))
    page.write_text("<!-- embedding report -->\n<html>")
    assert replaceable_file(page, "--out", starts_with(b"<!-- embedding report -->")) == page
    with pytest.raises(UsageError, match="is a folder"):
        replaceable_file(tmp_path, "--out")
    with pytest.raises(UsageError, match="reads from"):
        replaceable_file(page, "--out", starts_with(b"<!--"), reads=[page])
