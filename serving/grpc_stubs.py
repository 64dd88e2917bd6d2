"""Open Inference gRPC stubs for the gateway, generated from serving/proto/grpc_predict_v2.proto; never committed.

``python -m serving.grpc_stubs`` compiles the project's own proto with ``grpc_tools.protoc`` (:mod:`grpc_codegen`,
shared with client.protos) into the package :data:`PACKAGE` inside the running Python's site-packages (the dev
``.venv`` via ``./scripts/bootstrap.sh``, the serving image's ``/opt/venv`` at build time, see serving/Dockerfile),
so nothing generated lands in the work tree and grpcio-tools is needed only to generate: the image installs it for
that one step and removes it again. The package records the proto's sha256 and the grpcio-tools version it came
from; ``--check`` (and :func:`load`) say when it is missing or stale. Generation is atomic: a private directory
renamed into place.

Imports only the standard library until it generates, so the gateway can call :func:`load` cheaply.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Sequence

import grpc_codegen
from grpc_codegen import StubError

__all__ = ["PROTO", "PACKAGE", "MODULE", "STAMP", "HOW", "StubError", "site_packages", "proto_sha256", "generate",
           "current", "load", "main"]

PROTO = Path(__file__).resolve().parent / "proto" / "grpc_predict_v2.proto"
#: The generated package (a top-level package of site-packages).
PACKAGE = "mnist_embedding_oip_grpc"
MODULE = "grpc_predict_v2"
STAMP = "stamp.json"
HOW = "run ./scripts/bootstrap.sh (or python -m serving.grpc_stubs)"


def site_packages() -> Path:
    """This Python's site-packages (purelib)."""
    return Path(sysconfig.get_paths()["purelib"])


def proto_sha256(proto: Path = PROTO) -> str:
    """The sha256 of the proto's bytes: what the stamp records."""
    return hashlib.sha256(proto.read_bytes()).hexdigest()


def _package(site: Path | None) -> grpc_codegen.StubPackage:
    return grpc_codegen.StubPackage(PACKAGE, (site or site_packages()) / PACKAGE, STAMP, (MODULE,))


def generate(site: Path | None = None, proto: Path = PROTO) -> Path:
    """Compile `proto` into `site`/PACKAGE (default: this Python's site-packages); returns the package path."""
    return grpc_codegen.generate(
        _package(site), {MODULE: proto.read_bytes()}, {"proto_sha256": proto_sha256(proto)}, origin=proto.name,
        generator="serving.grpc_stubs",
        missing="grpcio-tools is not installed: it is needed only to generate the stubs "
                "(pip install grpcio-tools with protobuf<7 pinned in the same command)")


def current(site: Path | None = None, proto: Path = PROTO) -> bool:
    """Whether the generated package exists and was generated from this proto."""
    return _package(site).current({"proto_sha256": proto_sha256(proto)})


def load() -> tuple[ModuleType, ModuleType]:
    """(messages module, service module); StubError saying how to generate them when missing or stale."""
    if not current():
        raise StubError(f"the Open Inference gRPC stubs ({PACKAGE}) are missing or older than {PROTO.name}: {HOW}")
    modules = _package(None).modules()
    return modules[f"{MODULE}_pb2"], modules[f"{MODULE}_pb2_grpc"]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m serving.grpc_stubs [--check]`: generate unless current; --check only says whether current."""
    return grpc_codegen.command("serving.grpc_stubs", "Open Inference gRPC stubs", site_packages() / PACKAGE,
                                current, generate, HOW, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
