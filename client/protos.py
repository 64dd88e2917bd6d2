"""TorchServe's gRPC stubs, generated on first use from the protos inside the installed model-server.jar.

The .proto files ship only inside TorchServe's Java frontend (``ts/frontend/model-server.jar``), so
nothing is vendored: the first gRPC call extracts ``proto/inference.proto`` and
``proto/management.proto``, compiles them with ``grpc_tools.protoc`` and caches the Python modules
under ``$XDG_CACHE_HOME/mnist-embedding/grpc/`` (``~/.cache`` by default), keyed by the TorchServe
and grpcio-tools versions (generated code must match the protobuf runtime that imports it).
Generation happens in a private temporary directory renamed into place, so concurrent first calls
and interrupted runs never leave a half-written cache. ``google.rpc.status_pb2`` (imported by the
generated code) comes from googleapis-common-protos.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import settings

#: Package name the stubs are generated under: unique, so it cannot shadow proto-plus's ``proto``.
PACKAGE = "ts_grpc_stubs"
PROTOS = ("inference", "management")
CACHE_ENV = "EMBEDDING_GRPC_CACHE"

_lock = threading.Lock()
_loaded: "Stubs | None" = None


class StubError(RuntimeError):
    """The gRPC stubs could not be generated or imported (one-line reason)."""


@dataclass(frozen=True)
class Stubs:
    inference_pb2: ModuleType
    inference_pb2_grpc: ModuleType
    management_pb2: ModuleType
    management_pb2_grpc: ModuleType
    directory: Path


def torchserve_jar() -> Path:
    try:
        import ts
    except ImportError:
        raise StubError("torchserve is not installed: its model-server.jar holds the gRPC protos") from None
    jar = Path(ts.__file__).resolve().parent / "frontend" / "model-server.jar"
    if not jar.is_file():
        raise StubError(f"{jar} not found: the torchserve install is incomplete")
    return jar


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return settings.cache_root() / "grpc"


def cache_dir() -> Path:
    """Where the stubs for the installed TorchServe and grpcio-tools live."""
    try:
        ts_version = importlib.metadata.version("torchserve")
        tools_version = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError as exc:
        raise StubError(f"{exc.name} is not installed (pip install grpcio-tools; see requirements.lock)") from None
    return cache_root() / f"torchserve-{ts_version}-grpcio-tools-{tools_version}"


def generate(target: Path, jar: Path | None = None) -> Path:
    """Compile the jar's protos into ``target/<PACKAGE>/``; atomic: ``target`` appears complete or not at all."""
    try:
        from grpc_tools import protoc
    except ImportError:
        raise StubError("grpcio-tools is not installed (pip install grpcio-tools; see requirements.lock)") from None
    import google.rpc.status_pb2

    jar = jar or torchserve_jar()
    googleapis = Path(google.rpc.status_pb2.__file__).resolve().parent.parent.parent
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        src, out = work / "src", work / "out"
        (src / PACKAGE).mkdir(parents=True)
        (out / PACKAGE).mkdir(parents=True)
        with zipfile.ZipFile(jar) as archive:
            for name in PROTOS:
                try:
                    (src / PACKAGE / f"{name}.proto").write_bytes(archive.read(f"proto/{name}.proto"))
                except KeyError:
                    raise StubError(f"{jar} holds no proto/{name}.proto") from None
        args = ["grpc_tools.protoc", f"-I{src}", f"-I{googleapis}", f"-I{well_known}",
                f"--python_out={out}", f"--grpc_python_out={out}",
                *(f"{PACKAGE}/{name}.proto" for name in PROTOS)]
        if protoc.main(args) != 0:
            raise StubError(f"grpc_tools.protoc failed on the protos of {jar}")
        (out / PACKAGE / "__init__.py").write_text(f'"""gRPC stubs generated from {jar.name}."""\n')
        try:
            os.rename(out, target)
        except OSError:
            if not target.is_dir():  # not a lost race with another process: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def load(directory: Path | None = None) -> Stubs:
    """The stub modules, generating them into the cache first if needed (once per process)."""
    global _loaded
    with _lock:
        if _loaded is not None and directory in (None, _loaded.directory):
            return _loaded
        directory = directory or cache_dir()
        if not (directory / PACKAGE / "__init__.py").is_file():
            generate(directory)
        package_init = directory / PACKAGE / "__init__.py"
        spec = importlib.util.spec_from_file_location(PACKAGE, package_init,
                                                      submodule_search_locations=[str(package_init.parent)])
        if spec is None or spec.loader is None:
            raise StubError(f"cannot import stubs from {directory}")
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
        modules = {f"{name}{suffix}": importlib.import_module(f"{PACKAGE}.{name}{suffix}")
                   for name in PROTOS for suffix in ("_pb2", "_pb2_grpc")}
        _loaded = Stubs(directory=directory, **modules)
        return _loaded
