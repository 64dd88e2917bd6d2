"""`python -m pipeline compile|submit|run-local`: build, submit or run the Kubeflow pipeline."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, NoReturn

from serving.server import ServerError

from . import params as P
from .local_run import OutputArtifact, run_local

TOKEN_ENV = "KF_PIPELINES_TOKEN"
HOST_ENV = "KF_PIPELINES_ENDPOINT"  # the kfp client's own variable
SAMPLE_DIGIT = 7


class CliError(Exception):
    """One-line reason the command failed."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument on one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m pipeline", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    c = sub.add_parser("compile", help="write the pipeline package (YAML)")
    c.add_argument("--out", type=Path, default=Path("pipeline.yaml"))
    s = sub.add_parser("submit", help="compile and start a run on a Kubeflow Pipelines cluster")
    s.add_argument("--host", default=os.environ.get(HOST_ENV), help=f"KFP API URL (default: ${HOST_ENV})")
    s.add_argument("--experiment", default=None, help="experiment name (default: the client's, else 'Default')")
    s.add_argument("--namespace", default=None, help="user namespace on multi-user clusters")
    s.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token (default: ${TOKEN_ENV})")
    s.add_argument("--run-name", default=None)
    P.add_arguments(s)
    r = sub.add_parser("run-local", help="run every task here with kfp.local (subprocesses of this Python)")
    r.add_argument("--workdir", type=Path, default=Path("local_outputs"), help="pipeline root for the outputs")
    P.add_arguments(r, deploy_target="local")
    return p


def _compile(out: Path) -> Path:
    from kfp import compiler

    from .pipeline import mnist_embedding_pipeline

    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(mnist_embedding_pipeline, str(out))
    return out


def _unreachable_reason(exc: BaseException) -> str:
    import urllib3

    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    return str(exc).split(": ", 1)[-1] if isinstance(exc, urllib3.exceptions.NewConnectionError) else str(exc)


def _submit(args: argparse.Namespace, values: dict[str, Any]) -> None:
    import kfp_server_api
    import urllib3
    from kfp.client import Client

    if not args.host:
        raise CliError(f"--host (or ${HOST_ENV}) is required: the Kubeflow Pipelines API URL")
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "This client only works with KFP v2.0.0-beta.2 and later"
        package = _compile(Path(tmp) / "pipeline.yaml")
        try:
            client = Client(host=args.host, existing_token=args.token, namespace=args.namespace or "kubeflow")
            run = client.create_run_from_pipeline_package(
                str(package), arguments=values, run_name=args.run_name, experiment_name=args.experiment,
                namespace=args.namespace)
        except kfp_server_api.ApiException as exc:
            raise CliError(f"{args.host} refused the run: {exc.status} {exc.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError, TimeoutError) as exc:
            raise CliError(f"cannot reach Kubeflow Pipelines at {args.host}: {_unreachable_reason(exc)}") from None
    print(f"submitted run {run.run_id}: {args.host.rstrip('/')}/#/runs/details/{run.run_id}")


def _run_local(args: argparse.Namespace, values: dict[str, Any]) -> None:
    workdir = args.workdir.resolve()
    values["serve_workdir"] = str(Path(values["serve_workdir"] or workdir / "serve").resolve())
    if values["serve_config"]:
        values["serve_config"] = str(Path(values["serve_config"]).resolve())
    try:
        run = run_local(values, workdir)
    except RuntimeError as exc:
        first_line = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines()[0]  # kfp colours task names
        raise CliError(f"local run failed: {first_line} (task logs above)") from None
    print(f"\nrun outputs: {run.run_dir}")
    for task, outputs in run.outputs.items():
        for name, value in outputs.items():
            print(f"  {task}.{name}: {_describe(value)}")
    gate = (f"accuracy {run.accuracy:.4f}, min_accuracy {values['min_accuracy']:g}, "
            f"current_accuracy {values['current_accuracy']:g}")
    if run.deployed_by:
        print(f"quality gate passed ({gate}): {run.deployed_by}")
    else:
        reason = "deploy_target=none" if values["deploy_target"] == "none" else "quality gate not passed"
        print(f"not deployed: {reason} ({gate})")
    if run.deployed_by == "deploy-local":
        print(f"served answer for digit {SAMPLE_DIGIT}: {json.dumps(_ask_local(values, workdir))}")


def _describe(value: Any) -> str:
    """A path for artifacts written to disk; metadata for those that are metadata only (metrics)."""
    if isinstance(value, OutputArtifact):
        return value.uri if value.path.exists() else json.dumps(value.metadata)
    return json.dumps(value)


def _ask_local(values: dict[str, Any], workdir: Path) -> dict:
    """Send one sample digit to the TorchServe the run just started."""
    from serving.client import predict
    from serving.samples import write_samples

    from .local_serving import local_instance

    instance = local_instance(values["model_name"], values["serve_workdir"], values["serve_config"])
    image = write_samples(workdir / "samples")[SAMPLE_DIGIT]
    return predict(instance.endpoints.inference, instance.model_name, instance.keys().get("inference"),
                   image.read_bytes())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "compile":
            print(f"wrote {_compile(args.out)}")
            return 0
        values = P.validate(P.from_namespace(args))
        (_submit if args.command == "submit" else _run_local)(args, values)
    except (CliError, P.ParamError, ServerError) as exc:
        print(f"pipeline: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pipeline: interrupted", file=sys.stderr)
        return 130
    return 0
