"""The same embedding.mar without Java: the handler core in one worker process per core, behind the KServe gateway.

``python -m serving.python_runtime --mar model_store/embedding.mar --ts-config config.properties`` serves one or
more archives (each ``--mar`` a version, the first the default); without ``--mar`` it reads the KServe storage
layout as the TorchServe runtime does (``--model-store``, and ``--ts-config``'s model_snapshot). It serves what the
TorchServe path serves, with the same answers: ``/predictions/<m>[/<v>]``, ``/ping``, KServe v1, Open Inference v2
REST (binary tensors included) and gRPC, health, readiness and metadata (:mod:`serving.gateway.app`), the same
bearer key (``INFERENCE_API_KEY``), request-size limit (config.properties max_request_size) and pixel limit (the
archive's handler.max_image_pixels), TorchServe's metric names on config.properties' ``gateway_metrics_address``
(else its ``metrics_address`` with metrics_mode=prometheus), and the graceful drain on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from serving.gateway.options import add_serving_arguments, api_key, grpc_port, shutdown_times
from serving.ports import port_taken
from serving.python_runtime.archive import Archive, ArchiveError, open_archive
from serving.python_runtime.metrics_page import MetricsPage
from serving.python_runtime.plan import Plan, VersionPlan
from serving.python_runtime.supervisor import Supervisor, supervise
from serving.ts_config import RuntimeConfigError, default_version, request_limits, served_model, snapshot_models
from settings import CONFIG_FILE, GATEWAY_METRICS_KEY, SettingsError, read_properties

PROG = "python -m serving.python_runtime"
logger = logging.getLogger("python_runtime")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--mar", type=Path, action="append", default=[],
                        help="a model archive to serve (repeat for more versions; the first is the default)")
    parser.add_argument("--model-store", type=Path, default=Path("/mnt/models/model-store"),
                        help="without --mar: the archives model_snapshot names (default %(default)s)")
    parser.add_argument("--ts-config", type=Path, default=None,
                        help="config.properties (default: /mnt/models/config/config.properties, with --mar the "
                             "project's config.properties)")
    parser.add_argument("--model-name", default=None, help="default: the archive's (or model_snapshot's) one model")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default: the archive's minWorkers, else one per core)")
    add_serving_arguments(parser)
    return parser.parse_args(argv)


def metrics_address(props: dict[str, str]) -> tuple[str, int] | None:
    """Where the metrics page listens: gateway_metrics_address, else metrics_address with metrics_mode=prometheus."""
    address = props.get(GATEWAY_METRICS_KEY, "").strip()
    if not address and props.get("metrics_mode", "").strip().lower() == "prometheus":
        address = props.get("metrics_address", "").strip()
    parts = urlsplit(address)
    return (parts.hostname or "0.0.0.0", parts.port) if address and parts.port else None


def archives(args: argparse.Namespace, props: dict[str, str], config: Path, runtime: Path
             ) -> tuple[str, dict[str, Archive], str]:
    """(model name, {served version: unpacked archive}, default version), from --mar or the model snapshot."""
    if args.mar:
        opened = [open_archive(mar, runtime / f"v{i}") for i, mar in enumerate(args.mar)]
        names = {archive.name for archive in opened}
        if args.model_name is None and len(names) > 1:
            raise RuntimeConfigError(f"the archives name different models ({', '.join(sorted(names))}): "
                                     "pass --model-name")
        versions = {archive.version: archive for archive in opened}
        if len(versions) < len(opened):
            raise RuntimeConfigError("two archives carry the same modelVersion")
        return args.model_name or opened[0].name, versions, opened[0].version
    model, entries = served_model(snapshot_models(props, config), config, args.model_name)
    versions = {}
    for i, (version, entry) in enumerate(entries.items()):
        archive = open_archive(args.model_store / str((entry or {}).get("marName", f"{model}.mar")),
                               runtime / f"v{i}")
        if archive.version != version:
            raise RuntimeConfigError(f"{config}: model_snapshot serves {archive.path.name} as version {version}, "
                                     f"but the archive is version {archive.version}")
        versions[version] = archive
    return model, versions, default_version(entries)


def build_plan(args: argparse.Namespace, props: dict[str, str], config: Path, runtime: Path
               ) -> tuple[Plan, Archive]:
    """The workers' plan, and the default version's archive."""
    model, opened, default = archives(args, props, config, runtime)
    codes = {archive.code_digest() for archive in opened.values()}
    if len(codes) > 1:
        raise RuntimeConfigError("the archives pack different handler code: serve each version from its own runtime")
    size, timeout = request_limits(props)
    port, required = grpc_port(args)
    times = shutdown_times(args)
    versions = tuple(VersionPlan(v, str(a.model_dir), a.version, a.handler_settings) for v, a in opened.items())
    plan = Plan(model, versions, default, str(opened[default].model_dir), size, timeout, opened[default].batch_size,
                args.http_host, args.http_port, port, required, times.delay, times.grace)
    return plan, opened[default]


def worker_count(args: argparse.Namespace, archive: Archive) -> int:
    """--workers, else the archive's minWorkers (one per core of the machine it was configured for), else the
    cores this process may run on."""
    if args.workers is not None:
        return max(args.workers, 1)
    return archive.workers or len(os.sched_getaffinity(0))


def prepare(args: argparse.Namespace, runtime: Path) -> tuple[Plan, int, tuple[str, int] | None]:
    """(plan, workers, metrics address), or RuntimeConfigError / ArchiveError / ValueError (one line)."""
    config = args.ts_config or (CONFIG_FILE if args.mar else Path("/mnt/models/config/config.properties"))
    try:
        props = read_properties(config)
    except OSError as exc:
        raise RuntimeConfigError(f"{config}: {exc.strerror or exc}") from None
    plan, default = build_plan(args, props, config, runtime)
    if port_taken(plan.http_host, plan.http_port):
        raise RuntimeConfigError(f"port {plan.http_port} is already in use: stop the other server or pick --http-port")
    return plan, worker_count(args, default), metrics_address(props)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    key, refusal = api_key(args, "python_runtime")
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    runtime = Path(tempfile.mkdtemp(prefix="python-runtime-"))
    try:
        try:
            plan, workers, metrics_at = prepare(args, runtime)
        except (RuntimeConfigError, ArchiveError, SettingsError, ValueError) as exc:
            print(f"python_runtime: {exc}", file=sys.stderr)
            return 2
        plan_file = runtime / "plan.json"
        plan.write(plan_file)
        metrics_dir = runtime / "metrics"
        metrics_dir.mkdir()
        page = MetricsPage(metrics_dir, *metrics_at) if metrics_at else None
        return asyncio.run(supervise(Supervisor(plan, plan_file, workers, metrics_dir), page))
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
