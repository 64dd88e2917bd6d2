"""An int8 model (`python -m training --quantize int8`) packed by the project's archiver and served by a real
TorchServe: the worker loads the quantized TorchScript model in its own process and answers as the service does
in-process."""

from __future__ import annotations

import numpy as np
import pytest

from client import EmbeddingClient
from handler.service import EmbeddingService
from serving.archive import build_mar
from serving.samples import held_out_digits, user_digit_png
from support.torchserve import running_instance

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def int8_client(tiny_int8_artifacts, tmp_path_factory):
    store = tmp_path_factory.mktemp("int8-store")
    build_mar(tiny_int8_artifacts, store)
    with running_instance(tmp_path_factory.mktemp("int8-ts"), store) as instance:
        with EmbeddingClient(instance.endpoints.inference, token=instance.keys()["inference"]) as client:
            yield client, instance


def test_the_int8_archive_serves_the_answers_of_the_int8_service(int8_client, tiny_int8_artifacts):
    client, _ = int8_client
    bodies = [user_digit_png(canvas) for canvas in held_out_digits()]
    served = client.predict_batch(bodies)
    local, _ = EmbeddingService.from_dir(tiny_int8_artifacts).answer(bodies)
    assert [a["pred"] for a in served] == [a["pred"] for a in local]
    assert sum(a["pred"] == str(digit) for digit, a in enumerate(served)) >= 9, served
    for got, want in zip(served, local):
        assert [n["label"] for n in got["neighbours"]] == [n["label"] for n in want["neighbours"]]
        np.testing.assert_allclose([n["dist"] for n in got["neighbours"]], [n["dist"] for n in want["neighbours"]],
                                   atol=1e-5)
