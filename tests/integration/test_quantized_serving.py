"""The int8 model (model.pt2, an AOTInductor package) packed by the project's archiver and served by both local
runtimes: a real TorchServe, whose Java frontend hands the archive to a Python worker, and the python runtime, whose
worker processes open the same .mar. Each worker loads the package in its own process and answers byte for byte as
the service does in-process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from handler.service import EmbeddingService
from serving import python_server
from serving.archive import build_mar
from serving.samples import held_out_digits, user_digit_png
from serving.server import private_instance, start, stop

pytestmark = pytest.mark.serving

STARTS = {"torchserve": start, "python": python_server.start}


@contextlib.contextmanager
def served(artifacts: Path, workdir: Path, runtime: str) -> Iterator["EmbeddingClient"]:  # noqa: F821
    from client import EmbeddingClient

    store = workdir / "store"
    store.mkdir(parents=True)
    build_mar(artifacts, store)
    instance = private_instance(workdir / runtime)
    try:
        STARTS[runtime](instance, store, timeout=180)
        with EmbeddingClient(instance.endpoints.inference, token=instance.keys()["inference"]) as client:
            yield client
    finally:
        stop(instance)


@pytest.fixture(scope="module", params=tuple(STARTS))
def int8_client(request, tiny_int8_artifacts, tmp_path_factory):
    with served(tiny_int8_artifacts, tmp_path_factory.mktemp(f"int8-{request.param}"), request.param) as client:
        yield client


def test_the_int8_archive_serves_the_answers_of_the_int8_service(int8_client, tiny_int8_artifacts):
    bodies = [user_digit_png(canvas) for canvas in held_out_digits()]
    served_answers = int8_client.predict_batch(bodies)
    local, _ = EmbeddingService.from_dir(tiny_int8_artifacts).answer(bodies)
    assert sum(a["pred"] == str(digit) for digit, a in enumerate(served_answers)) >= 9, served_answers
    # The same JSON, labels, distances, flags and model digest, plus the archive's version that the server adds.
    assert served_answers == [{**answer, "model_version": "1.0"} for answer in local]
