"""TorchServe's gRPC stubs, generated at set-up from the protos inside the installed model-server.jar.

The .proto files ship only inside TorchServe's Java frontend (``ts/frontend/model-server.jar``), so nothing
is vendored and nothing generated is committed: ``./scripts/bootstrap.sh`` runs ``python -m client.protos``,
which extracts ``proto/inference.proto`` and ``proto/management.proto``, compiles them with
``grpc_tools.protoc`` into the package ``client/_grpc/`` (ignored by git) and records the TorchServe and
grpcio-tools versions they came from (generated code must match the protobuf runtime that imports it). The
package is imported like any other; a missing or stale one is a one-line error that says how to generate it.
Generation (:mod:`grpc_codegen`, shared with serving.grpc_stubs) happens in a private temporary directory renamed
into place, so concurrent runs and interrupted ones never leave a half-written package.
``google.rpc.status_pb2`` (imported by the generated code) comes from googleapis-common-protos.
"""

from __future__ import annotations

import importlib.metadata
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Sequence

import grpc_codegen
from grpc_codegen import StubError

__all__ = ["STUB_DIR", "PACKAGE", "PROTOS", "VERSIONS_FILE", "HOW", "StubError", "Stubs", "torchserve_jar",
           "installed_versions", "generate", "current", "load", "main"]

#: The generated package: client/_grpc/, imported as client._grpc.
STUB_DIR = Path(__file__).resolve().parent / "_grpc"
PACKAGE = f"{__package__}._grpc"
PROTOS = ("inference", "management")
VERSIONS_FILE = "versions.json"
HOW = "run ./scripts/bootstrap.sh (or .venv/bin/python -m client.protos)"


@dataclass(frozen=True)
class Stubs:
    inference_pb2: ModuleType
    inference_pb2_grpc: ModuleType
    management_pb2: ModuleType
    management_pb2_grpc: ModuleType
    directory: Path


def _package(directory: Path) -> grpc_codegen.StubPackage:
    return grpc_codegen.StubPackage(PACKAGE, directory, VERSIONS_FILE, PROTOS)


def torchserve_jar() -> Path:
    """The installed TorchServe's model-server.jar, which holds the protos."""
    try:
        import ts
    except ImportError:
        raise StubError("torchserve is not installed: its model-server.jar holds the gRPC protos") from None
    jar = Path(ts.__file__).resolve().parent / "frontend" / "model-server.jar"
    if not jar.is_file():
        raise StubError(f"{jar} not found: the torchserve install is incomplete")
    return jar


def installed_versions() -> dict[str, str]:
    """The TorchServe and grpcio-tools versions the stubs must be generated from."""
    try:
        return {name: importlib.metadata.version(name) for name in ("torchserve", "grpcio-tools")}
    except importlib.metadata.PackageNotFoundError as exc:
        raise StubError(f"{exc.name} is not installed (see requirements/product.lock; {HOW})") from None


def _jar_protos(jar: Path) -> dict[str, bytes]:
    """{proto base name: its text} read from the jar's proto/ folder."""
    sources = {}
    with zipfile.ZipFile(jar) as archive:
        for name in PROTOS:
            try:
                sources[name] = archive.read(f"proto/{name}.proto")
            except KeyError:
                raise StubError(f"{jar} holds no proto/{name}.proto") from None
    return sources


def generate(target: Path = STUB_DIR, jar: Path | None = None) -> Path:
    """Compile the jar's protos into the package directory `target`; atomic: it is whole or absent."""
    jar = jar or torchserve_jar()
    sources = _jar_protos(jar)
    import google.rpc.status_pb2

    googleapis = Path(google.rpc.status_pb2.__file__).resolve().parent.parent.parent
    return grpc_codegen.generate(
        _package(target), sources, {"torchserve": installed_versions()["torchserve"]}, origin=jar.name,
        generator="client.protos", includes=[googleapis],
        missing="grpcio-tools is not installed (pip install grpcio-tools; see requirements/product.lock)")


def current(directory: Path = STUB_DIR) -> bool:
    """Whether `directory` holds stubs generated from the installed TorchServe and grpcio-tools."""
    return _package(directory).current(installed_versions())


def load() -> Stubs:
    """The generated stub modules; StubError saying how to generate them when missing or stale."""
    if not current(STUB_DIR):
        state = "stale (generated for another TorchServe or grpcio-tools)" if STUB_DIR.is_dir() else "missing"
        raise StubError(f"TorchServe's gRPC stubs in {STUB_DIR} are {state}: {HOW}")
    return Stubs(directory=STUB_DIR, **_package(STUB_DIR).modules())


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m client.protos [--check]`: generate the stubs unless the current ones match the installed versions;
    --check only says whether they do."""
    return grpc_codegen.command("client.protos", "gRPC stubs", STUB_DIR, lambda: current(STUB_DIR),
                                lambda: generate(STUB_DIR), HOW, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
