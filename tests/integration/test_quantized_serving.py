"""An int8 model (`python -m training --quantize int8`) packed by the project's archiver and served by a real
TorchServe: the worker loads the quantized TorchScript model in its own process and answers as the service does
in-process."""

from __future__ import annotations

import numpy as np
import pytest

from handler.service import EmbeddingService
from serving.samples import held_out_digits, user_digit_png
from support.torchserve import serving_client

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def int8_client(tiny_int8_artifacts, tmp_path_factory):
    with serving_client(tiny_int8_artifacts, tmp_path_factory.mktemp("int8")) as client:
        yield client


def test_the_int8_archive_serves_the_answers_of_the_int8_service(int8_client, tiny_int8_artifacts):
    client = int8_client
    bodies = [user_digit_png(canvas) for canvas in held_out_digits()]
    served = client.predict_batch(bodies)
    local, _ = EmbeddingService.from_dir(tiny_int8_artifacts).answer(bodies)
    assert [a["pred"] for a in served] == [a["pred"] for a in local]
    assert sum(a["pred"] == str(digit) for digit, a in enumerate(served)) >= 9, served
    for got, want in zip(served, local):
        assert [n["label"] for n in got["neighbours"]] == [n["label"] for n in want["neighbours"]]
        np.testing.assert_allclose([n["dist"] for n in got["neighbours"]], [n["dist"] for n in want["neighbours"]],
                                   atol=1e-5)
