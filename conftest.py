"""Shared, session-scoped fixtures for tests/ and bench/tests: one tiny trained model, its archive, a real
TorchServe, and the markers every test gets from its directory and fixtures.

It sits at the repository root so that the whole suite builds each session fixture once, whichever of the two
trees asks for it first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))  # `support`: the helpers beside the tests

import torch  # noqa: E402

from serving.server import free_ports  # noqa: E402
from settings import REPO  # noqa: E402
from support.torchserve import running_instance  # noqa: E402

RABBITMQ_SCRIPT = REPO / "scripts" / "rabbitmq.sh"

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TINY_EPOCHS = 2

#: Fixtures that start a TorchServe (Java) or a RabbitMQ node. A test using one, directly or through another
#: fixture, gets the marker, so `-m "not serving"` and `-m "not rabbitmq"` select by what a test really needs.
#: (`server` is test_security's own TorchServe.)
MARKER_FIXTURES = {
    "serving": {"torchserve", "fault_server", "corpus_run", "served", "e2e_instance", "server", "local_run",
                "killed_archive"},
    "rabbitmq": {"rabbitmq"},
}


#: Tests are laid out by kind; each directory's tests carry its name as a marker (`-m unit` runs in seconds).
KINDS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = Path(str(item.fspath)).parent.name
        if kind in KINDS:
            item.add_marker(kind)
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in MARKER_FIXTURES.items():
            if used & fixtures:
                item.add_marker(marker)
    # The files that use the shipped model run last, whole (module fixtures stay set up once): its training, started
    # at collection (pytest_collection_finish), then overlaps every other test instead of holding up the first one.
    product_files = {item.fspath for item in items if "product_artifacts" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: item.fspath in product_files)


#: The background run of support.exam_prefetch: (its output folder, its process), once started.
_PREFETCH: dict[str, object] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start training the shipped model (when not cached) and making the served exams' uploads when the session
    will run tests that need them: in the background, while the first tests mostly wait."""
    if any("product_artifacts" in getattr(item, "fixturenames", ()) for item in session.items):
        from support.product_model import start_training

        _PREFETCH["training"] = start_training()
    if any(item.nodeid.startswith("tests/integration/test_product_quality.py") and "served_endpoint" in item.name
           for item in session.items):
        from support.exam_prefetch import start

        out = Path(tempfile.mkdtemp(prefix="exam-prefetch-"))
        _PREFETCH.update(out=out, process=start(out))


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = _PREFETCH.get("out")
    for process in (_PREFETCH.get("process"), _PREFETCH.get("training")):
        if isinstance(process, subprocess.Popen) and process.poll() is None:
            process.kill()
            process.wait()
    if isinstance(out, Path):
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="session")
def exam_items():
    """exam_items(name) -> the items of support.photo_set's exam `name` for the test's count (made ahead when
    support.exam_prefetch ran in the background, else here)."""
    from support.exam_prefetch import count, items

    def get(name: str) -> list:
        return items(name, count(name), _PREFETCH.get("out"), _PREFETCH.get("process"))
    return get


@pytest.fixture(scope="session")
def prepared_sample():
    """The bundled MNIST sample after the shared preprocessing (4,000 / 1,000 canvases)."""
    from training.steps import prepare_data

    return prepare_data("mnist-sample")


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory, prepared_sample) -> Path:
    """A real, quickly trained float artifact directory (2 epochs on the bundled sample, no plots, with model.onnx):
    ``quantize="none"``, since a digit build defaults to int8 (tiny_int8_artifacts)."""
    from training.steps import build_gallery, evaluate_and_finalize, train_and_export
    from training.train import TrainConfig

    out = tmp_path_factory.mktemp("artifacts")
    config = TrainConfig(epochs=TINY_EPOCHS, embedding_dim=32, width=16, seed=0, quantize="none")
    train_and_export(prepared_sample, config, out, log=lambda _: None)
    build_gallery(prepared_sample, out, log=lambda _: None)
    evaluate_and_finalize(prepared_sample, out, plots=False, log=lambda _: None)
    return out


@pytest.fixture(scope="session")
def tiny_int8_artifacts(tmp_path_factory, prepared_sample) -> Path:
    """tiny_artifacts' recipe with ``quantize="int8"``: model.pt2 is the int8 network (an AOTInductor package), the
    gallery built with it."""
    from training.steps import build_gallery, evaluate_and_finalize, train_and_export
    from training.train import TrainConfig

    out = tmp_path_factory.mktemp("artifacts-int8")
    config = TrainConfig(epochs=TINY_EPOCHS, embedding_dim=32, width=16, seed=0, quantize="int8")
    train_and_export(prepared_sample, config, out, log=lambda _: None)
    build_gallery(prepared_sample, out, log=lambda _: None)
    evaluate_and_finalize(prepared_sample, out, plots=False, log=lambda _: None)
    return out


@pytest.fixture(scope="session")
def model_store(tmp_path_factory, tiny_artifacts) -> Path:
    """A model store holding embedding.mar built by the project's archiver."""
    from serving.archive import build_mar

    store = tmp_path_factory.mktemp("model_store")
    build_mar(tiny_artifacts, store)
    return store


@pytest.fixture(scope="session")
def torchserve(tmp_path_factory, model_store):
    """A real TorchServe serving the tiny archive; stopped at the end of the session, even on failure."""
    with running_instance(tmp_path_factory.mktemp("torchserve"), model_store) as instance:
        yield instance


@pytest.fixture(scope="module")
def loaded(tiny_artifacts):
    """The handler initialised on the tiny artifacts, with its TorchServe Context."""
    from handler.embedding_handler import EmbeddingHandler
    from support.handler_context import make_context

    context = make_context(tiny_artifacts)
    handler = EmbeddingHandler()
    handler.initialize(context)
    return handler, context


@pytest.fixture(scope="session")
def product_artifacts() -> Path:
    """The model the quick start ships (trained once per code change; see support/product_model.py)."""
    from support.product_model import product_artifacts

    return product_artifacts(_PREFETCH.get("training"))


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory) -> Iterator[str]:
    """A private RabbitMQ node on free loopback ports (installed first if missing); stopped at the end."""
    data_dir = tmp_path_factory.mktemp("rabbitmq")
    amqp, dist, epmd = free_ports(3)
    cmd = [str(RABBITMQ_SCRIPT), "start", "--dir", str(data_dir), "--port", str(amqp),
           "--node", f"test{uuid.uuid4().hex[:8]}", "--dist-port", str(dist), "--epmd-port", str(epmd)]
    try:
        started = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
        if started.returncode != 0:
            pytest.fail(f"rabbitmq.sh start failed: {started.stderr[-2000:]}")
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(RABBITMQ_SCRIPT), "stop", "--dir", str(data_dir)], check=False, capture_output=True,
                       timeout=120)
