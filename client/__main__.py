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
import sys
from pathlib import Path
from typing import Any, Sequence

import cli_common
from cli_common import Parser, non_negative_int, positive_int, positive_seconds
from settings import CONFIG_FILE, DEFAULT_MODEL_STORE, MODEL_NAME, SettingsError

from . import tokens
from .batch import FORMATS
from .commands import run
from .errors import ClientError
from .outputs import progress as _progress, sidecar_path  # noqa: F401 (tests/unit/test_client_batch.py reads them here)

#: Images per request by default: measured against the shipped TorchServe (docs/performance.md).
DEFAULT_BATCH_SIZE = 64
PROTOCOL_HELP = "rest (TorchServe REST), grpc (TorchServe gRPC), v1 or v2 (KServe)"
EPILOG = ("exit codes: 0 ok, 1 unexpected answer, 2 usage, 3 token refused, 4 model not loaded, 5 image failed, "
          "6 timeout, 7 cannot connect, 8 server error, 9 lifecycle refused, 10-12 drift (see client/README.md)")


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
    if not management:
        parser.add_argument("--gateway-token", metavar="JWT",
                            help=f"behind Kubeflow's ingress: your Kubeflow token, sent as the bearer (the key then "
                                 f"goes in X-API-Key) (default: ${tokens.GATEWAY_ENV})")


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


def _add_bulk_commands(sub: Any) -> None:
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


def _add_lifecycle_commands(sub: Any) -> None:
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


def _add_drift_command(sub: Any) -> None:
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


def _add_key_and_config_commands(sub: Any) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, in the order ``--help`` lists them."""
    p = Parser(prog="python -m client", description=__doc__, epilog=EPILOG, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_bulk_commands(sub)
    _add_lifecycle_commands(sub)
    _add_drift_command(sub)
    _add_key_and_config_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m client COMMAND ...`: run the command; its exit status (the module docstring lists them)."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ClientError as exc:
        return cli_common.fail("client", exc, exc.exit_code)
    except (cli_common.UsageError, SettingsError) as exc:
        return cli_common.fail("client", exc, cli_common.EXIT_USAGE)
    except OSError as exc:
        return cli_common.fail("client", cli_common.os_error(exc))
    except KeyboardInterrupt:
        print("client: interrupted", file=sys.stderr)
        return cli_common.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
