"""Compile options: what is fixed in the package when it is compiled (not a run parameter).

On the oldest supported backend (pipeline.kfp_backend.OLDEST) a Secret's name, the task pods' image pull secrets
and task resources cannot come from run parameters, so they are compile options; `--secret-name-parameter`
makes the storage Secret's name a run parameter for backends that read it (pipeline.kfp_backend.FEATURES).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Any

from . import kfp_backend
from . import params as P

#: What --secret-name-parameter puts in the package.
SECRET_NAME_PARAMETER = kfp_backend.FEATURES[("secretAsVolume", "secretNameParameter")]


@dataclass(frozen=True)
class Resources:
    """Kubernetes quantities: CPU as "500m" or "2", memory as "768Mi" or "2G"."""

    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str


#: Memory requests sit above the peak resident memory (kernel VmHWM, task process and its children) each task
#: reached in a local run of the default parameters with one epoch (`python -m pipeline run-local --epochs 1
#: --deploy-target kserve --kserve-dry-run`, mnist-sample): load-data 529 MiB, train 873, build-index 493,
#: evaluate 454, compare-with-deployed 75, deploy-kserve 251; archive 81 (its 3 s measured alone with GNU time
#: -v), check-quality 110 (kfp's executor imports and pipeline.quality on one metadata.json, GNU time -v).
#: Limits leave room for larger data sources (full MNIST or Fashion-MNIST). deploy-local refuses to run on a cluster. CPU: training and embedding
#: use several cores, the others about one.
DEFAULT_RESOURCES: dict[str, Resources] = {
    "load-data": Resources("500m", "1", "768Mi", "2Gi"),
    "train": Resources("2", "4", "1Gi", "4Gi"),
    "build-index": Resources("1", "2", "768Mi", "3Gi"),
    "evaluate": Resources("1", "2", "768Mi", "3Gi"),
    "archive": Resources("250m", "1", "256Mi", "1Gi"),
    "check-quality": Resources("250m", "500m", "256Mi", "512Mi"),
    "deploy-local": Resources("250m", "1", "256Mi", "512Mi"),
    "compare-with-deployed": Resources("250m", "500m", "256Mi", "512Mi"),
    "deploy-kserve": Resources("250m", "1", "512Mi", "1Gi"),
}
#: Every task of the pipeline, as the compiled package names its component.
TASKS = tuple(DEFAULT_RESOURCES)


@dataclass(frozen=True)
class CompileOptions:
    storage_secret: str = P.STORAGE_SECRET.default
    secret_name_parameter: bool = False
    image_pull_secrets: tuple[str, ...] = ()
    #: A claim mounted in the load-data task at settings.PVC_MOUNT_DEFAULT, for a pvc:// data_source.
    data_pvc_claim: str = ""
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
                       help="make the storage Secret's name the run parameter storage_secret (needs KFP backend "
                            f"{kfp_backend.version_text(SECRET_NAME_PARAMETER.since)} or later)")
    group.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                       help="Secret every task pod pulls the pipeline image with (repeatable)")
    group.add_argument("--data-pvc-claim", default="", metavar="CLAIM",
                       help="PersistentVolumeClaim mounted in the load-data task for a pvc://CLAIM/PATH data_source "
                            "(default: none)")
    group.add_argument("--task-cpu", action="append", default=[], metavar="TASK=REQUEST[/LIMIT]",
                       help=f"CPU of a task ({', '.join(TASKS)} or all); one value sets both")
    group.add_argument("--task-memory", action="append", default=[], metavar="TASK=REQUEST[/LIMIT]",
                       help="memory of a task, as --task-cpu")


def from_namespace(args: argparse.Namespace) -> CompileOptions:
    """The options given on the command line; ParamError (one line) for a value that cannot be used."""
    for name in (args.storage_secret, *args.image_pull_secret):
        if not P.SECRET_NAME.match(name):
            raise P.ParamError(f"{name!r} is not {P.SECRET_NAME_RULE}")
    if args.data_pvc_claim and not P.SECRET_NAME.match(args.data_pvc_claim):  # the same DNS-1123 subdomain rule
        raise P.ParamError(f"--data-pvc-claim {args.data_pvc_claim!r} is not a claim name: "
                           + P.SECRET_NAME_RULE.split(": ", 1)[1])
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
                          image_pull_secrets=tuple(args.image_pull_secret), data_pvc_claim=args.data_pvc_claim,
                          resources=resources)
