"""python -m pipeline compile|submit|run-local|rollback|runtime: build, submit or run the Kubeflow pipeline, serve
a recorded version again, or write the KServe serving runtime naming a digest-pinned image."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cli_common import EXIT_INTERRUPTED, EXIT_USAGE, Parser, UsageError, fail, output_dir, output_file
from owned_paths import replaceable_file, starts_with
from serving.runtimes import DEFAULT_SERVING_RUNTIME, SERVING_RUNTIMES
from serving.server import LocalServerError
from training.data.sources import parse_source

from . import images, kfp_api, kfp_backend, local_command, preflight, rollback
from . import options as O
from . import params as P

# pipeline.local_run, .pipeline and .components are imported where used: .components reads
# $PIPELINE_IMAGE when first imported, and compile/submit set it (to the chosen image) first.

HOST_ENV = "KF_PIPELINES_ENDPOINT"  # the kfp client's own variable
EXPERIMENT_ENV = "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME"  # the kfp client's own variable
RUNTIME_MANIFEST = SERVING_RUNTIMES[DEFAULT_SERVING_RUNTIME].manifest
RUNTIME_CONTAINER = "kserve-container"
#: The first line of what compile and runtime write: a file that starts with it may be written again.
COMPILE_HEADER = "# mnist-embedding pipeline package, written by python -m pipeline compile\n"
RUNTIME_HEADERS = {name: f"# {rt.manifest.name} with the serving image " for name, rt in SERVING_RUNTIMES.items()}


class CliError(Exception):
    """One-line reason the command failed."""


def _host(text: str) -> str:
    """argparse type: the KFP API URL, http(s)://HOST[:PORT][/PATH] or HOST[:PORT][/PATH] (https then)."""
    url = text if "://" in text else "https://" + text
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL with a host")
    return text


def _backend_version(text: str) -> kfp_backend.Version:
    """argparse type: a KFP backend version, X.Y.Z."""
    version = kfp_backend.parse_version(text)
    if version is None or kfp_backend.version_text(version) != text.removeprefix("v"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a version X.Y.Z")
    return version


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m pipeline", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="write the pipeline package (YAML)")
    c.add_argument("--out", type=Path, default=Path("pipeline.yaml"), help="the package to write")
    _add_image_arguments(c)
    O.add_arguments(c)
    s = sub.add_parser("submit", help="compile and start a run on a Kubeflow Pipelines cluster")
    _add_image_arguments(s)
    s.add_argument("--host", type=_host, default=os.environ.get(HOST_ENV), help=f"KFP API URL (default: ${HOST_ENV})")
    s.add_argument("--experiment", default=None, help=f"experiment name (default: ${EXPERIMENT_ENV}, else 'Default')")
    s.add_argument("--namespace", default=None, help="user namespace on multi-user clusters")
    s.add_argument("--token", default=os.environ.get(kfp_api.TOKEN_ENV),
                   help=f"bearer token (default: ${kfp_api.TOKEN_ENV})")
    s.add_argument("--run-name", default=None, help="name of the run (default: the pipeline's name and the time)")
    s.add_argument("--backend-version", type=_backend_version, default=None, metavar="X.Y.Z",
                   help="the KFP backend's version, for a backend whose healthz does not say it (the images of "
                        f"{kfp_api.unnamed_text()} answer 'unknown'): submit refuses a backend it cannot verify")
    O.add_arguments(s)
    P.add_arguments(s)
    r = sub.add_parser("run-local", help="run every task here with kfp.local (subprocesses of this Python)")
    r.add_argument("--workdir", type=Path, default=Path("local_outputs"), help="pipeline root for the outputs")
    P.add_arguments(r, deploy_target="local")
    b = sub.add_parser("rollback", help="serve a version the deploy record lists again")
    rollback.add_arguments(b)
    t = sub.add_parser("runtime", help="write deploy/kserve/servingruntime[-python].yaml with the serving image "
                                       "pinned by digest")
    t.add_argument("--runtime", choices=tuple(SERVING_RUNTIMES), default=DEFAULT_SERVING_RUNTIME,
                   help="which ClusterServingRuntime: torchserve (servingruntime.yaml, image mnist-embedding-serving) "
                        "or python (servingruntime-python.yaml, image mnist-embedding-serving-python)")
    t.add_argument("--image", required=True, metavar="REF",
                   help="the pushed serving image of --runtime, REPOSITORY[:TAG]@sha256:DIGEST")
    t.add_argument("--allow-tag", action="store_true", help="accept REPOSITORY:TAG without a digest (the "
                   "cluster then pulls whatever the tag names when a pod starts)")
    t.add_argument("--out", type=Path, default=None, help="write here instead of standard output")
    return p


def _add_image_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", default=None, metavar="REF",
                   help=f"image every task runs in (default: ${images.IMAGE_ENV}; required); pinned by digest "
                        "when the images JSON records a pushed digest for it")
    p.add_argument("--images-json", type=Path, default=None, metavar="PATH",
                   help=f"what scripts/build-images.sh built (default: ${images.IMAGES_JSON_ENV}, else "
                        "build/images.json)")


def _image(args: argparse.Namespace) -> str:
    """The image reference the compiled pipeline names; $PIPELINE_IMAGE is set to it before
    `pipeline.components` (which reads it at import) is imported here."""
    given = args.image or os.environ.get(images.IMAGE_ENV)
    images_json = args.images_json or Path(os.environ.get(images.IMAGES_JSON_ENV) or images.DEFAULT_IMAGES_JSON)
    try:
        resolved = images.resolve(given, images_json)
        os.environ[images.IMAGE_ENV] = resolved.ref
        from .components import DEFAULT_PIPELINE_IMAGE

        images.refuse_placeholder(resolved.ref, DEFAULT_PIPELINE_IMAGE)
    except images.ImageError as exc:
        raise UsageError(str(exc)) from None
    print(f"image: {resolved.ref} ({resolved.how})")
    return resolved.ref


def _compile(out: Path, image: str, options: O.CompileOptions) -> tuple[Path, kfp_backend.Version, str]:
    """Compile into `out` for the oldest backend that can read it (pipeline.kfp_backend.for_oldest); every
    executor must name `image` (a package that does not is not written). Returns the package, the backend
    version it needs and why."""
    import yaml
    from kfp import compiler

    from .components import DEFAULT_PIPELINE_IMAGE
    from .pipeline import build

    try:
        pipeline = build(options)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror}") from None
    if out.is_dir():
        raise CliError(f"cannot write {out}: it is a directory")
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp.yaml")  # the compiler wants a .yaml name
    try:
        compiler.Compiler().compile(pipeline, str(tmp))
        spec, platform = _documents(tmp)
        kfp_backend.for_oldest(spec, platform)
        _set_executor_images(spec, image, DEFAULT_PIPELINE_IMAGE)
        tmp.write_text(COMPILE_HEADER + yaml.safe_dump_all([spec, platform] if platform else [spec], sort_keys=False))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return (out, *kfp_backend.required(spec, platform))


def _documents(package: Path) -> tuple[dict, dict]:
    """The pipeline spec and the platform spec ({} when the package has none) of a compiled package."""
    import yaml

    docs = list(yaml.safe_load_all(package.read_text()))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def _set_executor_images(spec: dict, image: str, placeholder: str) -> None:
    """Name `image` in every executor. The components take it from $PIPELINE_IMAGE at import, so this
    changes something only when they were imported earlier in this process with another value."""
    import yaml

    containers = [e["container"] for e in spec["deploymentSpec"]["executors"].values()]
    if not containers:
        raise CliError(f"the compiled package names no image, not {image}")
    for container in containers:
        container["image"] = image
    if placeholder in yaml.safe_dump(spec):
        raise CliError(f"the compiled package still names the placeholder image {placeholder}")


def _runtime(image: str, allow_tag: bool, out: Path | None, runtime: str = DEFAULT_SERVING_RUNTIME) -> None:
    """The ClusterServingRuntime manifest of `runtime` with `image` in its serving container, validated like every
    manifest the project applies (pipeline.manifests)."""
    import yaml

    from .manifests import ManifestError, validate

    try:
        ref = images.parse_ref(image)
    except images.ImageError as exc:
        raise UsageError(str(exc)) from None
    if not ref.digest and not (allow_tag and ref.tag):
        raise UsageError(f"image {image} is not pinned by digest (REPOSITORY[:TAG]@sha256:...): the cluster would "
                         "pull whatever the tag names when a pod starts; "
                         + ("name a tag or a digest" if allow_tag else "pass --allow-tag to accept that"))
    source = SERVING_RUNTIMES[runtime].manifest
    manifest = yaml.safe_load(source.read_text())
    containers = [c for c in manifest["spec"]["containers"] if c.get("name") == RUNTIME_CONTAINER]
    if len(containers) != 1:
        raise CliError(f"{source} has no single container named {RUNTIME_CONTAINER}")
    containers[0]["image"] = str(ref)
    try:
        validate(manifest)
    except ManifestError as exc:
        raise CliError(f"the runtime manifest with {ref} is not valid: {exc}") from None
    text = (f"{RUNTIME_HEADERS[runtime]}{'pinned by digest' if ref.digest else 'by tag'}, "
            f"written by python -m pipeline runtime\n" + yaml.safe_dump(manifest, sort_keys=False))
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror}") from None
    print(f"wrote {out} (image {ref})", file=sys.stderr)


def _check_data_claim(source: str, mounted: str) -> None:
    """A pvc:// data source is read from the claim the load-data task mounts (--data-pvc-claim): the same one."""
    claim = parse_source(source).claim
    if claim is not None and claim != mounted:
        raise UsageError(f"data_source {source} reads the claim {claim!r}, but the load-data task mounts "
                         + (f"{mounted!r}" if mounted else "none") + f": compile with --data-pvc-claim {claim}")


def _submit(args: argparse.Namespace, values: dict[str, Any], image: str, options: O.CompileOptions) -> None:
    import kfp_server_api
    import urllib3
    from kfp.client import Client

    if not args.host:
        raise CliError(f"--host (or ${HOST_ENV}) is required: the Kubeflow Pipelines API URL")
    host = args.host.rstrip("/") if args.host.startswith("http") else "https://" + args.host.rstrip("/")

    class _Client(Client):
        """The kfp client, answering its own healthz question from the check already made."""

        def get_kfp_healthz(self, sleep_duration: int = 5) -> Any:
            return kfp_server_api.V2beta1GetHealthzResponse(multi_user=health.get("multi_user"))

    step = f"check the backend (GET {kfp_api.HEALTHZ_PATH})"
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "This client only works with KFP v2.0.0-beta.2 and later"
        try:
            health = kfp_api.backend_health(host, args.token)
            package, needed, why = _compile(Path(tmp) / "pipeline.yaml", image, options)
            kfp_api.check_version(host, health, needed, why, args.backend_version)
            if health.get("multi_user") and not args.namespace and not os.path.exists(Client._NAMESPACE_PATH):
                raise CliError(f"{host} is a multi-user Kubeflow Pipelines: pass --namespace (your profile namespace)")
            client = _Client(host=host, existing_token=args.token, namespace=args.namespace or "kubeflow")
            experiment_name = args.experiment or os.environ.get(EXPERIMENT_ENV) or "Default"
            step = f"find or create the experiment {experiment_name!r}"
            try:
                experiment = client.create_experiment(name=experiment_name, namespace=args.namespace)
            except ValueError as exc:  # e.g. "Multiple experiments is found with name ..."
                raise CliError(f"{host}: {exc}") from None
            step = "create the run"
            from .pipeline import PIPELINE_NAME

            run_name = args.run_name or f"{PIPELINE_NAME} {datetime.datetime.now():%Y-%m-%d %H-%M-%S}"
            run = client.run_pipeline(experiment_id=experiment.experiment_id, job_name=run_name,
                                      pipeline_package_path=str(package), params=options.run_values(values))
        except kfp_server_api.ApiException as exc:
            raise kfp_api.api_error(host, step, exc) from None
        except (urllib3.exceptions.HTTPError, OSError, TimeoutError) as exc:
            raise CliError(f"cannot reach Kubeflow Pipelines at {host}: {kfp_api.unreachable_reason(exc)}") \
                from None
    print(f"submitted run {run.run_id}: {host}/#/runs/details/{run.run_id}")


def _check_paths(args: argparse.Namespace) -> None:
    """The files and folders the command writes, before anything slow starts (UsageError otherwise): each may
    replace only what the same command wrote before (owned_paths)."""
    if args.command == "compile":
        output_file(args.out, "--out")
        images_json = args.images_json or os.environ.get(images.IMAGES_JSON_ENV) or images.DEFAULT_IMAGES_JSON
        replaceable_file(args.out, "--out", ours=starts_with(COMPILE_HEADER.encode()), reads=[images_json])
    if args.command == "runtime" and args.out is not None:
        output_file(args.out, "--out")
        headers = [starts_with(header.encode()) for header in RUNTIME_HEADERS.values()]
        replaceable_file(args.out, "--out", ours=lambda path: any(ours(path) for ours in headers),
                         reads=[rt.manifest for rt in SERVING_RUNTIMES.values()])
    if args.command == "run-local":
        output_dir(args.workdir, "--workdir")
        preflight.check_outputs(args.workdir, args.serve_workdir, args.data_source)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _check_paths(args)
    except UsageError as exc:
        return fail("pipeline", exc, EXIT_USAGE)
    if args.command == "rollback":
        return rollback.run(args)
    try:
        if args.command == "runtime":
            _runtime(args.image, args.allow_tag, args.out, args.runtime)
            return 0
        if args.command == "compile":
            options = O.from_namespace(args)
            out, needed, why = _compile(args.out, _image(args), options)
            print(f"wrote {out} (needs KFP backend {kfp_backend.version_text(needed)} or later: {why})")
            return 0
        values = P.validate(P.from_namespace(args))
        if args.command == "submit":
            if values["deploy_target"] == "local":
                raise UsageError("deploy_target=local starts TorchServe inside a task's pod, which ends with the "
                                 "task: use it with run-local; on a cluster use --deploy-target kserve")
            options = O.from_namespace(args)
            _check_data_claim(values["data_source"], options.data_pvc_claim)
            _submit(args, values, _image(args), options)
        else:
            local_command.run(args.workdir, args.serve_workdir, values)
    except UsageError as exc:
        return fail("pipeline", exc, EXIT_USAGE)
    except (CliError, kfp_api.ApiError, P.ParamError, LocalServerError, local_command.RunLocalError) as exc:
        return fail("pipeline", exc)
    except KeyboardInterrupt:
        return fail("pipeline", "interrupted", EXIT_INTERRUPTED)
    return 0
