"""Build `<model_store>/<name>.mar` with torch-model-archiver, atomically (`./archive.sh` calls this)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from handler.artifacts import (
    METADATA_FILE,
    ArtifactError,
    artifact_files,
    path_identity,
    remove_tree,
    sha256_file,
    verify_artifacts,
)

from settings import (DEFAULT_ARTIFACTS, DEFAULT_DATA_SOURCE, DEFAULT_MODEL_STORE, MODEL_CONFIG_FILE, MODEL_NAME,
                      MODEL_VERSION, REPO, SettingsError, check_model_name)

HANDLER_PACKAGE = REPO / "handler"
HANDLER_ENTRY = HANDLER_PACKAGE / "embedding_handler.py"
#: A model version: a TorchServe archive version and a KServe storage directory name both accept it.
MODEL_VERSION_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
MODEL_VERSION_RULE = "letters, digits, '.', '-', '_', starting and ending alphanumeric"
#: The owned_paths kind of a model store. No marker is written into one (TorchServe reads the folder): a store
#: ./archive.sh may write to is empty or holds model archives only, and the hidden folders builds work in.
MODEL_STORE_KIND = "model-store"
PARTIAL_PREFIX = ".archive-partial-"
MODEL_STORE_NAMES = ("*.mar", f"{PARTIAL_PREFIX}*")


class ArchiveError(Exception):
    """One-line reason the archive could not be built."""


def _archiver() -> str:
    exe = Path(sys.executable).parent / "torch-model-archiver"
    if exe.exists():
        return str(exe)
    found = shutil.which("torch-model-archiver")
    if not found:
        raise ArchiveError("torch-model-archiver not found: run ./scripts/bootstrap.sh")
    return found


def is_mar(path: Path) -> bool:
    """True for a model archive torch-model-archiver wrote (a zip holding MAR-INF/MANIFEST.json)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return "MAR-INF/MANIFEST.json" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def mar_name(model_name: str, version: str | None = None) -> str:
    """The archive's file name: `<name>.mar`, or `<name>-<version>.mar` for a version given explicitly."""
    return f"{model_name}.mar" if version is None else f"{model_name}-{version}.mar"


def build_mar(artifacts: Path, export_path: Path, model_name: str = MODEL_NAME, version: str = MODEL_VERSION,
              model_config: Path = MODEL_CONFIG_FILE, file_name: str | None = None) -> Path:
    """Pack verified artifacts, the handler package and model-config.yaml into `export_path`/`file_name`
    (default `<model_name>.mar`); publish by rename, replacing only an earlier model archive (ArchiveError for any
    other file there).

    The .mar is written under a hidden temporary directory inside `export_path` and renamed into
    place, so an interrupted build never leaves a partial archive where TorchServe looks.
    """
    artifacts, export_path = Path(artifacts), Path(export_path)
    try:
        check_model_name(model_name)
    except SettingsError as exc:
        raise ArchiveError(str(exc)) from None
    target = export_path / (file_name or mar_name(model_name))
    if target.is_dir() or (target.exists() and not is_mar(target)):
        raise ArchiveError(f"{target}: exists and is not a model archive; name another --export-path or "
                           "--model-version (nothing was changed)")
    try:
        metadata = verify_artifacts(artifacts)
    except ArtifactError as exc:
        raise ArchiveError(str(exc)) from None
    if not Path(model_config).is_file():
        raise ArchiveError(f"{model_config}: model config missing")
    export_path.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{model_name}-", dir=export_path)
    try:
        extras = Path(tmp) / "extras"
        shutil.copytree(HANDLER_PACKAGE, extras / "handler", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in (*artifact_files(metadata), METADATA_FILE):
            if name != metadata.model_file:
                shutil.copy2(artifacts / name, extras / name)
        cmd = [
            _archiver(), "--model-name", model_name, "--version", version,
            "--serialized-file", str(artifacts / metadata.model_file), "--handler", str(HANDLER_ENTRY),
            "--extra-files", str(extras), "--config-file", str(model_config),
            "--export-path", tmp, "--force",
        ]
        # torch-model-archiver stages the files in $TMPDIR/<model name>, deleting whatever is there first: give it
        # a folder of this build's own, so a user's /tmp/embedding and a concurrent build are left alone.
        staging = Path(tmp) / "staging"
        staging.mkdir()
        result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(staging)})
        built = Path(tmp) / f"{model_name}.mar"
        if result.returncode != 0 or not built.is_file():
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise ArchiveError(f"torch-model-archiver failed: {detail[-1] if detail else result.returncode}")
        built.replace(target)
    finally:
        remove_tree(Path(tmp))  # also when Ctrl-C lands during the clean-up: no hidden leftovers
    return target


def _java_ok() -> bool:
    return shutil.which("java") is not None


def check_model_version(version: str) -> str:
    """`version` if it can name an archive's version (and a KServe storage directory); ArchiveError otherwise."""
    if not MODEL_VERSION_PATTERN.match(version):
        raise ArchiveError(f"invalid model version {version!r}: {MODEL_VERSION_RULE}")
    return version


def _parse(argv: list[str] | None) -> argparse.Namespace:
    from cli_common import Parser, positive_int

    p = Parser(prog="./archive.sh", description="Build model_store/<name>.mar for TorchServe from training "
                                                 "artifacts (trained first on --data-source when --artifacts is "
                                                 "not given and artifacts/ holds none).")
    p.add_argument("--artifacts", type=Path, default=None,
                   help=f"training output; it must exist (default: {DEFAULT_ARTIFACTS}, trained first if missing)")
    p.add_argument("--no-train", action="store_true", help="fail instead of training when artifacts/ is missing")
    p.add_argument("--data-source", default=DEFAULT_DATA_SOURCE, metavar="SOURCE",
                   help="data source used when training first")
    p.add_argument("--epochs", type=positive_int, default=None,
                   help="epochs used when training first (default: the training default)")
    p.add_argument("--model-name", default=MODEL_NAME, help="TorchServe model name")
    p.add_argument("--model-version", default=None,
                   help=f"version written into the archive; when given, the file is <name>-<version>.mar (default: "
                        f"{MODEL_VERSION}, in <name>.mar)")
    p.add_argument("--export-path", type=Path, default=DEFAULT_MODEL_STORE,
                   help="model store folder to write to: a new or empty one, or one holding model archives only")
    p.add_argument("--model-config", type=Path, default=MODEL_CONFIG_FILE, help="TorchServe model-config.yaml")
    return p.parse_args(argv)


def _check_paths(args: argparse.Namespace, artifacts: Path, target: Path) -> None:
    """UsageError unless every path can be used; nothing the user owns is ever replaced (owned_paths)."""
    from cli_common import input_dir, input_file, output_dir
    from owned_paths import replaceable_dir, replaceable_file
    from training.outputs import artifacts_folder, source_reads

    if args.artifacts is not None:
        input_dir(args.artifacts, "--artifacts")
    input_file(args.model_config, "--model-config")
    output_dir(args.export_path, "--export-path")
    replaceable_dir(args.export_path, MODEL_STORE_KIND, "--export-path",
                    reads=[artifacts, args.model_config, HANDLER_PACKAGE], known=MODEL_STORE_NAMES)
    replaceable_file(target, "--export-path", ours=is_mar)
    if args.artifacts is None and not args.no_train and not (artifacts / METADATA_FILE).is_file():
        artifacts_folder(artifacts, "--artifacts", reads=source_reads(args.data_source))  # trained into first


def missing_artifacts(artifacts: Path) -> str:
    """Why `artifacts` cannot be archived, and a next step that replaces nothing of the user's."""
    from cli_common import UsageError
    from training.data.folder import image_layout
    from training.outputs import artifacts_folder

    layout = image_layout(artifacts)
    if layout is not None:
        where = "" if layout == "labelled" else f"put them in {artifacts}/<label>/, then "
        return (f"{artifacts}: no training artifacts; it looks like images; {where}train with --data-source "
                f"folder:{artifacts} --out <new folder> and archive that folder")
    try:
        artifacts_folder(artifacts, "--artifacts")
    except UsageError:
        return (f"{artifacts}: no training artifacts (no {METADATA_FILE}); train into a new folder "
                "(python -m training --out <new folder>) and archive that folder")
    return f"{artifacts}: no training artifacts (run python -m training --out {artifacts})"


def _train_first(args: argparse.Namespace, artifacts: Path) -> None:
    if args.no_train or args.artifacts is not None:
        raise ArchiveError(missing_artifacts(artifacts))
    print(f"archive: no artifacts in {artifacts}; training on {args.data_source} first", flush=True)
    cmd = [sys.executable, "-m", "training", "--data-source", args.data_source, "--out", str(artifacts)]
    if args.epochs:
        cmd += ["--epochs", str(args.epochs)]
    if subprocess.run(cmd, cwd=REPO).returncode != 0:
        raise ArchiveError("training failed (see above)")


def main(argv: list[str] | None = None) -> int:
    """./archive.sh. cli_common is imported here: pipeline tasks import this module, and their image holds only
    the packages they use."""
    from cli_common import EXIT_INTERRUPTED, EXIT_USAGE, UsageError, fail, os_error

    args = _parse(argv)
    artifacts = args.artifacts or DEFAULT_ARTIFACTS
    version = MODEL_VERSION if args.model_version is None else args.model_version
    target = args.export_path / mar_name(args.model_name, args.model_version)
    try:
        check_model_name(args.model_name)
        check_model_version(version)
        _check_paths(args, artifacts, target)
    except (SettingsError, ArchiveError, UsageError) as exc:
        return fail("archive", exc, EXIT_USAGE)
    before = path_identity(target)
    try:
        if not _java_ok():
            raise ArchiveError("java not found: TorchServe needs Java 17 (apt-get install openjdk-17-jre-headless)")
        if not (artifacts / METADATA_FILE).is_file():
            _train_first(args, artifacts)
        started = time.perf_counter()
        mar = build_mar(artifacts, args.export_path, args.model_name, version, args.model_config, target.name)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # published: too late to interrupt, finish and report
    except ArchiveError as exc:
        return fail("archive", exc)
    except OSError as exc:
        return fail("archive", os_error(exc))
    except KeyboardInterrupt:
        if path_identity(target) != before:  # Ctrl-C came after the rename published the new archive
            print(f"archive: interrupted after the new archive was published to {target}", file=sys.stderr)
        else:
            print("archive: interrupted; model store left as it was", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"archive: wrote {mar} ({mar.stat().st_size / 1e6:.2f} MB, sha256 {sha256_file(mar)}) "
          f"in {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
