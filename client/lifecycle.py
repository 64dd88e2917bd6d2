"""Model versions on a running TorchServe, through its management API and the management token.

TorchServe serves several versions of one model side by side (``/predictions/embedding/2.0``); one
of them is the default that ``/predictions/embedding`` answers with. What needs what:

- ``status``, ``list``, ``set-default`` and ``scale`` (GET/PUT) work on any server.
- ``register`` and ``unregister`` (POST/DELETE /models) need ``enable_model_api=true``, which the
  project's config.properties keeps off so nobody can load code into the server over HTTP. Two ways:

  1. Start every version at once with the model API off: put each version's archive in the model
     store under its own file name (``embedding.mar``, ``embedding-2.0.mar``) and list both in
     ``load_models`` (or pass ``models="embedding.mar,embedding-2.0.mar"`` to ``serving.server.start``);
     then switch and roll back with ``set-default``. The first archive listed becomes the default.
  2. For a server started for version operations, write a lifecycle config (a copy of
     config.properties with only ``enable_model_api=true`` changed) with
     ``python -m client lifecycle-config --out run/lifecycle.properties`` and start TorchServe with it.

Rollback is ``set-default <previous version>``: the old version keeps its workers until it is
unregistered, so switching back is immediate.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from settings import CONFIG_FILE, read_properties, write_properties
from torchserve_api.management import (MODEL_API_HINT, ManagementClient, ModelStatus, VersionStatus, Worker,
                                       mar_manifest)

__all__ = ["MODEL_API_HINT", "ManagementClient", "ModelStatus", "VersionStatus", "Worker", "mar_manifest",
           "lifecycle_properties", "write_lifecycle_config"]

#: The first line of every lifecycle config: what lets a later run replace the file, and nothing else.
HEADER = "# written by python -m client lifecycle-config: a copy of its --base with the model API on\n"


def lifecycle_properties(base: Path = CONFIG_FILE) -> dict[str, str]:
    """``base`` with the model API on: everything else (tokens, loopback addresses, limits) unchanged."""
    props = read_properties(base)
    props["enable_model_api"] = "true"
    return props


def write_lifecycle_config(out: Path, base: Path = CONFIG_FILE) -> Path:
    """Write the lifecycle config to `out` (a new file, or one this function wrote: never another file, nor
    `base`), by rename, so an interrupted write leaves no partial config."""
    from owned_paths import replaceable_file, starts_with

    out = Path(out)
    replaceable_file(out, "--out", ours=starts_with(HEADER.encode()), reads=[base])
    out.parent.mkdir(parents=True, exist_ok=True)
    props = lifecycle_properties(base)
    store = props.get("model_store")
    if store and not Path(store).is_absolute():  # keep the store the base config meant, wherever `out` lives
        props["model_store"] = str((Path(base).resolve().parent / store).resolve())
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    os.close(fd)
    try:
        write_properties(props, Path(name))
        Path(name).write_text(HEADER + Path(name).read_text())
        os.replace(name, out)
    finally:
        Path(name).unlink(missing_ok=True)
    return out
