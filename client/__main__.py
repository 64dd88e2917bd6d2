"""python -m client: classify or embed images and manage model versions on TorchServe (or KServe).

predict and embed take image files and folders (searched recursively, so DIR/<label>/*.png works), send
--batch-size images per request with --concurrency requests in flight, go on past files that cannot be read or
that the server refuses, and end with a summary on stderr.

Exit codes: 0 ok, 1 unexpected answer, 2 usage, 3 token refused, 4 model not loaded, 5 at least one image
failed (unreadable or refused), 6 timeout, 7 cannot connect, 8 server error, 9 lifecycle operation refused;
drift: 10 drift detected, 11 no baseline metrics, 12 too few answered images. The table: client/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

import cli_common
from cli_common import Parser, non_negative_int, positive_int, positive_seconds
from settings import CONFIG_FILE, DEFAULT_MODEL_STORE, MODEL_NAME, SettingsError

from . import tokens
from .batch import CSV_COLUMNS, FORMATS, RowWriter, Summary, answer_files, walk
from .errors import BadImageError, ClientError, UsageError

#: Images per request by default: measured against the shipped TorchServe (docs/performance.md).
DEFAULT_BATCH_SIZE = 64
PROTOCOL_HELP = "rest (TorchServe REST), grpc (TorchServe gRPC), v1 or v2 (KServe)"
EPILOG = ("exit codes: 0 ok, 1 unexpected answer, 2 usage, 3 token refused, 4 model not loaded, 5 image failed, "
          "6 timeout, 7 cannot connect, 8 server error, 9 lifecycle refused, 10-12 drift (see client/README.md)")


def _token(kind: tokens.Kind, args: argparse.Namespace, url: str) -> tokens.Token:
    """This machine's default key file is only read for a server on this machine: its keys never go elsewhere."""
    from .rest import is_loopback

    return tokens.resolve(kind, args.token, args.key_file, default_key_file=is_loopback(url))


def _common(parser: argparse.ArgumentParser, management: bool) -> None:
    what = "management" if management else "inference"
    parser.add_argument("--url", help=f"{what} address, http(s)://host:port (gRPC: host:port) "
                                      "(default: the address in --config)")
    parser.add_argument("--config", type=Path, default=CONFIG_FILE, help="config.properties that gives the addresses")
    parser.add_argument("--model-name", default=MODEL_NAME, help="model name")
    parser.add_argument("--timeout", type=positive_seconds, default=120.0 if management else 30.0,
                        help="seconds per request")
    parser.add_argument("--retries", type=non_negative_int, default=3, help="retries on connection errors and 503")
    auth = parser.add_mutually_exclusive_group()
    env = tokens.ENV["management" if management else "inference"]
    auth.add_argument("--token", help=f"{what} token (default: ${env}, then the key file)")
    auth.add_argument("--key-file", type=Path, help="TorchServe key_file.json (default: ./key_file.json, read only "
                                                    "for a server on this machine)")


def _protocol(parser: argparse.ArgumentParser) -> None:
    proto = parser.add_mutually_exclusive_group()
    proto.add_argument("--protocol", choices=("rest", "grpc", "v1", "v2"), default="rest", help=PROTOCOL_HELP)
    proto.add_argument("--grpc", dest="protocol", action="store_const", const="grpc", help="short for --protocol grpc")


def _bulk(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("images", nargs="+", metavar="PATH", help="image file, or folder searched recursively for "
                                                                  "image files")
    _common(parser, management=False)
    _protocol(parser)
    parser.add_argument("--model-version", help="a specific version (default: the server's default version)")
    parser.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE,
                        help="images per request (rest, v1, v2; gRPC sends one per call); 1 sends each image alone")
    parser.add_argument("--concurrency", type=positive_int, default=4, help="requests in flight")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (default: a bar "
                                                                   "when stderr is a terminal)")


def _add(sub: Any, name: str, summary: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=summary, description=summary, epilog=EPILOG, allow_abbrev=False)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m client", description=__doc__, epilog=EPILOG, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pr = _add(sub, "predict", "classify images (files or folders); one row per image in --format")
    _bulk(pr)
    pr.add_argument("--format", choices=FORMATS, default="jsonl",
                    help="jsonl: one JSON object per line; csv: a header and one row per image; json: one array")
    pr.add_argument("--out", type=Path, help="file to write (default: standard output)")

    em = _add(sub, "embed", "embeddings of images (files or folders) into an (N, dim) float32 .npy")
    _bulk(em)
    em.add_argument("--out", type=Path, required=True,
                    help="the .npy to write (required); the file order and the failed files go beside it in "
                         "<out stem>.files.json")

    pg = _add(sub, "ping", "check the server answers (and accepts the token)")
    _common(pg, management=False)
    _protocol(pg)

    st = _add(sub, "status", "versions, default version, workers and batching of the model")
    _common(st, management=True)
    st.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    ls = _add(sub, "list", "models on the server, one JSON object per line")
    _common(ls, management=True)
    rg = _add(sub, "register", "register a version from a .mar (needs enable_model_api=true)")
    _common(rg, management=True)
    rg.add_argument("--mar", required=True, help="archive path, a file name in the server's model store, or a URL "
                                                 "(required)")
    rg.add_argument("--model-version", required=True, help="the version the archive holds (required)")
    rg.add_argument("--workers", type=positive_int, help="initial workers (default: TorchServe's)")
    rg.add_argument("--model-store", type=Path, default=DEFAULT_MODEL_STORE,
                    help="the server's model store: archives in it are registered by name")
    sd = _add(sub, "set-default", "make VERSION the default (rollback: set the previous one)")
    _common(sd, management=True)
    sd.add_argument("version", metavar="VERSION", help="the version to make the default")
    ur = _add(sub, "unregister", "remove a version that is not the default (needs enable_model_api=true)")
    _common(ur, management=True)
    ur.add_argument("version", metavar="VERSION", help="the version to remove")
    sc = _add(sub, "scale", "set the worker range of the default (or --model-version) version")
    _common(sc, management=True)
    sc.add_argument("--min", type=non_negative_int, required=True, dest="min_workers",
                    help="fewest workers (required)")
    sc.add_argument("--max", type=positive_int, required=True, dest="max_workers", help="most workers (required)")
    sc.add_argument("--model-version", help="the version to scale (default: the default version)")

    dr = _add(sub, "drift", "live inputs vs the served model's drift baseline, from /metrics or Prometheus")
    src = dr.add_mutually_exclusive_group()
    src.add_argument("--url", help="TorchServe metrics address (default: metrics_address in --config)")
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus scraping the server, e.g. "
                                                         "http://127.0.0.1:9091 (default: read /metrics of --url)")
    dr.add_argument("--config", type=Path, default=CONFIG_FILE, help="config.properties that gives the metrics address")
    dr.add_argument("--model-name", default=MODEL_NAME, help="model name")
    dr.add_argument("--model-version", help="judge this version alone (default: each loaded version against its "
                                            "own baseline)")
    dr.add_argument("--interval", type=float, default=0.0,
                    help="/metrics only: judge the traffic between two scrapes this many seconds apart; 0 judges "
                         "everything since the server started")
    dr.add_argument("--window", default="1h", help="Prometheus only: judge the last WINDOW")
    dr.add_argument("--min-images", type=positive_int, default=50, help="answered images needed to judge")
    dr.add_argument("--timeout", type=positive_seconds, default=10.0, help="seconds per HTTP call")
    dr.add_argument("--format", choices=("table", "json"), default="table", help="output format")

    rt = _add(sub, "rotate-token", "have TorchServe replace its inference or management key before it expires")
    rt.add_argument("kind", choices=("inference", "management"), metavar="KIND",
                    help="the key to replace: inference or management")
    rt.add_argument("--url", help="management address (default: management_address in --config)")
    rt.add_argument("--config", type=Path, default=CONFIG_FILE, help="config.properties that gives the address")
    rt.add_argument("--timeout", type=positive_seconds, default=30.0, help="seconds per request")
    api = rt.add_mutually_exclusive_group()
    api.add_argument("--token", help="the server's API key (default: the API entry of the key file)")
    api.add_argument("--key-file", type=Path, help="the server's key_file.json: its API key is sent, and the new "
                                                   "key is read back from it (default: ./key_file.json, read only "
                                                   "for a server on this machine)")

    lc = _add(sub, "lifecycle-config", "write a copy of config.properties with enable_model_api=true")
    lc.add_argument("--out", type=Path, required=True, help="the file to write (required)")
    lc.add_argument("--base", type=Path, default=CONFIG_FILE, help="the config.properties to copy")
    return p


class _NoBar:
    """What the run uses of a tqdm bar, for runs without one (tqdm is then not imported: it costs start-up)."""

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def clear(self) -> None:
        pass

    def write(self, text: str, file: TextIO | None = None) -> None:
        print(text, file=file or sys.stderr)


def _progress(total: int, disabled: bool) -> Any:
    if disabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="img", file=sys.stderr, leave=False)


def _report(bar: Any, outcome: Any) -> None:
    status = f" (HTTP {outcome.status})" if outcome.status else ""
    bar.write(f"client: failed: {outcome.path}: {outcome.error}{status}", file=sys.stderr)


@contextlib.contextmanager
def _output(out: Path | None) -> Iterator[TextIO]:
    """Standard output, or a temporary file beside `out` renamed onto it when the run completes (a run stopped by an
    error leaves no partial file)."""
    if out is None:
        yield sys.stdout
        return
    created = [folder for folder in [out.parent, *out.parent.parents] if not folder.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            yield fh
        os.replace(name, out)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        for folder in created:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


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


def predict_output(path: Path) -> bool:
    """Whether `path` holds predict's output in any format: its CSV header, an empty JSON array, or a first row that
    is an image's answer or failure."""
    with open(path, "rb") as fh:
        first = fh.readline(1 << 20)
        if first == b"[\n":  # a JSON array: the first row is on the next line
            first = fh.readline(1 << 20).rstrip(b",\n")
    if first in (",".join(CSV_COLUMNS).encode() + b"\n", b"[]\n"):
        return True
    row = json.loads(first)
    if not isinstance(row, dict) or next(iter(row), None) != "image":
        return False
    return {"error", "status", "kind"} <= row.keys() or set(CSV_COLUMNS[1:-2]) <= row.keys()


def embed_listing(path: Path) -> bool:
    """Whether `path` is the file list that embed writes beside its .npy."""
    listing = json.loads(Path(path).read_text())
    return isinstance(listing, dict) and {"files", "count", "dim", "model", "failed"} <= listing.keys()


def embed_output(path: Path) -> bool:
    """Whether `path` is an .npy that embed wrote: an .npy with embed's file list beside it."""
    with open(path, "rb") as fh:
        return fh.read(6) == b"\x93NUMPY" and embed_listing(sidecar_path(path))


def _predict(args: argparse.Namespace) -> int:
    out = _writable(args.out, "--out", predict_output, args.images) if args.out else None
    images = walk(args.images)
    summary = Summary()
    with _client(args) as client, _output(out) as stream, _progress(len(images), args.no_progress) as bar:
        writer = RowWriter(stream, args.format)
        for outcome in answer_files(client, images, args.batch_size, args.concurrency, on_done=bar.update):
            summary.add(outcome)
            if outcome.failed:
                _report(bar, outcome)
            if out is None:
                bar.clear()
            writer.write(outcome.row())
        writer.close()
    for line in summary.lines():
        print(line, file=sys.stderr)
    return BadImageError.exit_code if summary.failed else 0


def sidecar_path(out: Path) -> Path:
    """Where embed lists the file order: embeddings.npy -> embeddings.files.json."""
    return out.with_name(f"{out.stem if out.suffix == '.npy' else out.name}.files.json")


def _embed(args: argparse.Namespace) -> int:
    """The embeddings of every answered image, in order; failed files are listed, not embedded."""
    out = _writable(args.out, "--out", embed_output, args.images)
    _writable(sidecar_path(out), "--out's file list", embed_listing, args.images)
    images = walk(args.images)
    summary = Summary()
    vectors: list[list[float]] = []
    files: list[str] = []
    failed: list[dict[str, Any]] = []
    versions: set[str] = set()
    with _client(args) as client, _progress(len(images), args.no_progress) as bar:
        for outcome in answer_files(client, images, args.batch_size, args.concurrency, embedding=True,
                                    on_done=bar.update):
            summary.add(outcome)
            if outcome.failed:
                _report(bar, outcome)
                failed.append(outcome.row())
                continue
            vectors.append(outcome.answer["embedding"])
            files.append(str(outcome.path))
            if isinstance(outcome.answer.get("model_version"), str):
                versions.add(outcome.answer["model_version"])
    for line in summary.lines():
        print(line, file=sys.stderr)
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


def write_embeddings(out: Path, matrix: Any, sidecar: dict[str, Any]) -> None:
    """The .npy (no pickle) and its sidecar, each written to a temporary file and renamed into place."""
    import numpy as np

    targets = [(out, lambda fh: np.save(fh, matrix, allow_pickle=False)),
               (sidecar_path(out), lambda fh: fh.write(json.dumps(sidecar, indent=1).encode()))]
    temps: list[Path] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for target, write in targets:
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
            temps.append(Path(name))
            with os.fdopen(fd, "wb") as fh:
                write(fh)
        for (target, _), temp in zip(targets[::-1], temps[::-1]):  # the sidecar first: an .npy always has one
            os.replace(temp, target)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)


def _ping(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(client.ping())
    return 0


def _lifecycle(args: argparse.Namespace) -> int:
    from .api import default_endpoints
    from .lifecycle import ManagementClient
    from .rest import check_url

    url = check_url(args.url) if args.url else default_endpoints(args.config).management
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


def _drift(args: argparse.Namespace) -> int:
    from .api import default_endpoints
    from .drift import run
    from .rest import check_url

    if args.prometheus:
        check_url(args.prometheus, "--prometheus")
    url = None if args.prometheus else (check_url(args.url) if args.url else default_endpoints(args.config).metrics)
    return run(url, args.prometheus, args.model_name, args.timeout, args.interval, args.window, args.min_images,
               args.format == "json", args.model_version)


def _rotate_token(args: argparse.Namespace) -> int:
    """Rotate one key; say where the new one is and when it expires (the server's answer carries no key)."""
    from torchserve_api.management import rotate_key

    from .api import default_endpoints
    from .rest import check_url, is_loopback

    url = check_url(args.url) if args.url else default_endpoints(args.config).management
    key_file = None if args.token else args.key_file or (tokens.DEFAULT_KEY_FILE if is_loopback(url) else None)
    if args.token:
        api_key = tokens.Token(args.token, source="--token")
    elif key_file is None:
        raise UsageError(f"{url} is not on this machine: pass its API key with --token or its key file with "
                         "--key-file")
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


def _lifecycle_config(args: argparse.Namespace) -> int:
    from .lifecycle import write_lifecycle_config

    base = cli_common.input_file(args.base, "--base")
    print(write_lifecycle_config(cli_common.output_file(args.out, "--out"), base))
    return 0


COMMANDS = {"predict": _predict, "embed": _embed, "ping": _ping, "drift": _drift, "rotate-token": _rotate_token,
            "lifecycle-config": _lifecycle_config}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS.get(args.command, _lifecycle)(args)
    except ClientError as exc:
        return cli_common.fail("client", exc, exc.exit_code)
    except (cli_common.UsageError, SettingsError) as exc:
        return cli_common.fail("client", exc, UsageError.exit_code)
    except OSError as exc:
        return cli_common.fail("client", cli_common.os_error(exc))
    except KeyboardInterrupt:
        print("client: interrupted", file=sys.stderr)
        return cli_common.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
