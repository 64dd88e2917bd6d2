"""The runners of ``python -m client``'s commands: each takes the parsed arguments and returns the exit status.

Failures are raised (a ClientError with its own exit code, or a cli_common.UsageError); ``client.__main__.main``
turns them into one line on stderr. Modules a command alone needs are imported inside it, to keep start-up short.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import cli_common
from torchserve_api.errors import ClientUsageError

from . import tokens
from .batch import RowWriter, Summary, answer_files, walk
from .errors import BadImageError, ClientError
from .outputs import (embed_listing, embed_output, predict_output, progress, report_failure, sidecar_path,
                      text_output, write_embeddings)


def _token(kind: tokens.Kind, args: argparse.Namespace, url: str) -> tokens.Token:
    """This machine's default key file is only read for a server on this machine: its keys never go elsewhere."""
    from .rest import is_loopback

    return tokens.resolve(kind, args.token, args.key_file, default_key_file=is_loopback(url), url=url,
                          gateway=getattr(args, "gateway_token", None))


def _refuse_python_runtime(args: argparse.Namespace, url: str) -> None:
    """UsageError when nothing recorded serves the management URL but the config's inference port is a python
    runtime's (serving start --runtime python), which has no management API."""
    from torchserve_api.instances import for_address

    from .api import default_endpoints

    if for_address(url) is not None:
        return
    record = for_address(default_endpoints(args.config).inference)
    if record is not None and record.runtime == "python":
        raise cli_common.UsageError(f"{record.describe()} serves {default_endpoints(args.config).inference} and has no "
                                    "management API: status, list, register, set-default, unregister and scale need "
                                    "TorchServe (python -m serving stop, then python -m serving start)")


def _client(args: argparse.Namespace) -> Any:
    from .api import EmbeddingClient, check_address, default_url

    url = check_address(args.url or default_url(args.protocol, args.config), args.protocol)
    return EmbeddingClient(url, protocol=args.protocol, model=args.model_name,
                           version=getattr(args, "model_version", None), token=_token("inference", args, url),
                           timeout=args.timeout, retries=args.retries, config=args.config)


def _writable(out: Path, flag: str, ours: Any, reads: Sequence[str]) -> Path:
    """`out` if it is missing or this command's own output (never a user's file, nor one it reads), and writable."""
    from owned_paths import replaceable_file

    return replaceable_file(cli_common.output_file(out, flag), flag, ours=ours, reads=reads)


def _print_summary(summary: Summary) -> None:
    for line in summary.lines():
        print(line, file=sys.stderr)


def predict(args: argparse.Namespace) -> int:
    """One row per image in --format, to --out or standard output."""
    out = _writable(args.out, "--out", predict_output, args.images) if args.out else None
    images = walk(args.images)
    summary = Summary()
    with _client(args) as client, text_output(out) as stream, progress(len(images), args.no_progress) as bar:
        writer = RowWriter(stream, args.format)
        for outcome in answer_files(client, images, args.batch_size, args.concurrency, on_done=bar.update):
            summary.add(outcome)
            if outcome.failed:
                report_failure(bar, outcome)
            if out is None:
                bar.clear()
            writer.write(outcome.row())
        writer.close()
    _print_summary(summary)
    return BadImageError.exit_code if summary.failed else 0


def embed(args: argparse.Namespace) -> int:
    """The embeddings of every answered image, in order; failed files are listed, not embedded."""
    out = _writable(args.out, "--out", embed_output, args.images)
    _writable(sidecar_path(out), "--out's file list", embed_listing, args.images)
    images = walk(args.images)
    summary = Summary()
    vectors: list[list[float]] = []
    files: list[str] = []
    failed: list[dict[str, Any]] = []
    versions: set[str] = set()
    with _client(args) as client, progress(len(images), args.no_progress) as bar:
        for outcome in answer_files(client, images, args.batch_size, args.concurrency, embedding=True,
                                    on_done=bar.update):
            summary.add(outcome)
            if outcome.failed:
                report_failure(bar, outcome)
                failed.append(outcome.row())
                continue
            vectors.append(outcome.answer["embedding"])
            files.append(str(outcome.path))
            if isinstance(outcome.answer.get("model_version"), str):
                versions.add(outcome.answer["model_version"])
    _print_summary(summary)
    if not vectors:
        raise BadImageError(f"none of the {len(images)} images was answered; nothing written")
    import numpy as np

    if len({len(vector) for vector in vectors}) != 1:
        raise ClientError("the server answered embeddings of different lengths")
    matrix = np.asarray(vectors, dtype=np.float32)
    sidecar = {"files": files, "count": len(files), "dim": int(matrix.shape[1]), "model": args.model_name,
               "model_version": versions.pop() if len(versions) == 1 else None, "failed": failed}
    write_embeddings(out, matrix, sidecar)
    print(f"wrote {matrix.shape[0]} x {matrix.shape[1]} float32 embeddings to {out}; "
          f"file order in {sidecar_path(out)}")
    return BadImageError.exit_code if failed else 0


def ping(args: argparse.Namespace) -> int:
    """Whether the server answers (and accepts the token)."""
    with _client(args) as client:
        print(client.ping())
    return 0


def lifecycle(args: argparse.Namespace) -> int:
    """status, list, register, set-default, unregister and scale, on the management API."""
    from .api import default_endpoints
    from .lifecycle import ManagementClient
    from .rest import check_url

    url = check_url(args.url) if args.url else default_endpoints(args.config).management
    _refuse_python_runtime(args, url)
    with ManagementClient(url, model=args.model_name, token=_token("management", args, url), timeout=args.timeout,
                          retries=args.retries, config=args.config) as mgmt:
        if args.command == "status":
            status = mgmt.status()
            print(json.dumps(status.to_json(), indent=2) if args.format == "json" else status.text())
        elif args.command == "list":
            for model in mgmt.list_models():
                print(json.dumps(model))
        elif args.command == "register":
            print(mgmt.register(args.mar, args.model_version, args.workers, args.model_store))
        elif args.command == "set-default":
            print(mgmt.set_default(args.version))
        elif args.command == "unregister":
            print(mgmt.unregister(args.version))
        elif args.command == "scale":
            print(mgmt.scale(args.min_workers, args.max_workers, args.model_version))
    return 0


def drift(args: argparse.Namespace) -> int:
    """Live inputs against the served model's drift baseline, from /metrics or Prometheus."""
    from .api import default_endpoints
    from .drift import run
    from .rest import check_url

    if args.prometheus:
        check_url(args.prometheus, "--prometheus")
    url = None if args.prometheus else (check_url(args.url) if args.url else default_endpoints(args.config).metrics)
    return run(url, args.prometheus, args.model_name, args.timeout, args.interval, args.window, args.min_images,
               args.format == "json", args.model_version)


def rotate_token(args: argparse.Namespace) -> int:
    """Rotate one key; say where the new one is and when it expires (the server's answer carries no key)."""
    from torchserve_api.management import rotate_key

    from .api import default_endpoints
    from .rest import check_url, is_loopback

    url = check_url(args.url) if args.url else default_endpoints(args.config).management
    key_file = None if args.token else args.key_file or (tokens.key_file_for(url) if is_loopback(url) else None)
    if args.token:
        api_key = tokens.Token(args.token, source="--token")
    elif key_file is None:
        raise ClientUsageError(f"{url} is not on this machine: pass its API key with --token or its key file "
                               "with --key-file")
    else:
        api_key = tokens.from_key_file(key_file, "API")
    before = tokens.from_key_file(key_file, args.kind) if key_file else None
    rotate_key(url, args.kind, api_key, args.timeout, args.config)
    where = url.split("//", 1)[-1].rstrip("/")
    after = tokens.from_key_file(key_file, args.kind) if key_file else None
    if after is None or before is None or after.value == before.value:
        copy = f" ({key_file} still holds the old one: it is not that server's key file)" if key_file else ""
        print(f"rotated the {args.kind} key of {where}: the new key is in the key_file.json of the server's working "
              f"directory{copy}")
    else:
        expires = f", expires {after.expires:%Y-%m-%d %H:%M:%S} UTC" if after.expires else ""
        print(f"rotated the {args.kind} key of {where}: the new key is in {key_file}{expires}; the old one is "
              "refused from now on")
    return 0


def lifecycle_config(args: argparse.Namespace) -> int:
    """A copy of config.properties with enable_model_api=true."""
    from .lifecycle import write_lifecycle_config

    base = cli_common.input_file(args.base, "--base")
    print(write_lifecycle_config(cli_common.output_file(args.out, "--out"), base))
    return 0


#: The runner of each command; the lifecycle commands (status, list, register, ...) share `lifecycle`.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "predict": predict, "embed": embed, "ping": ping, "drift": drift, "rotate-token": rotate_token,
    "lifecycle-config": lifecycle_config}


def run(args: argparse.Namespace) -> int:
    """Run the command `args` names; its exit status."""
    return COMMANDS.get(args.command, lifecycle)(args)
