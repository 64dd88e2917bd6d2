"""Private TorchServe instances for tests: the project's config on free loopback ports, in their own workdir."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from serving.server import Instance, private_instance, start, stop


@contextlib.contextmanager
def running_instance(workdir: Path, store: Path, **overrides: str) -> Iterator[Instance]:
    """A private TorchServe serving `store`; stopped afterwards, even on failure."""
    instance = private_instance(workdir, **overrides)
    try:
        start(instance, store, timeout=120)
        yield instance
    finally:
        stop(instance)
