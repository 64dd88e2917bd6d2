"""Open Inference gRPC stubs for the gateway, generated from serving/proto/grpc_predict_v2.proto; never committed.

``python -m serving.grpc_stubs`` compiles the project's own proto with ``grpc_tools.protoc`` into the package
:data:`PACKAGE` inside the running Python's site-packages (the dev ``.venv`` via ``./scripts/bootstrap.sh``, the
serving image's ``/opt/venv`` at build time, see serving/Dockerfile), so nothing generated lands in the work tree
and grpcio-tools is needed only to generate: the image installs it for that one step and removes it again. The
package records the proto's sha256 and the grpcio-tools version it came from; ``--check`` (and :func:`load`)
say when it is missing or stale. Generation is atomic: a private directory renamed into place.

Imports only the standard library until it generates, so the gateway can call :func:`load` cheaply.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).resolve().parent / "proto" / "grpc_predict_v2.proto"
#: The generated package (a top-level package of site-packages).
PACKAGE = "mnist_embedding_oip_grpc"
MODULE = "grpc_predict_v2"
STAMP = "stamp.json"
HOW = "run ./scripts/bootstrap.sh (or python -m serving.grpc_stubs)"


class StubError(RuntimeError):
    """The Open Inference gRPC stubs are missing, stale or could not be generated (one-line reason)."""


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def proto_sha256(proto: Path = PROTO) -> str:
    return hashlib.sha256(proto.read_bytes()).hexdigest()


def generate(site: Path | None = None, proto: Path = PROTO) -> Path:
    """Compile `proto` into `site`/PACKAGE (default: this Python's site-packages); returns the package path."""
    try:
        from grpc_tools import protoc
    except ImportError:
        raise StubError("grpcio-tools is not installed: it is needed only to generate the stubs "
                        "(pip install grpcio-tools with protobuf<7 pinned in the same command)") from None
    site = site or site_packages()
    target = site / PACKAGE
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    work = Path(tempfile.mkdtemp(prefix=f".{PACKAGE}.partial-", dir=site))
    try:
        src, out = work / "src", work / "out"
        (src / PACKAGE).mkdir(parents=True)
        (out / PACKAGE).mkdir(parents=True)
        shutil.copyfile(proto, src / PACKAGE / f"{MODULE}.proto")
        args = ["grpc_tools.protoc", f"-I{src}", f"-I{well_known}", f"--python_out={out}",
                f"--grpc_python_out={out}", f"{PACKAGE}/{MODULE}.proto"]
        if protoc.main(args) != 0:
            raise StubError(f"grpc_tools.protoc failed on {proto}")
        built = out / PACKAGE
        (built / "__init__.py").write_text(f'"""Generated from {proto.name} by serving.grpc_stubs; not committed."""\n')
        stamp = {"proto_sha256": proto_sha256(proto), "grpcio-tools": importlib.metadata.version("grpcio-tools")}
        (built / STAMP).write_text(json.dumps(stamp) + "\n")
        if target.exists():
            os.rename(target, work / "old")
        try:
            os.rename(built, target)
        except OSError:
            if not target.is_dir():  # not a lost race with a concurrent run: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def current(site: Path | None = None, proto: Path = PROTO) -> bool:
    """Whether the generated package exists and was generated from this proto."""
    target = (site or site_packages()) / PACKAGE
    try:
        stamp = json.loads((target / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(stamp, dict) and stamp.get("proto_sha256") == proto_sha256(proto)
            and (target / f"{MODULE}_pb2_grpc.py").is_file())


def load() -> tuple[ModuleType, ModuleType]:
    """(messages module, service module); StubError saying how to generate them when missing or stale."""
    if not current():
        raise StubError(f"the Open Inference gRPC stubs ({PACKAGE}) are missing or older than {PROTO.name}: {HOW}")
    return (importlib.import_module(f"{PACKAGE}.{MODULE}_pb2"), importlib.import_module(f"{PACKAGE}.{MODULE}_pb2_grpc"))


def main(argv: list[str] | None = None) -> int:
    """`python -m serving.grpc_stubs [--check]`: generate unless current; --check only says whether current."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if current():
            print(f"Open Inference gRPC stubs up to date: {site_packages() / PACKAGE}")
        elif argv == ["--check"]:
            print(f"serving.grpc_stubs: stubs missing or stale: {HOW}", file=sys.stderr)
            return 1
        else:
            print(f"Open Inference gRPC stubs generated: {generate()}")
    except (StubError, OSError) as exc:
        print(f"serving.grpc_stubs: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
