"""serving.archive.build_mar keeps torch-model-archiver out of $TMPDIR/<model name>, where it stages the files
after deleting whatever is there: that took a user's /tmp/embedding, and broke two builds running at once (the
suite's two pytest processes, once: labels.json vanished from under one of them)."""

from __future__ import annotations

import zipfile

from serving.archive import build_mar


def test_the_archivers_staging_folder_is_the_builds_own(tiny_artifacts, tmp_path, monkeypatch):
    shared = tmp_path / "tmp"
    (shared / "embedding").mkdir(parents=True)
    (shared / "embedding" / "labels.json").write_text("a user's file, or another build's")
    monkeypatch.setenv("TMPDIR", str(shared))
    mar = build_mar(tiny_artifacts, tmp_path / "store")
    assert (shared / "embedding" / "labels.json").read_text() == "a user's file, or another build's"
    with zipfile.ZipFile(mar) as archive:
        assert archive.read("labels.json") == (tiny_artifacts / "labels.json").read_bytes()
    assert [p.name for p in (tmp_path / "store").iterdir()] == ["embedding.mar"]  # the staging went with the build
