"""`python -m bench queue` against a real RabbitMQ node and a real TorchServe."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.queue import main as queue_main
from serving.samples import user_digit_png


@pytest.mark.serving
def test_bench_measures_both_paths(torchserve, rabbitmq, prepared_sample, tmp_path, capsys):
    images = []
    for digit in range(3):
        path = tmp_path / f"digit_{digit}.png"
        path.write_bytes(user_digit_png(prepared_sample.test_images[int(np.flatnonzero(
            prepared_sample.test_labels == digit)[0])]))
        images.append(path)
    assert queue_main(["--url", rabbitmq, "--inference-url", torchserve.endpoints.inference,
                       "--key-file", str(torchserve.key_file), "--requests", "40", "--concurrency", "4",
                       "--images", *map(str, images)]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [f["mode"] for f in figures] == ["direct REST", "queue (1 bridge)"]
    assert all(f["errors"] == 0 and f["rps"] > 0 and f["p99_ms"] >= f["p50_ms"] for f in figures)
