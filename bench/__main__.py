"""`python -m bench <subcommand> [options]`: one entry point for every benchmark.

`python -m bench` with no subcommand, or with only the main benchmark's options (`python -m bench --quick`),
runs the main benchmark, as `python -m bench run` does. Each subcommand is its module's `main(argv)`, imported
only when chosen. The modules still run on their own as well (`python -m bench.soak` is `python -m bench soak`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

#: Subcommand -> (module, what it measures). The order is the order of `python -m bench --help`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("bench.run", "the main benchmark: ceiling, TorchServe REST and gRPC, peer servers, cold start, gallery "
                         "(the default)"),
    "latency": ("bench.latency", "batch delay / size and worker count against the low-load latency target"),
    "container": ("bench.container", "the serving image against the same configuration outside a container"),
    "soak": ("bench.soak", "a long steady load: errors, latency and RSS growth per window"),
    "client-batch": ("bench.client_batch", "images/s of python -m client predict over a folder, by --batch-size"),
}
DEFAULT = "run"


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name.ljust(width)}  {summary}" for name, (_, summary) in SUBCOMMANDS.items())
    return (f"usage: python -m bench [SUBCOMMAND] [options]\n\nsubcommands:\n{rows}\n\n"
            f"Without a subcommand the options go to `{DEFAULT}` (python -m bench --quick is python -m bench run "
            "--quick).\n`python -m bench SUBCOMMAND --help` lists a subcommand's options; bench/README.md says what "
            "each one writes.\n")


def resolve(argv: list[str]) -> tuple[str, list[str]]:
    """(subcommand, its arguments). An underscore spelling (client_batch) names the same subcommand."""
    if not argv or argv[0].startswith("-"):
        return DEFAULT, argv
    name = argv[0].replace("_", "-")
    if name not in SUBCOMMANDS:
        raise KeyError(argv[0])
    return name, argv[1:]


def entry(name: str) -> Callable[[list[str] | None], int]:
    """The subcommand's `main`, its module imported now."""
    return importlib.import_module(SUBCOMMANDS[name][0]).main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"], ["help"]):
        sys.stdout.write(usage())
        return 0
    try:
        name, rest = resolve(argv)
    except KeyError as exc:
        sys.stderr.write(usage() + f"\npython -m bench: error: unknown subcommand {exc.args[0]!r}\n")
        return 2
    return entry(name)(rest)


if __name__ == "__main__":
    sys.exit(main())
