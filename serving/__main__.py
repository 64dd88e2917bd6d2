"""python -m serving start|stop|samples: run the model on TorchServe (or, --runtime python, without Java) with the
project's config.

Classify images and read the model's state with python -m client predict and python -m client status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli_common import (EXIT_INTERRUPTED, EXIT_USAGE, Parser, UsageError, fail, input_dir, input_file, os_error,
                        output_dir, positive_seconds)
from settings import CONFIG_FILE, MODEL_NAME, REPO, SettingsError, check_model_name, read_properties
from serving.runtimes import DEFAULT_SERVING_RUNTIME, SERVING_RUNTIMES

from .server import (Instance, LocalServerError, holder_of, model_store_for, recorded_on_ports, server_name, start,
                     stop)

PROG = "python -m serving"


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__)
    p.add_argument("--config", type=Path, default=CONFIG_FILE, help="TorchServe config.properties")
    p.add_argument("--workdir", type=Path, default=REPO, help="where logs/ and key_file.json go")
    p.add_argument("--model-name", default=MODEL_NAME, help="TorchServe model name")
    sub = p.add_subparsers(dest="command", required=True, metavar="{start,stop,samples}")
    s = sub.add_parser("start", help="start TorchServe and wait until the model's workers are READY")
    s.add_argument("--model-store", type=Path, help="folder holding the archives (default: model_store in --config, "
                                                    "relative to its folder; else the repository's model_store/)")
    s.add_argument("--mar", action="append", metavar="FILE", help="an archive in the model store to load; repeat it "
                   "to serve several versions, the first one the default (default: load_models in --config)")
    s.add_argument("--timeout", type=positive_seconds, default=120.0, help="seconds to wait for READY workers")
    s.add_argument("--no-front", dest="front", action="store_false",
                   help="TorchServe alone on the inference port, without serving/front.py: up to 1.7x the "
                        "requests at c=16 on 2 cores, but curl --data-binary of an image can get TorchServe's 500 "
                        "(docs/serving.md)")
    s.add_argument("--runtime", choices=tuple(SERVING_RUNTIMES), default=DEFAULT_SERVING_RUNTIME,
                   help="torchserve (default), or python: the same archives on the config's ports without Java "
                        "(no management API; docs/decisions.md says when to choose it)")
    sub.add_parser("stop", help="stop the server (either runtime) and its workers")
    sm = sub.add_parser("samples", help="write sample digit PNGs")
    sm.add_argument("--out", type=Path, default=REPO / "samples", help="folder to write them to")
    return p


def _check(args: argparse.Namespace) -> None:
    """The paths the command uses, before anything starts: UsageError naming the flag otherwise."""
    if args.command == "samples":
        output_dir(args.out, "--out")
        return
    check_model_name(args.model_name)
    read_properties(input_file(args.config, "--config"))  # a line TorchServe would read differently is refused here
    output_dir(args.workdir, "--workdir")
    if args.command == "start":
        from_config = args.model_store is None and "model_store" in read_properties(args.config)
        flag = f"model_store of {args.config}:" if from_config else "--model-store"
        args.model_store = model_store_for(args.config, args.model_store)
        input_dir(args.model_store, flag)
        args.mar = [_archive(args.model_store, mar) for mar in args.mar or ()]


def _archive(store: Path, mar: str) -> str:
    """The file name of archive `mar` (a name or a path) in the model store; UsageError if it is not there."""
    path = store / mar if Path(mar).name == mar else Path(mar).resolve()
    if path.parent != store:
        raise UsageError(f"--mar {mar}: not in the model store {store}; copy it there or pass --model-store")
    input_file(path, "--mar")
    return path.name


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _check(args)
    except (UsageError, SettingsError) as exc:
        return fail(PROG, exc, EXIT_USAGE)
    try:
        if args.command == "samples":
            from .samples import write_samples

            for path in write_samples(args.out):
                print(path)
            return 0
        instance = Instance(args.workdir.resolve(), args.config.resolve(), args.model_name)
        return _start(args, instance) if args.command == "start" else _stop(instance)
    except LocalServerError as exc:
        return fail("serving", exc)
    except OSError as exc:
        return fail("serving", os_error(exc))
    except KeyboardInterrupt:
        return fail("serving", "interrupted", EXIT_INTERRUPTED)


def _start(args: argparse.Namespace, instance: Instance) -> int:
    models = ",".join(args.mar) or None
    if args.runtime == "python":
        from . import python_server

        seconds = python_server.start(instance, args.model_store, models, timeout=args.timeout)
    else:
        seconds = start(instance, args.model_store, models, timeout=args.timeout, front=args.front)
    url = instance.endpoints.inference
    print(f"{server_name(instance)} READY in {seconds:.1f}s: {url}/predictions/{instance.model_name}")
    if instance.token_auth:
        print(f"tokens: {instance.key_file} (inference key under \"inference\")")
    config = "" if instance.config == CONFIG_FILE.resolve() else f" --config {instance.config}"
    print(f"try:  .venv/bin/python -m client predict samples/digit_7.png --model-name {instance.model_name}{config}")
    print(f"stop: .venv/bin/python -m serving{config} stop")
    return 0


def _stop(instance: Instance) -> int:
    """Stop the TorchServe of --workdir, else the one a project command started on the ports of --config; name
    what else holds those ports, which it did not start and leaves alone."""
    name = server_name(instance)
    if stop(instance):
        print(f"{name} stopped ({instance.workdir})")
        return 0
    found = recorded_on_ports(instance)
    for other in found:
        name = server_name(other)
        if stop(other):
            print(f"{name} stopped ({other.workdir}, on the ports of {instance.config})")
    if found:
        return 0
    holders = {port: holder_of(port) for port in set(instance.endpoints.ports().values())}
    held = [f"port {port} ({what}) is held{holders[port]}" for what, port in instance.endpoints.ports().items()
            if holders[port]]
    if held:
        raise LocalServerError(f"{'; '.join(held)}: no project command recorded starting it, so it is left running; "
                          "stop it yourself or pass --config with other ports")
    print("TorchServe was not running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
