"""Compile options: what is fixed in the package when it is compiled (not a run parameter).

On the oldest supported backend (pipeline.backend.OLDEST) a Secret's name, the task pods' image pull secrets
and task resources cannot come from run parameters, so they are compile options; `--secret-name-parameter`
makes the storage Secret's name a run parameter for backends that read it (pipeline.backend.FEATURES).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Any

from . import params as P

#: Every task of the pipeline, as the compiled package names its component.
TASKS = ("load-data", "train", "build-index", "evaluate", "archive", "deploy-local", "compare-with-deployed",
         "deploy-kserve")


@dataclass(frozen=True)
class Resources:
    """Kubernetes quantities: CPU as "500m" or "2", memory as "768Mi" or "2G"."""

    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str


#: Requests are about the peak resident memory each task reached in a local run of the default parameters
#: (`python -m pipeline run-local`, deploy_target kserve with kserve_dry_run), limits leave headroom for
#: larger data sources; CPU: training and embedding use 2 cores, the others one or less.
DEFAULT_RESOURCES: dict[str, Resources] = {
    "load-data": Resources("500m", "1", "768Mi", "2Gi"),
    "train": Resources("2", "4", "1536Mi", "4Gi"),
    "build-index": Resources("1", "2", "1Gi", "3Gi"),
    "evaluate": Resources("1", "2", "1Gi", "3Gi"),
    "archive": Resources("500m", "1", "768Mi", "2Gi"),
    "deploy-local": Resources("1", "2", "1536Mi", "3Gi"),
    "compare-with-deployed": Resources("250m", "1", "512Mi", "1Gi"),
    "deploy-kserve": Resources("500m", "1", "768Mi", "2Gi"),
}


@dataclass(frozen=True)
class CompileOptions:
    storage_secret: str = P.STORAGE_SECRET.default
    secret_name_parameter: bool = False
    image_pull_secrets: tuple[str, ...] = ()
    resources: dict[str, Resources] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))

    def run_params(self) -> tuple[P.Param, ...]:
        """The pipeline's run parameters under these options."""
        storage_secret = replace(P.STORAGE_SECRET, default=self.storage_secret)
        return P.PARAMS + ((storage_secret,) if self.secret_name_parameter else ())

    def run_values(self, values: dict[str, Any]) -> dict[str, Any]:
        """Validated run parameters (pipeline.params.validate) completed with those these options add."""
        return {**values, P.STORAGE_SECRET.name: self.storage_secret} if self.secret_name_parameter else values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("compile options (fixed in the package)")
    group.add_argument("--storage-secret", default=P.STORAGE_SECRET.default, metavar="NAME",
                       help=P.STORAGE_SECRET.help + f" (default: {P.STORAGE_SECRET.default!r})")
    group.add_argument("--secret-name-parameter", action="store_true",
                       help="make the storage Secret's name the run parameter storage_secret (needs a newer KFP "
                            "backend: see pipeline/backend.py)")
    group.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                       help="Secret every task pod pulls the pipeline image with (repeatable)")
    group.add_argument("--task-cpu", action="append", default=[], metavar="TASK=REQUEST[/LIMIT]",
                       help=f"CPU of a task ({', '.join(TASKS)} or all); one value sets both")
    group.add_argument("--task-memory", action="append", default=[], metavar="TASK=REQUEST[/LIMIT]",
                       help="memory of a task, as --task-cpu")


def from_namespace(args: argparse.Namespace) -> CompileOptions:
    """The options given on the command line; ParamError (one line) for a value that cannot be used."""
    for name in (args.storage_secret, *args.image_pull_secret):
        if not P.SECRET_NAME.match(name):
            raise P.ParamError(f"{name!r} is not {P.SECRET_NAME_RULE}")
    resources = dict(DEFAULT_RESOURCES)
    for flag, kind in (("--task-cpu", "cpu"), ("--task-memory", "memory")):
        for text in getattr(args, flag[2:].replace("-", "_")):
            task, sep, value = text.partition("=")
            request, _, limit = value.partition("/")
            if not sep or not request or task not in (*TASKS, "all"):
                raise P.ParamError(f"{flag} {text!r}: expected TASK=REQUEST[/LIMIT], TASK one of "
                                   f"{', '.join(TASKS)} or all")
            for name in TASKS if task == "all" else (task,):
                resources[name] = replace(resources[name], **{f"{kind}_request": request,
                                                              f"{kind}_limit": limit or request})
    return CompileOptions(storage_secret=args.storage_secret, secret_name_parameter=args.secret_name_parameter,
                          image_pull_secrets=tuple(args.image_pull_secret), resources=resources)
