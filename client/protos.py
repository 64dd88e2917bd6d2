"""TorchServe's gRPC stubs, generated at set-up from the protos inside the installed model-server.jar.

The .proto files ship only inside TorchServe's Java frontend (``ts/frontend/model-server.jar``), so nothing
is vendored and nothing generated is committed: ``./scripts/bootstrap.sh`` runs ``python -m client.protos``,
which extracts ``proto/inference.proto`` and ``proto/management.proto``, compiles them with
``grpc_tools.protoc`` into the package ``client/_grpc/`` (ignored by git) and records the TorchServe and
grpcio-tools versions they came from (generated code must match the protobuf runtime that imports it). The
package is imported like any other; a missing or stale one is a one-line error that says how to generate it.
Generation happens in a private temporary directory renamed into place, so concurrent runs and interrupted
ones never leave a half-written package. ``google.rpc.status_pb2`` (imported by the generated code) comes from
googleapis-common-protos.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: The generated package: client/_grpc/, imported as client._grpc.
STUB_DIR = Path(__file__).resolve().parent / "_grpc"
PACKAGE = f"{__package__}._grpc"
PROTOS = ("inference", "management")
VERSIONS_FILE = "versions.json"
HOW = "run ./scripts/bootstrap.sh (or .venv/bin/python -m client.protos)"


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


def installed_versions() -> dict[str, str]:
    """The TorchServe and grpcio-tools versions the stubs must be generated from."""
    try:
        return {name: importlib.metadata.version(name) for name in ("torchserve", "grpcio-tools")}
    except importlib.metadata.PackageNotFoundError as exc:
        raise StubError(f"{exc.name} is not installed (see requirements.lock; {HOW})") from None


def generate(target: Path = STUB_DIR, jar: Path | None = None) -> Path:
    """Compile the jar's protos into the package directory `target`; atomic: it is whole or absent."""
    try:
        from grpc_tools import protoc
    except ImportError:
        raise StubError("grpcio-tools is not installed (pip install grpcio-tools; see requirements.lock)") from None
    import google.rpc.status_pb2

    jar = jar or torchserve_jar()
    googleapis = Path(google.rpc.status_pb2.__file__).resolve().parent.parent.parent
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    package_path = Path(*PACKAGE.split("."))
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        src, out = work / "src", work / "out"
        (src / package_path).mkdir(parents=True)
        (out / package_path).mkdir(parents=True)
        with zipfile.ZipFile(jar) as archive:
            for name in PROTOS:
                try:
                    (src / package_path / f"{name}.proto").write_bytes(archive.read(f"proto/{name}.proto"))
                except KeyError:
                    raise StubError(f"{jar} holds no proto/{name}.proto") from None
        args = ["grpc_tools.protoc", f"-I{src}", f"-I{googleapis}", f"-I{well_known}",
                f"--python_out={out}", f"--grpc_python_out={out}",
                *(f"{package_path}/{name}.proto" for name in PROTOS)]
        if protoc.main(args) != 0:
            raise StubError(f"grpc_tools.protoc failed on the protos of {jar}")
        built = out / package_path
        (built / "__init__.py").write_text(f'"""gRPC stubs generated from {jar.name} by client.protos; not committed."""\n')
        (built / VERSIONS_FILE).write_text(json.dumps(installed_versions()) + "\n")
        try:  # stale stubs: move them aside, then put the new ones in their place
            os.rename(target, work / "old")
        except FileNotFoundError:  # none there, or another process moved them aside first
            pass
        try:
            os.rename(built, target)
        except OSError:
            if not target.is_dir():  # not a lost race with another process: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def current(directory: Path = STUB_DIR) -> bool:
    """Whether `directory` holds stubs generated from the installed TorchServe and grpcio-tools."""
    try:
        recorded = json.loads((directory / VERSIONS_FILE).read_text())
    except (OSError, ValueError):
        return False
    return recorded == installed_versions() and all((directory / f"{n}_pb2_grpc.py").is_file() for n in PROTOS)


def load() -> Stubs:
    """The generated stub modules; StubError saying how to generate them when missing or stale."""
    if not current(STUB_DIR):
        state = "stale (generated for another TorchServe or grpcio-tools)" if STUB_DIR.is_dir() else "missing"
        raise StubError(f"TorchServe's gRPC stubs in {STUB_DIR} are {state}: {HOW}")
    modules = {f"{name}{suffix}": importlib.import_module(f"{PACKAGE}.{name}{suffix}")
               for name in PROTOS for suffix in ("_pb2", "_pb2_grpc")}
    return Stubs(directory=STUB_DIR, **modules)


def main() -> int:
    """`python -m client.protos`: generate the stubs unless the current ones match the installed versions."""
    try:
        if current(STUB_DIR):
            print(f"gRPC stubs up to date: {STUB_DIR}")
        else:
            print(f"gRPC stubs generated: {generate(STUB_DIR)}")
    except (StubError, OSError) as exc:
        print(f"client.protos: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
