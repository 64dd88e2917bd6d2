"""`python -m bench [run] --out bench/results [--quick]`: serving throughput and latency against the in-process ceiling and
peer servers, gallery search, batching configurations and cold start, side by side, in one run.

Writes results.md (tables, targets met or missed), results.summary.json (every figure: median, min and max
over trials) and the full record raw/results.json into --out. The full run takes about 15 minutes on 2 cores
(designed for at most 20) and should run on a quiet machine: the report records the load average before and
after. The first full run on a machine also builds the 60k Fashion-MNIST artifacts (a few minutes,
cached in --cache-dir, not part of any figure). --quick takes well under a minute and only checks
that everything runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from handler.metadata import ModelMetadata
from serving.archive import ArchiveError
from settings import DEFAULT_ARTIFACTS, cache_root
from serving.server import LocalServerError, free_ports

from . import ceiling, coldstart, env, gallery, output, report
from .client_batch import v1_bodies, v1_script
from .data import FASHION_DIR, ServingData, embed_images, gallery_vectors, serving_data
from .grpc_load import GrpcLoad, GrpcUnavailable
from .loadgen import LoadError, WrkScript, run_wrk
from .peers import PATH, PYTHON_RUNTIME, PeerConfig, PeerTree, annotate_runs, launch, wait_ready
from .procs import stop_group
from .series import sweep, warm_until_steady
from .stats import summarize
from .torchserve import TorchServeProbe, TorchServeRun, all_configurations, configurations, shipped_config

SECTIONS = ("ceiling", "rest", "batched", "grpc", "peers", "coldstart", "gallery")
DEFAULT_CACHE = cache_root() / "bench"
QUIET_LOAD = 0.3
#: Seconds per batched trial at least (--quick's 1 s can end before a request of 64 images is answered).
BATCHED_MIN_S = 3
PEER_MODULES = {"litserve": ("litserve", "fastapi", "uvicorn"), "fastapi": ("fastapi", "uvicorn"), PYTHON_RUNTIME: ()}


@dataclass
class Settings:
    quick: bool
    trials: int
    duration_s: int
    concurrencies: list[int]
    ceiling_batches: list[int]
    ceiling_layouts: list[tuple[int, int]]
    ceiling_duration_s: float
    synthetic_size: int
    gallery_queries: int
    latency_queries: int
    latency_budget_s: float
    request_images: int
    grpc_processes: int
    build_threads: int
    #: Warm every server until its throughput settles (series.warm_until_steady) before its figures.
    warm: bool
    peers: list[str]
    configs: list[str] | None = None
    sections: list[str] = field(default_factory=lambda: list(SECTIONS))
    #: Batched requests on the shipped configuration: images per KServe v1 body, and the concurrencies swept.
    batched_size: int = 64
    batched_concurrencies: list[int] = field(default_factory=lambda: [4, 8])

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        if quick:
            return cls(quick=True, trials=1, duration_s=1, concurrencies=[1, 4], ceiling_batches=[1, 8],
                       ceiling_layouts=[(2, 1)], ceiling_duration_s=0.5, synthetic_size=5_000, gallery_queries=200,
                       latency_queries=20, latency_budget_s=0.2, request_images=32, grpc_processes=1, build_threads=2,
                       warm=False, peers=["fastapi", "litserve", PYTHON_RUNTIME], batched_concurrencies=[4])
        return cls(quick=False, trials=3, duration_s=3, concurrencies=[1, 4, 16, 64], ceiling_batches=[1, 8, 32, 128],
                   ceiling_layouts=[(2, 1), (1, 2)], ceiling_duration_s=2.0, synthetic_size=1_000_000,
                   gallery_queries=1000, latency_queries=200, latency_budget_s=1.5, request_images=256,
                   grpc_processes=2, build_threads=2, warm=True, peers=["litserve", "fastapi", PYTHON_RUNTIME])


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def log_warmup(what: str, warm: dict[str, Any]) -> None:
    settled = "warm" if warm["steady"] else "not settled"
    log(f"  {what} {settled} after {warm['seconds']} s: {warm['rates']} req/s at c=16")


def run_torchserve(settings: Settings, data: ServingData, root: Path) -> tuple[list[dict], dict | None, list[float]]:
    """REST sweep per configuration; gRPC sweep and start-to-READY cycles on the shipped one.

    A configuration that fails (archive, start, load generator) is recorded with its error and the
    run goes on with the next one.
    """
    rest: list[dict] = []
    grpc_result: dict | None = None
    start_times: list[float] = []
    configs = (configurations(settings.quick) if settings.configs is None
               else [c for c in all_configurations() if c.name in settings.configs])
    for cfg in configs:
        needs_rest = "rest" in settings.sections
        if not needs_rest and not (cfg.shipped and {"batched", "grpc", "coldstart"} & set(settings.sections)):
            continue
        artifacts = data.variants.get(cfg.index) if cfg.index else data.artifacts
        if artifacts is None:
            log(f"TorchServe {cfg.name}: skipped, no {cfg.index} artifacts for {data.name}")
            continue
        log(f"TorchServe {cfg.name} ({cfg.label}): building .mar and starting")
        ts = TorchServeRun(cfg, artifacts, root)
        entry: dict[str, Any] = ts.describe()
        try:
            with ts:
                grpc_here = measure_torchserve(settings, data, ts, entry, start_times, needs_rest)
                grpc_result = grpc_here or grpc_result
        except (LocalServerError, ArchiveError, LoadError, RuntimeError, OSError) as exc:
            log(f"TorchServe {cfg.name} failed: {exc}")
            entry["error"] = str(exc)
        finally:
            shutil.rmtree(ts.workdir, ignore_errors=True)
        if needs_rest or "batched" in entry:
            rest.append(entry)
    return rest, grpc_result, start_times


def measure_torchserve(settings: Settings, data: ServingData, ts: TorchServeRun, entry: dict[str, Any],
                       start_times: list[float], needs_rest: bool) -> dict | None:
    """Everything measured on one running TorchServe; fills `entry`, returns the gRPC result if run."""
    log(f"  READY in {ts.start_to_ready_s:.2f} s")
    entry.update(start_to_ready_s=ts.start_to_ready_s, mar_mb=(ts.mar_bytes or 0) / 1e6)
    time.sleep(1.0)
    entry["memory_idle"] = ts.memory()
    script = WrkScript.create(ts.predict_path, data.images, ts.token())
    try:
        if settings.warm:
            entry["warmup"] = warm_until_steady(lambda s: run_wrk(ts.rest_base, script, 16, s)["throughput"])
            log_warmup("REST", entry["warmup"])
        if needs_rest:
            entry["runs"] = sweep(lambda c: run_wrk(ts.rest_base, script, c, settings.duration_s),
                                  settings.concurrencies, settings.trials, ts.tree, TorchServeProbe(ts.instance),
                                  label=f"REST {ts.cfg.name}", log=log)
    finally:
        script.remove()
    if ts.cfg.shipped and "batched" in settings.sections:
        entry["batched"] = run_batched(settings, data, ts)
    grpc_result = run_grpc(settings, data, ts) if ts.cfg.shipped and "grpc" in settings.sections else None
    entry["memory_loaded"] = ts.memory()
    if ts.cfg.shipped and "coldstart" in settings.sections:
        if ts.start_to_ready_s is not None:
            start_times.append(ts.start_to_ready_s)
        for _ in range(max(0, settings.trials - 1)):
            ts.stop()
            start_times.append(ts.start())
            log(f"  restart: READY in {start_times[-1]:.2f} s")
    return grpc_result


def run_batched(settings: Settings, data: ServingData, ts: TorchServeRun) -> dict:
    """wrk posting KServe v1 bodies of `batched_size` request images each (what `python -m client predict DIR`
    sends) to the shipped TorchServe: req/s and, beside it, images/s = req/s x images per request."""
    batch = settings.batched_size
    seconds = max(settings.duration_s, BATCHED_MIN_S)
    script = v1_script(ts.predict_path, v1_bodies(data.images, batch), ts.token())
    try:
        runs = sweep(lambda c: run_wrk(ts.rest_base, script, c, seconds, timeout_s=60),
                     settings.batched_concurrencies, settings.trials, ts.tree, None,
                     label=f"REST batched x{batch}", log=log)
    finally:
        script.remove()
    for run in runs:
        run["images_per_s"] = summarize(trial["throughput"] * batch for trial in run["trials"])
        log(f"  REST batched x{batch} c={run['concurrency']:<3d} {run['images_per_s']['median'] or 0:8.1f} images/s")
    return {"config": ts.cfg.name, "label": ts.cfg.label, "batch": batch, "duration_s": seconds, "runs": runs}


def run_grpc(settings: Settings, data: ServingData, ts: TorchServeRun) -> dict:
    """gRPC sweep against the running shipped TorchServe; a missing `client` package is reported, not fatal."""
    result: dict[str, Any] = {"config": ts.cfg.name, "label": ts.cfg.label, "processes": settings.grpc_processes}
    try:
        with GrpcLoad(ts.instance.endpoints.grpc_inference_port, ts.token(), ts.instance.model_name,
                      data.images, settings.grpc_processes) as load:
            if settings.warm:
                result["warmup"] = warm_until_steady(lambda s: load.run(16, s)["throughput"])
                log_warmup("gRPC", result["warmup"])
            result["runs"] = sweep(lambda c: load.run(c, settings.duration_s), settings.concurrencies,
                                   settings.trials, ts.tree, TorchServeProbe(ts.instance), label="gRPC shipped", log=log)
        result["available"] = True
    except GrpcUnavailable as exc:
        log(f"gRPC skipped: {exc}")
        result.update(available=False, reason=str(exc))
    return result


def run_peers(settings: Settings, data: ServingData, root: Path) -> list[dict]:
    """Each peer with the shipped layout and batching, swept with the same wrk load; a broken peer is recorded."""
    out = []
    shipped = shipped_config()
    for name in settings.peers:
        key = secrets.token_hex(16) if name == PYTHON_RUNTIME else None
        cfg = PeerConfig(name, shipped.workers, shipped.threads, shipped.batch_size, shipped.max_batch_delay_ms, key)
        settings_ = {k: v for k, v in asdict(cfg).items() if k != "key"}  # the key stays out of the record
        entry: dict[str, Any] = {"name": name, "label": cfg.label, **settings_}
        missing = [m for m in PEER_MODULES[name] if importlib.util.find_spec(m) is None]
        if missing:
            entry["error"] = (f"{', '.join(missing)} not installed: pip install -r requirements/bench.lock "
                              "(see its header)")
            log(f"{name} skipped: {entry['error']}")
        else:
            log(f"{name} ({cfg.label}): starting")
            measure_peer(settings, data, cfg, root / f"{name}.log", entry)
        out.append(entry)
    return out


def measure_peer(settings: Settings, data: ServingData, cfg: PeerConfig, log_file: Path, entry: dict[str, Any]) -> None:
    port = free_ports(1)[0]
    base = f"http://127.0.0.1:{port}"
    proc = launch(cfg, data.artifacts, port, log_file)
    try:
        entry["start_to_ready_s"] = wait_ready(proc, base + PATH, data.images[0], log_file,
                                               own_sockets=cfg.own_sockets, key=cfg.key)
        tree = PeerTree(proc.pid, cfg.name)
        time.sleep(1.0)
        entry["memory_idle"] = tree.memory(tree.role)
        script = WrkScript.create(PATH, data.images, cfg.key)
        try:
            if settings.warm:
                entry["warmup"] = warm_until_steady(lambda s: run_wrk(base, script, 16, s)["throughput"])
                log_warmup(cfg.name, entry["warmup"])
            entry["runs"] = sweep(lambda c: run_wrk(base, script, c, settings.duration_s), settings.concurrencies,
                                  settings.trials, tree, None, label=cfg.name, log=log)
            annotate_runs(entry["runs"], tree.windows)
        finally:
            script.remove()
        entry["memory_loaded"] = tree.memory(tree.role)
    except Exception as exc:  # one broken peer must not lose the rest of the run
        log(f"{cfg.name} failed: {exc}")
        entry["error"] = str(exc)
    finally:
        stop_group(proc)


def sample_dataset(artifacts: Path) -> str | None:
    """The dataset an artifact directory was trained on, if it holds a build."""
    try:
        return ModelMetadata.read(artifacts).dataset_name
    except (OSError, ValueError, KeyError):
        return None


def run_gallery(settings: Settings, data: ServingData) -> dict:
    queries = data.queries[:settings.gallery_queries]
    sets = []
    if data.name.startswith("fashion") and sample_dataset(DEFAULT_ARTIFACTS) == "mnist-sample":
        from training.data.sample import load_mnist_sample

        sample_queries = embed_images(DEFAULT_ARTIFACTS, load_mnist_sample().test_images[:settings.gallery_queries])
        sample = gallery_vectors(DEFAULT_ARTIFACTS)
        sets.append(gallery.GallerySet(f"mnist-sample-{len(sample) // 1000}k",
                                       f"bundled MNIST sample ({DEFAULT_ARTIFACTS}): {len(sample):,} gallery + "
                                       f"{len(sample_queries):,} held-out queries", sample, sample_queries))
    elif data.name.startswith("fashion"):
        log(f"gallery: {DEFAULT_ARTIFACTS} holds no bundled-sample build (./archive.sh makes one); no 5k row")
    sets.append(gallery.GallerySet(data.name, data.description, data.gallery, queries))
    if not data.name.startswith("fashion") and not settings.quick:
        vectors, jitter = gallery.synthetic(data.gallery, 60_000, seed=1)
        sets.append(gallery.GallerySet(
            "mnist-like-60k", f"60,000 jittered copies of the {data.name} gallery (jitter length {jitter:.3f}), "
            "re-normalised: Debian's dataset-fashion-mnist is missing, so no real 60k gallery", vectors, queries))
    vectors, jitter = gallery.synthetic(data.gallery, settings.synthetic_size)
    sets.append(gallery.GallerySet(
        f"synthetic-{settings.synthetic_size // 1000}k" if settings.synthetic_size < 1_000_000
        else f"synthetic-{settings.synthetic_size // 1_000_000}M",
        f"{settings.synthetic_size:,} jittered copies of the {data.name} gallery (jitter length {jitter:.3f} = median "
        f"nearest-neighbour distance), re-normalised; queries are real held-out embeddings", vectors, queries))
    result = gallery.run(sets, settings.trials, settings.build_threads, settings.latency_queries,
                         settings.latency_budget_s, log)
    result["sets"] = [{"name": s.name, "size": len(s.vectors), "queries": len(s.queries),
                       "description": s.description} for s in sets]
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench run", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="output directory (default bench/results)")
    p.add_argument("--quick", action="store_true", help="seconds: one configuration, few requests, small gallery")
    p.add_argument("--artifacts", type=Path, default=None,
                   help="serve these artifacts instead of the 60k Fashion-MNIST set (quick mode: default artifacts/)")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where the 60k Fashion-MNIST set is cached")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--configs", default=None, help="comma-separated TorchServe configurations (default: "
                   + ", ".join(c.name for c in configurations(quick=False)) + "; also: "
                   + ", ".join(c.name for c in all_configurations()[len(configurations(quick=False)):]) + ")")
    p.add_argument("--peers", default=None,
                   help=f"comma-separated peers (litserve,fastapi,{PYTHON_RUNTIME}: the project's python runtime; "
                        "'' for none)")
    p.add_argument("--trials", type=int, default=None, help="trials per figure (default 3; quick 1)")
    p.add_argument("--duration", type=int, default=None, help="seconds per load trial (default 3; quick 1)")
    p.add_argument("--concurrency", default=None, help="comma-separated concurrencies (default 1,4,16,64)")
    p.add_argument("--synthetic-size", type=int, default=None, help="synthetic gallery size (default 1,000,000)")
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings.for_mode(args.quick)
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections: {', '.join(sorted(unknown))}")
    settings.sections = sections
    if args.configs:
        settings.configs = args.configs.split(",")
    if args.peers is not None:
        settings.peers = [p for p in args.peers.split(",") if p]
    if args.trials:
        settings.trials = args.trials
    if args.duration:
        settings.duration_s = args.duration
    if args.concurrency:
        settings.concurrencies = [int(c) for c in args.concurrency.split(",")]
    if args.synthetic_size:
        settings.synthetic_size = args.synthetic_size
    return settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    artifacts = args.artifacts
    if artifacts is None and (settings.quick or not FASHION_DIR.is_dir()):
        artifacts = DEFAULT_ARTIFACTS
    load_start = env.load_average()
    if load_start[0] >= QUIET_LOAD and not settings.quick:
        log(f"warning: load average {load_start} >= {QUIET_LOAD}: figures will be perturbed by other work")
    started = time.time()
    results: dict[str, Any] = {
        "schema_version": 1, "mode": "quick" if settings.quick else "full",
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": env.machine(), "versions": env.versions(), "settings": asdict(settings),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        root = Path(tmp)
        log("preparing data")
        data = serving_data(artifacts, args.cache_dir, settings.quick, settings.request_images,
                            settings.gallery_queries, log)
        results["data"] = data.summary()
        if "ceiling" in settings.sections:
            log("in-process ceiling")
            results["ceiling"] = {"rows": [row for processes, threads in settings.ceiling_layouts
                                           for row in ceiling.measure(data.artifacts, data.images, processes, threads,
                                                                      settings.ceiling_batches, settings.trials,
                                                                      settings.ceiling_duration_s, log)]}
        rest, grpc_result, start_times = run_torchserve(settings, data, root)
        if rest:
            results["torchserve"] = rest
        if grpc_result:
            results["grpc"] = grpc_result
        if "peers" in settings.sections and settings.peers:
            results["peers"] = run_peers(settings, data, root)
        if "coldstart" in settings.sections:
            log("cold start")
            results["cold_start"] = coldstart.archive_times(data.artifacts, root / "archive", settings.trials, log)
            results["cold_start"]["start_to_ready_s"] = summarize(start_times)
        if "gallery" in settings.sections:
            log("gallery scaling")
            results["gallery"] = run_gallery(settings, data)
    results["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["duration_s"] = round(time.time() - started, 1)
    results["load_average"] = {"start": load_start, "end": env.load_average()}
    results["targets"] = report.targets(results)
    output.write(args.out, "results", results, report.markdown(results))
    log(f"wrote {args.out}/results.md, results.summary.json and {output.raw_path(args.out, 'results')} in "
        f"{results['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
