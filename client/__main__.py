"""``python -m client``: classify or embed images and manage model versions on TorchServe (or KServe).

Exit codes are listed in :mod:`client.errors` (0 ok, 2 usage, 3 token, 4 model not loaded, 5 image
refused, 6 timeout, 7 cannot connect, 8 server error, 9 lifecycle operation refused; ``drift``: 10 drift
detected, 11 no baseline metrics, 12 too few answered images).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from settings import CONFIG_FILE, DEFAULT_MODEL_STORE, MODEL_NAME

from . import tokens
from .errors import BadImageError, ClientError, UsageError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
PER_IMAGE = (BadImageError,)  # reported on the image's line; anything else (a timeout too) stops the run


def expand_images(args: Sequence[str]) -> list[Path]:
    """Files as given; a folder contributes its image files (by extension), sorted by name."""
    images: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise UsageError(f"{path}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
            images.extend(found)
        elif path.is_file():
            images.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder")
    return images


def _token(kind: tokens.Kind, args: argparse.Namespace, url: str) -> tokens.Token:
    """This machine's default key file is only read for a server on this machine: its keys never go elsewhere."""
    from .rest import is_loopback

    return tokens.resolve(kind, args.token, args.key_file, default_key_file=is_loopback(url))


def _common(parser: argparse.ArgumentParser, management: bool) -> None:
    what = "management" if management else "inference"
    parser.add_argument("--url", help=f"{what} address (default: from --config; gRPC: host:port)")
    parser.add_argument("--config", type=Path, default=CONFIG_FILE, help="config.properties for default addresses")
    parser.add_argument("--model", default=MODEL_NAME, help=f"model name (default {MODEL_NAME})")
    parser.add_argument("--timeout", type=float, default=120.0 if management else 30.0, help="seconds per request")
    parser.add_argument("--retries", type=int, default=3, help="retries on connection errors and 503 (default 3)")
    auth = parser.add_mutually_exclusive_group()
    env = tokens.ENV["management" if management else "inference"]
    auth.add_argument("--token", help=f"{what} token (default: ${env}, then the key file)")
    auth.add_argument("--key-file", type=Path, help="TorchServe key_file.json (default ./key_file.json)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m client", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("predict", help="classify images (files or folders); one JSON line per image")
    pr.add_argument("images", nargs="+", metavar="IMAGE", help="image file, or a folder of images")
    _common(pr, management=False)
    proto = pr.add_mutually_exclusive_group()
    proto.add_argument("--grpc", dest="protocol", action="store_const", const="grpc", help="TorchServe gRPC")
    proto.add_argument("--protocol", choices=("rest", "grpc", "v1", "v2"), default="rest",
                       help="rest (TorchServe, default), grpc (TorchServe), v1/v2 (KServe)")
    pr.set_defaults(protocol="rest")
    pr.add_argument("--model-version", help="a specific version (default: the server's default version)")
    pr.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    em = sub.add_parser("embed", help="embeddings of images (files or folders) into an (N, dim) float32 .npy")
    em.add_argument("images", nargs="+", metavar="IMAGE", help="image file, or a folder of images")
    em.add_argument("--out", type=Path, required=True, help="the .npy to write; the file order goes beside it "
                                                             "in <out stem>.files.json")
    _common(em, management=False)
    em.add_argument("--protocol", choices=("rest", "grpc", "v1", "v2"), default="rest",
                    help="rest (TorchServe, default), grpc (TorchServe), v1/v2 (KServe)")
    em.add_argument("--grpc", dest="protocol", action="store_const", const="grpc", help="TorchServe gRPC")
    em.add_argument("--model-version", help="a specific version (default: the server's default version)")
    em.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    em.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    pg = sub.add_parser("ping", help="check the server answers (and accepts the token)")
    _common(pg, management=False)
    pg.add_argument("--protocol", choices=("rest", "grpc", "v1", "v2"), default="rest")
    pg.add_argument("--grpc", dest="protocol", action="store_const", const="grpc")
    pg.set_defaults(protocol="rest")

    st = sub.add_parser("status", help="versions, default version, workers, batching of the model")
    _common(st, management=True)
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls = sub.add_parser("list", help="models on the server")
    _common(ls, management=True)
    rg = sub.add_parser("register", help="register a version from a .mar (needs enable_model_api=true)")
    _common(rg, management=True)
    rg.add_argument("--mar", required=True, help="archive path (or a file name in the server's model store, or URL)")
    rg.add_argument("--version", required=True, help="the version the archive holds")
    rg.add_argument("--workers", type=int, help="initial workers (default: TorchServe's)")
    rg.add_argument("--model-store", type=Path, default=DEFAULT_MODEL_STORE,
                    help="the server's model store: archives in it are registered by name (default model_store/)")
    sd = sub.add_parser("set-default", help="make VERSION the default (rollback: set the previous one)")
    _common(sd, management=True)
    sd.add_argument("version", metavar="VERSION")
    ur = sub.add_parser("unregister", help="remove a non-default VERSION (needs enable_model_api=true)")
    _common(ur, management=True)
    ur.add_argument("version", metavar="VERSION")
    sc = sub.add_parser("scale", help="set the worker range of the default (or --model-version) version")
    _common(sc, management=True)
    sc.add_argument("--min", type=int, required=True, dest="min_workers")
    sc.add_argument("--max", type=int, required=True, dest="max_workers")
    sc.add_argument("--model-version")
    dr = sub.add_parser("drift", help="live inputs vs the served model's drift baseline, from /metrics or Prometheus")
    src = dr.add_mutually_exclusive_group()
    src.add_argument("--url", help="TorchServe metrics address (default: metrics_address of --config)")
    src.add_argument("--prometheus", metavar="URL", help="a Prometheus scraping the server (e.g. http://127.0.0.1:9091)")
    dr.add_argument("--config", type=Path, default=CONFIG_FILE, help="config.properties for the default address")
    dr.add_argument("--model", default=MODEL_NAME, help=f"model name (default {MODEL_NAME})")
    dr.add_argument("--interval", type=float, default=0.0,
                    help="/metrics only: judge the traffic between two scrapes this many seconds apart "
                         "(default 0: everything since the server started)")
    dr.add_argument("--window", default="1h", help="Prometheus only: judge the last WINDOW (default 1h)")
    dr.add_argument("--min-images", type=int, default=50, help="answered images needed to judge (default 50)")
    dr.add_argument("--timeout", type=float, default=10.0, help="seconds per HTTP call")
    dr.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lc = sub.add_parser("lifecycle-config", help="write a copy of config.properties with enable_model_api=true")
    lc.add_argument("--out", type=Path, required=True)
    lc.add_argument("--base", type=Path, default=CONFIG_FILE)
    return p


def _predict(args: argparse.Namespace) -> int:
    from .api import EmbeddingClient, default_url

    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    images = expand_images(args.images)
    url = args.url or default_url(args.protocol, args.config)
    token = _token("inference", args, url)
    from tqdm import tqdm

    worst = 0
    results: dict[int, dict[str, Any] | ClientError] = {}
    printed = 0
    with EmbeddingClient(url, protocol=args.protocol, model=args.model, version=args.model_version, token=token,
                         timeout=args.timeout, retries=args.retries) as client, \
            tqdm(total=len(images), unit="img", file=sys.stderr, disable=True if args.no_progress else None,
                 leave=False) as bar:
        for index, result in client.predict_many(images, args.concurrency, on_done=bar.update):
            if isinstance(result, ClientError) and not isinstance(result, PER_IMAGE):
                raise result
            results[index] = result
            while printed in results:  # one line per image, in the order given
                out = results.pop(printed)
                line: dict[str, Any] = {"image": str(images[printed])}
                if isinstance(out, ClientError):
                    line.update(error=str(out), status=getattr(out, "status", None), kind=type(out).__name__)
                    worst = max(worst, out.exit_code)
                else:
                    line.update(out)
                bar.clear()
                print(json.dumps(line), flush=True)
                printed += 1
    return worst


def sidecar_path(out: Path) -> Path:
    """Where ``embed`` lists the file order: ``embeddings.npy`` -> ``embeddings.files.json``."""
    return out.with_name(f"{out.stem if out.suffix == '.npy' else out.name}.files.json")


def _embed(args: argparse.Namespace) -> int:
    """Every image's embedding, in the order given, or one error line and no output files."""
    from .api import EmbeddingClient, default_url

    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {out}: is a directory")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: no such folder {out.parent}")
    images = expand_images(args.images)
    url = args.url or default_url(args.protocol, args.config)
    token = _token("inference", args, url)
    from tqdm import tqdm

    vectors: dict[int, list[float]] = {}
    versions: set[str] = set()
    with EmbeddingClient(url, protocol=args.protocol, model=args.model, version=args.model_version, token=token,
                         timeout=args.timeout, retries=args.retries) as client, \
            tqdm(total=len(images), unit="img", file=sys.stderr, disable=True if args.no_progress else None,
                 leave=False) as bar:
        for index, result in client.predict_many(images, args.concurrency, on_done=bar.update, embedding=True):
            if isinstance(result, BadImageError):  # leaving the loop cancels what is not sent yet
                raise BadImageError(f"{images[index]}: {result}", result.status)
            if isinstance(result, ClientError):
                raise result
            vectors[index] = result["embedding"]
            if isinstance(result.get("model_version"), str):
                versions.add(result["model_version"])
    import numpy as np

    if len({len(vector) for vector in vectors.values()}) != 1:
        raise ClientError("the server answered embeddings of different lengths")
    matrix = np.asarray([vectors[i] for i in range(len(images))], dtype=np.float32)
    sidecar = {"files": [str(path) for path in images], "count": len(images), "dim": int(matrix.shape[1]),
               "model": args.model, "model_version": versions.pop() if len(versions) == 1 else None}
    write_embeddings(out, matrix, sidecar)
    print(f"wrote {matrix.shape[0]} x {matrix.shape[1]} float32 embeddings to {out}; "
          f"file order in {sidecar_path(out)}")
    return 0


def write_embeddings(out: Path, matrix: Any, sidecar: dict[str, Any]) -> None:
    """The .npy (no pickle) and its sidecar, each written to a temporary file and renamed into place."""
    import os
    import tempfile

    import numpy as np

    targets = [(out, lambda fh: np.save(fh, matrix, allow_pickle=False)),
               (sidecar_path(out), lambda fh: fh.write(json.dumps(sidecar, indent=1).encode()))]
    temps: list[Path] = []
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
    from .api import EmbeddingClient, default_url

    url = args.url or default_url(args.protocol, args.config)
    with EmbeddingClient(url, protocol=args.protocol, model=args.model, token=_token("inference", args, url),
                         timeout=args.timeout, retries=args.retries) as client:
        print(client.ping())
    return 0


def _lifecycle(args: argparse.Namespace) -> int:
    from .api import default_endpoints
    from .lifecycle import ManagementClient

    url = args.url or default_endpoints(args.config).management
    with ManagementClient(url, model=args.model, token=_token("management", args, url), timeout=args.timeout,
                          retries=args.retries) as mgmt:
        if args.command == "status":
            status = mgmt.status()
            print(json.dumps(status.to_json(), indent=2) if args.json else status.text())
        elif args.command == "list":
            for model in mgmt.list_models():
                print(json.dumps(model))
        elif args.command == "register":
            print(mgmt.register(args.mar, args.version, args.workers, args.model_store))
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

    url = None if args.prometheus else (args.url or default_endpoints(args.config).metrics)
    return run(url, args.prometheus, args.model, args.timeout, args.interval, args.window, args.min_images, args.json)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "predict":
            return _predict(args)
        if args.command == "embed":
            return _embed(args)
        if args.command == "ping":
            return _ping(args)
        if args.command == "drift":
            return _drift(args)
        if args.command == "lifecycle-config":
            from .lifecycle import write_lifecycle_config

            print(write_lifecycle_config(args.out, args.base))
            return 0
        return _lifecycle(args)
    except ClientError as exc:
        print(f"client: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("client: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
