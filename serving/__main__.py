"""python -m serving start|stop|samples: run the model on TorchServe with the project's config.

Classify images and read the model's state with python -m client predict and python -m client status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli_common import (EXIT_INTERRUPTED, EXIT_USAGE, Parser, UsageError, fail, input_dir, input_file, os_error,
                        output_dir, positive_seconds)
from settings import CONFIG_FILE, DEFAULT_MODEL_STORE, MODEL_NAME, REPO, SettingsError, check_model_name, read_properties

from .server import Instance, ServerError, start, stop

PROG = "python -m serving"


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__)
    p.add_argument("--config", type=Path, default=CONFIG_FILE, help="TorchServe config.properties")
    p.add_argument("--workdir", type=Path, default=REPO, help="where logs/ and key_file.json go")
    p.add_argument("--model-name", default=MODEL_NAME, help="TorchServe model name")
    sub = p.add_subparsers(dest="command", required=True, metavar="{start,stop,samples}")
    s = sub.add_parser("start", help="start TorchServe and wait until the model's workers are READY")
    s.add_argument("--model-store", type=Path, default=DEFAULT_MODEL_STORE, help="folder holding <model-name>.mar")
    s.add_argument("--timeout", type=positive_seconds, default=120.0, help="seconds to wait for READY workers")
    sub.add_parser("stop", help="stop TorchServe and its workers")
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
        input_dir(args.model_store, "--model-store")


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
    except ServerError as exc:
        return fail("serving", exc)
    except OSError as exc:
        return fail("serving", os_error(exc))
    except KeyboardInterrupt:
        return fail("serving", "interrupted", EXIT_INTERRUPTED)


def _start(args: argparse.Namespace, instance: Instance) -> int:
    seconds = start(instance, args.model_store.resolve(), timeout=args.timeout)
    url = instance.endpoints.inference
    print(f"TorchServe READY in {seconds:.1f}s: {url}/predictions/{instance.model_name}")
    print(f"tokens: {instance.key_file} (inference key under \"inference\")")
    print(f"try:  .venv/bin/python -m client predict samples/digit_7.png --model-name {instance.model_name}")
    print("stop: .venv/bin/python -m serving stop")
    return 0


def _stop(instance: Instance) -> int:
    print("TorchServe stopped" if stop(instance) else "TorchServe was not running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
