"""python -m client predict over a nested folder against a real TorchServe: batched requests, a corrupt file that
fails alone, CSV rows in folder order, the summary and the exit code."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serving.samples import user_digit_png

from client import EmbeddingClient
from settings import REPO

pytestmark = pytest.mark.serving

PER_DIGIT = 3


@pytest.fixture(scope="module")
def nested(tmp_path_factory, prepared_sample) -> tuple[Path, dict[str, bytes]]:
    """root/<digit>/NN.png, every third one a level deeper, one corrupt PNG, and files the walk skips."""
    root = tmp_path_factory.mktemp("nested")
    files: dict[str, bytes] = {}
    for digit in range(10):
        for n, index in enumerate(np.flatnonzero(prepared_sample.test_labels == digit)[:PER_DIGIT]):
            name = f"{digit}/deeper/{n:02d}.png" if n == 2 else f"{digit}/{n:02d}.png"
            files[name] = user_digit_png(prepared_sample.test_images[index])
    files["4/01b.png"] = b"\x89PNG\r\n\x1a\n-truncated"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "4" / "notes.txt").write_text("not an image")
    (root / ".thumbs").mkdir()
    (root / ".thumbs" / "x.png").write_bytes(files["4/00.png"])
    return root, files


def test_predict_a_nested_folder_as_csv_in_batches(torchserve, nested, tmp_path):
    root, files = nested
    result = subprocess.run([sys.executable, "-m", "client", "predict", str(root), "--format", "csv", "--batch-size",
                             "16", "--url", torchserve.endpoints.inference, "--key-file", str(torchserve.key_file),
                             "--no-progress"], capture_output=True, text=True, cwd=tmp_path, timeout=180,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 5, result.stderr
    assert result.stdout.splitlines()[0] == "image,pred,dist,confidence,unknown,reason,nearest_label,neighbours,error,status"
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    names = [Path(row["image"]).relative_to(root).as_posix() for row in rows]
    assert names == sorted(files, key=lambda name: name.split("/"))
    by_name = dict(zip(names, rows))
    corrupt = by_name.pop("4/01b.png")
    assert corrupt["pred"] == "" and corrupt["status"] == "400" and corrupt["error"]
    assert all(row["error"] == "" and row["neighbours"].startswith("[{") for row in by_name.values())
    correct = sum(row["pred"] == name.split("/")[0] for name, row in by_name.items())
    assert correct >= 0.8 * len(by_name)

    with EmbeddingClient(torchserve.endpoints.inference, token=torchserve.keys()["inference"]) as client:
        alone = {name: client.predict(files[name]) for name in by_name}
    assert {name: row["pred"] or None for name, row in by_name.items()} == {n: a["pred"] for n, a in alone.items()}

    lines = result.stderr.splitlines()
    assert f"client: failed: {root / '4' / '01b.png'}: {corrupt['error']} (HTTP 400)" in lines
    unknown = sum(row["unknown"] == "true" for row in by_name.values())
    labels: dict[str, int] = {}
    for row in by_name.values():
        if row["unknown"] == "false":
            labels[row["pred"]] = labels.get(row["pred"], 0) + 1
    assert lines[-2:] == [f"summary: {len(rows)} images, {len(by_name) - unknown} with a label, {unknown} unknown "
                          "(open-set rejects), 1 failed",
                          "by label: " + ", ".join(f"{label}: {n}" for label, n in sorted(labels.items()))]
