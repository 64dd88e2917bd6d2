"""``client predict --out`` and ``client embed --out`` against a real TorchServe: a file the user owns is never
replaced (the command stops on one line and the folder is as it was), while a rerun replaces the command's own
output."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serving.samples import user_digit_png

from settings import REPO

pytestmark = pytest.mark.serving

USER_NPY = io.BytesIO()
np.save(USER_NPY, np.arange(6, dtype=np.float32).reshape(2, 3), allow_pickle=False)
#: (command, format, the file the user already has there, its bytes)
USER_FILES = [
    ("predict", "jsonl", "answers.jsonl", b'{"image": "a.png", "label": 3}\n'),
    ("predict", "csv", "answers.csv", b"image,label\na.png,3\n"),
    ("predict", "json", "answers.json", b'[\n{"image": "a.png", "pred": "3"}\n]\n'),
    ("embed", None, "e.npy", USER_NPY.getvalue()),
    ("embed", None, "e.files.json", b'{"files": ["a.png"], "count": 1}\n'),
]


@pytest.fixture(scope="module")
def images(tmp_path_factory, prepared_sample) -> Path:
    folder = tmp_path_factory.mktemp("digits")
    for i in range(3):
        (folder / f"digit_{i}.png").write_bytes(user_digit_png(prepared_sample.test_images[i]))
    return folder


def client(torchserve, command: str, images: Path, out: Path, fmt: str | None) -> subprocess.CompletedProcess:
    args = [command, str(images), "--out", str(out), "--url", torchserve.endpoints.inference, "--key-file",
            str(torchserve.key_file), "--no-progress", *(["--format", fmt] if fmt else [])]
    return subprocess.run([sys.executable, "-m", "client", *args], capture_output=True, text=True, cwd=out.parent,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, timeout=120)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir()}


@pytest.mark.parametrize("command,fmt,name,content", USER_FILES, ids=[f[2] for f in USER_FILES])
def test_a_users_file_is_never_replaced(torchserve, images, tmp_path, command, fmt, name, content):
    (tmp_path / name).write_bytes(content)
    before = snapshot(tmp_path)
    out = tmp_path / ("e.npy" if command == "embed" else name)
    result = client(torchserve, command, images, out, fmt)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("client: error: --out") and "exists and was not written by this command" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "json"])
def test_a_rerun_replaces_predicts_own_output(torchserve, images, tmp_path, fmt):
    out = tmp_path / f"answers.{fmt}"
    first = client(torchserve, "predict", images, out, fmt)
    assert first.returncode == 0, first.stderr
    written = out.read_bytes()
    out.write_bytes(written.replace(b"digit_0", b"digit_9"))  # a change that the rerun must undo
    second = client(torchserve, "predict", images, out, fmt)
    assert second.returncode == 0, second.stderr
    assert out.read_bytes() == written and sorted(snapshot(tmp_path)) == [out.name]


def test_a_rerun_replaces_embeds_own_output(torchserve, images, tmp_path):
    out = tmp_path / "e.npy"
    assert client(torchserve, "embed", images, out, None).returncode == 0
    matrix = np.load(out, allow_pickle=False)
    np.save(out, np.zeros_like(matrix), allow_pickle=False)
    second = client(torchserve, "embed", images, out, None)
    assert second.returncode == 0, second.stderr
    np.testing.assert_array_equal(np.load(out, allow_pickle=False), matrix)
    assert sorted(snapshot(tmp_path)) == ["e.files.json", "e.npy"]


@pytest.mark.parametrize("command", ["predict", "embed"])
def test_an_output_inside_the_images_it_reads_is_refused(torchserve, images, command):
    before = snapshot(images)
    result = client(torchserve, command, images, images / ("e.npy" if command == "embed" else "answers.jsonl"), None)
    assert result.returncode == 2 and f"the command reads from {images}" in result.stderr
    assert snapshot(images) == before
