"""Python gRPC stubs compiled from .proto files into one package folder: generated whole or not at all, stamped.

The one stub generator of the project: ``client.protos`` (TorchServe's protos, taken from its installed jar, into
``client/_grpc/``) and ``serving.grpc_stubs`` (the Open Inference proto, into site-packages) describe what to
compile and where; this module compiles it with ``grpc_tools.protoc`` in a private temporary folder beside the
package and renames the result into place, so concurrent and interrupted runs never leave a half-written package.
A stamp file in the package records what it was generated from, always with the grpcio-tools version (generated
code must match the protobuf runtime that imports it), so a stale package is told apart from a current one.

Imports only the standard library until it compiles, so loading stubs stays cheap; the lowest import layer, beside
``settings`` and ``cli_common``, so that both ``client`` and ``serving`` may use it.
"""

from __future__ import annotations

import errno
import importlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Mapping, Sequence


class StubError(RuntimeError):
    """gRPC stubs are missing or stale, or could not be generated (one-line reason)."""


@dataclass(frozen=True)
class StubPackage:
    """A generated stub package: its import name, its folder, its stamp file and its protos' base names."""

    package: str
    directory: Path
    stamp_file: str
    protos: tuple[str, ...]

    def stamp(self) -> dict[str, object] | None:
        """What the package records it was generated from; None when it has no readable stamp."""
        try:
            recorded = json.loads((self.directory / self.stamp_file).read_text())
        except (OSError, ValueError):
            return None
        return recorded if isinstance(recorded, dict) else None

    def current(self, expected: Mapping[str, str]) -> bool:
        """Whether the package is whole and its stamp records every key of `expected` with that value."""
        recorded = self.stamp()
        return (recorded is not None and all(recorded.get(key) == value for key, value in expected.items())
                and all((self.directory / f"{name}_pb2_grpc.py").is_file() for name in self.protos))

    def modules(self) -> dict[str, ModuleType]:
        """{"<proto>_pb2": module, "<proto>_pb2_grpc": module} for every proto, imported."""
        return {f"{name}{suffix}": importlib.import_module(f"{self.package}.{name}{suffix}")
                for name in self.protos for suffix in ("_pb2", "_pb2_grpc")}


def _protoc(missing: str) -> ModuleType:
    try:
        from grpc_tools import protoc
    except ImportError:
        raise StubError(missing) from None
    return protoc


def _compile(stubs: StubPackage, sources: Mapping[str, bytes], includes: Sequence[Path], work: Path,
             protoc: ModuleType, origin: str) -> Path:
    """The package compiled under `work`; its folder."""
    package_path = Path(*stubs.package.split("."))
    src, out = work / "src", work / "out"
    (src / package_path).mkdir(parents=True)
    (out / package_path).mkdir(parents=True)
    for name in stubs.protos:
        (src / package_path / f"{name}.proto").write_bytes(sources[name])
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{src}", *(f"-I{path}" for path in includes), f"-I{well_known}",
            f"--python_out={out}", f"--grpc_python_out={out}",
            *(f"{package_path}/{name}.proto" for name in stubs.protos)]
    if protoc.main(args) != 0:
        raise StubError(f"grpc_tools.protoc failed on {origin}")
    return out / package_path


def generate(stubs: StubPackage, sources: Mapping[str, bytes], stamp: Mapping[str, str], *, origin: str,
             generator: str, includes: Sequence[Path] = (), missing: str = "grpcio-tools is not installed") -> Path:
    """Compile `sources` (proto base name -> its text) into `stubs.directory`, stamped with `stamp` and the
    grpcio-tools version; atomic: the folder is whole or absent. `origin` names the protos in messages and the
    package docstring, `generator` the module that asked; `missing` is the error when grpcio-tools is absent."""
    protoc = _protoc(missing)
    target = stubs.directory
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        built = _compile(stubs, sources, includes, work, protoc, origin)
        (built / "__init__.py").write_text(f'"""gRPC stubs generated from {origin} by {generator}; not committed."""\n')
        recorded = {**stamp, "grpcio-tools": importlib.metadata.version("grpcio-tools")}
        (built / stubs.stamp_file).write_text(json.dumps(recorded) + "\n")
        try:  # stale stubs: move them aside, then put the new ones in their place
            os.rename(target, work / "old")
        except FileNotFoundError:  # none there, or another process moved them aside first
            pass
        _install(built, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _install(built: Path, target: Path, attempts: int = 20) -> None:
    """Rename `built` to `target`. A target already there is another process's equal result (a lost race); one
    that vanished between the failed rename and the check was moved aside by a third process: try again."""
    for _ in range(attempts):
        try:
            os.rename(built, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if target.is_dir():
                return
    raise OSError(errno.EBUSY, f"{target} kept changing while {built} was put in its place")


def command(prog: str, what: str, location: Path, current: Callable[[], bool], make: Callable[[], Path],
            how: str, argv: Sequence[str]) -> int:
    """`python -m PROG [--check]`: generate unless current; --check only says whether current. Exit status."""
    try:
        if current():
            print(f"{what} up to date: {location}")
        elif list(argv) == ["--check"]:
            print(f"{prog}: stubs missing or stale: {how}", file=sys.stderr)
            return 1
        else:
            print(f"{what} generated: {make()}")
    except (StubError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0
