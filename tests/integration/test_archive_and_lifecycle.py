"""./archive.sh and the start/stop commands: clear failures, atomic outputs, nothing left running."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import psutil
import pytest
from serving.server import PID_FILE, LocalServerError, private_instance, start, stop

from handler.artifacts import sha256_file
from serving.archive import PARTIAL_PREFIX, ArchiveError, build_mar
from settings import MODEL_VERSION, REPO

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def run_archive(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "archive.sh"), *args], capture_output=True, text=True, env=ENV, timeout=300)


def torchserve_processes(workdir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = proc.info.get("environ") or {}
            if env.get("TMPDIR", "").startswith(str(workdir)):
                found.append(proc)
        except psutil.Error:
            pass
    return found


@pytest.mark.parametrize("version, name, recorded", [(None, "embedding.mar", MODEL_VERSION),
                                                     ("2.0", "embedding-2.0.mar", "2.0")])
@pytest.mark.serving
def test_archive_sh_packs_handler_artifacts_and_config(tiny_artifacts, tmp_path, version, name, recorded):
    """The default version keeps embedding.mar (the quick start's and TorchServe's name); a version given names the
    file, so versions sit side by side in one model store without renaming by hand."""
    result = run_archive("--artifacts", str(tiny_artifacts), "--export-path", str(tmp_path),
                         *(["--model-version", version] if version else []))
    assert result.returncode == 0, result.stderr
    mar = tmp_path / name
    assert sha256_file(mar) in result.stdout and "MB" in result.stdout
    with zipfile.ZipFile(mar) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
    assert {"model.pt", "index.faiss", "labels.json", "sources.json", "metadata.json", "model-config.yaml",
            "embedding_handler.py", "handler/preprocessing.py", "handler/search.py"} <= names
    assert manifest["model"]["modelVersion"] == recorded
    assert manifest["model"]["handler"] == "embedding_handler.py"
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary left, no marker in the model store


@pytest.mark.parametrize("args,code,message", [
    (["--artifacts", "/nonexistent/artifacts"], 2, "--artifacts /nonexistent/artifacts: no such folder"),
    (["--model-name", "bad name!"], 2, "invalid model name"),
    (["--artifacts", "."], 1, "no training artifacts"),  # an existing folder without a build: never trained into
])
@pytest.mark.serving
def test_archive_sh_fails_with_one_line(tmp_path, args, code, message, tiny_artifacts):
    if "--artifacts" not in args:
        args = [*args, "--artifacts", str(tiny_artifacts)]
    result = run_archive(*args, "--export-path", str(tmp_path))
    assert result.returncode == code
    lines = [line for line in result.stderr.splitlines() if line.startswith("archive:")]
    assert len(lines) == 1 and message in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_archive_sh_rejects_unknown_flag():
    result = run_archive("--bogus")
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr


def test_archive_sh_reports_missing_java(tiny_artifacts, tmp_path):
    env = dict(ENV, PATH="/usr/local/bin/none")
    result = subprocess.run([sys.executable, "-m", "serving.archive", "--artifacts", str(tiny_artifacts),
                             "--export-path", str(tmp_path)], capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 1 and "java not found" in result.stderr


def test_failed_build_leaves_previous_archive_intact(tiny_artifacts, tmp_path):
    store = tmp_path / "store"
    good = build_mar(tiny_artifacts, store)
    before = sha256_file(good)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_artifacts, broken)
    (broken / "index.faiss").write_bytes(b"tampered")
    with pytest.raises(ArchiveError, match="index.faiss"):
        build_mar(broken, store)
    assert sha256_file(good) == before
    assert [p.name for p in store.iterdir()] == ["embedding.mar"]


def old_archive(path: Path) -> bytes:
    """An earlier model archive at `path` (a zip with MAR-INF/MANIFEST.json, as torch-model-archiver writes)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelVersion": "0.9"}}))
    return path.read_bytes()


def test_build_mar_replaces_an_archive_and_nothing_else(tiny_artifacts, tmp_path):
    """A file of the user's named like the archive stays; an earlier archive is replaced (library callers too)."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "embedding.mar").write_bytes(b"my own file")
    with pytest.raises(ArchiveError, match="is not a model archive"):
        build_mar(tiny_artifacts, store)
    assert (store / "embedding.mar").read_bytes() == b"my own file"
    old = old_archive(store / "embedding-2.0.mar")
    built = build_mar(tiny_artifacts, store, version="2.0", file_name="embedding-2.0.mar")
    assert built == store / "embedding-2.0.mar" and built.read_bytes() != old
    assert sorted(p.name for p in store.iterdir()) == ["embedding-2.0.mar", "embedding.mar"]


def test_archive_sh_writes_into_a_model_store_of_archives_only(tiny_artifacts, tmp_path, capsys):
    """A store of archives (and what a killed build left) is written to; one holding anything else is refused
    with one line, and stays as it was."""
    import serving.archive as archive

    store = tmp_path / "store"
    (store / f"{PARTIAL_PREFIX}embedding-killed").mkdir(parents=True)
    old_archive(store / "embedding-0.9.mar")
    assert archive.main(["--artifacts", str(tiny_artifacts), "--export-path", str(store)]) == 0
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) == ["embedding-0.9.mar",
                                                                                    "embedding.mar"]
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "notes.txt").write_text("mine")
    old_archive(mixed / "embedding.mar")
    capsys.readouterr()
    assert archive.main(["--artifacts", str(tiny_artifacts), "--export-path", str(mixed)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--export-path" in err[0] and "did not make" in err[0]
    assert sorted(p.name for p in mixed.iterdir()) == ["embedding.mar", "notes.txt"]


@pytest.mark.serving
def test_start_reports_a_taken_port_and_leaves_nothing_running(model_store, tmp_path):
    instance = private_instance(tmp_path / "ts")
    port = instance.endpoints.ports()["inference"]
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        with pytest.raises(LocalServerError, match=f"port {port} \\(inference\\) is already in use"):
            start(instance, model_store)
    assert instance.pid() is None and torchserve_processes(instance.workdir) == []


@pytest.mark.serving
def test_start_reports_missing_archive(tmp_path):
    instance = private_instance(tmp_path / "ts")
    with pytest.raises(LocalServerError, match="embedding.mar not found"):
        start(instance, tmp_path / "empty-store")


@pytest.mark.serving
def test_stop_leaves_no_process_and_start_recovers_from_a_killed_frontend(model_store, tmp_path):
    instance = private_instance(tmp_path / "ts")
    start(instance, model_store)
    frontend = psutil.Process(instance.pid())
    workers = frontend.children(recursive=True)
    assert workers, "TorchServe should have started worker processes"
    frontend.kill()  # the frontend dies without cleaning up its pid file
    frontend.wait(10)
    psutil.wait_procs(workers, timeout=20)
    assert (instance.tmpdir / PID_FILE).exists() and instance.pid() is None
    start(instance, model_store)  # detects the stale state and starts cleanly
    assert instance.pid() is not None
    assert stop(instance) is True
    assert torchserve_processes(instance.workdir) == []
    assert stop(instance) is False


@pytest.mark.parametrize("when", ["before", "after"])
def test_ctrl_c_says_truthfully_whether_the_new_archive_was_published(tiny_artifacts, tmp_path, monkeypatch, capsys,
                                                                       when):
    """Ctrl-C in the last moments of ./archive.sh may land after the rename: the message must say which."""
    import signal

    import serving.archive as archive

    store = tmp_path / "store"
    store.mkdir()
    old = old_archive(store / "embedding.mar")

    def build_then_interrupt(artifacts, export_path, *args, **kwargs):
        if when == "after":
            fresh = export_path / ".fresh"
            fresh.write_bytes(b"new")
            fresh.replace(export_path / "embedding.mar")
        raise KeyboardInterrupt

    monkeypatch.setattr(archive, "build_mar", build_then_interrupt)
    monkeypatch.setattr(archive, "_java_ok", lambda: True)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    assert archive.main(["--no-train", "--artifacts", str(tiny_artifacts), "--export-path", str(store)]) == 130
    err = capsys.readouterr().err
    if when == "before":
        assert "model store left as it was" in err and (store / "embedding.mar").read_bytes() == old
    else:
        assert f"interrupted after the new archive was published to {store / 'embedding.mar'}" in err
