"""Private TorchServe instances for tests: the project's config on free loopback ports, in their own workdir."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from serving.server import Instance, private_instance, start, stop

if TYPE_CHECKING:
    from client import EmbeddingClient


def torchserve_processes(workdir: Path) -> list[psutil.Process]:
    """Processes started with a TMPDIR under `workdir` (the launcher, the frontend and its workers)."""
    found = []
    for proc in psutil.process_iter(["environ"]):
        if (proc.info.get("environ") or {}).get("TMPDIR", "").startswith(str(workdir)):
            found.append(proc)
    return found


@contextlib.contextmanager
def running_instance(workdir: Path, store: Path, front: bool = True, **overrides: str) -> Iterator[Instance]:
    """A private TorchServe serving `store` (behind serving.front unless `front` is False); stopped afterwards,
    even on failure."""
    instance = private_instance(workdir, **overrides)
    try:
        start(instance, store, timeout=120, front=front)
        yield instance
    finally:
        stop(instance)


@contextlib.contextmanager
def serving_client(artifacts: Path, workdir: Path) -> Iterator["EmbeddingClient"]:
    """An EmbeddingClient (inference token set) to a private TorchServe serving `artifacts`, archived by the
    project's archiver into workdir/store; stopped afterwards."""
    from client import EmbeddingClient
    from serving.archive import build_mar

    store = workdir / "store"
    store.mkdir(parents=True)
    build_mar(artifacts, store)
    with running_instance(workdir / "ts", store) as instance:
        with EmbeddingClient(instance.endpoints.inference, token=instance.keys()["inference"]) as client:
            yield client
