"""Soak test: open-loop requests at a fixed rate, latency and errors per window, RSS of every TorchServe process.

    python -m bench soak --duration-s 600 --rate 20 --url http://127.0.0.1:8080 --key-file key_file.json
    python -m bench soak --duration-s 600 --rate 20 --model-store model_store   # starts its own TorchServe

Requests are sent on a fixed schedule (request i at start + i/rate) by a thread pool, whatever the answers'
latency, and latency is measured from the scheduled time, so a stalled server shows up as latency instead of
as a lower request rate. RSS of the frontend (the java process) and of each worker (its children) is sampled
every --rss-interval-s. Writes soak.md, soak.summary.json and raw/soak.json to --out; exits 0 when errors == 0
and the RSS growth after warm-up is under --max-rss-growth-pct, 1 when a target is missed, 2 when the run could not start.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import psutil

from bench import output
from bench.procs import ProcessTree
from bench.stats import percentiles_ms
from bench.torchserve import worker_role

from client import BadImageError, ClientError, EmbeddingClient, ServerError
from client.tokens import from_key_file
from serving.samples import held_out_digits, user_digit_png
from settings import MODEL_NAME

@dataclass(frozen=True)
class Sample:
    """One request: when it was due (s since start), latency from that moment, status or error."""

    due: float
    latency_s: float
    status: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(frozen=True)
class RssSample:
    t: float
    frontend_mb: float
    workers_mb: dict[int, float]


def frontend_pid(url: str) -> int:
    """Pid of the TorchServe frontend serving the URL: the process listening on its port, or, when that is the
    front `serving start` puts before TorchServe, the TorchServe a project command recorded on that port."""
    from torchserve_api import instances

    port = urlsplit(url).port
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            if "serving.front" not in psutil.Process(conn.pid).cmdline():
                return conn.pid
            recorded = instances.on_ports({port})
            if recorded:
                return recorded[0].pid
    raise SystemExit(f"soak: no TorchServe found on port {port}; pass --pid")


def sample_rss(tree: ProcessTree, t: float) -> RssSample:
    """RSS of the frontend and of its model workers (not of the short-lived system-metrics collector it spawns)."""
    rows = tree.memory(worker_role)
    frontend = [r["rss_mb"] for r in rows if r["role"] == "frontend (java)"]
    if not frontend:
        raise psutil.NoSuchProcess(tree.root_pid)
    return RssSample(t, frontend[0], {r["pid"]: r["rss_mb"] for r in rows if r["role"].startswith("worker")})


def run_load(client: EmbeddingClient, images: list[bytes], duration_s: float, rate: float, concurrency: int,
             pid: int, rss_interval_s: float) -> tuple[list[Sample], list[RssSample]]:
    """Send round(duration * rate) requests on schedule while a thread samples RSS."""
    total = int(round(duration_s * rate))
    start = time.monotonic()
    rss: list[RssSample] = []
    done = threading.Event()
    tree = ProcessTree(pid)

    def sampler() -> None:
        while True:
            try:
                rss.append(sample_rss(tree, time.monotonic() - start))
            except psutil.Error:
                pass
            if done.wait(rss_interval_s):
                return

    def request(i: int, due: float) -> Sample:
        try:
            client.predict(images[i % len(images)])
            return Sample(due - start, time.monotonic() - due, 200)
        except ClientError as exc:
            status = exc.status if isinstance(exc, (BadImageError, ServerError)) else None
            return Sample(due - start, time.monotonic() - due, status, f"{type(exc).__name__}: {exc}"[:200])

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    futures: list[Future[Sample]] = []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for i in range(total):
            due = start + i / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            futures.append(pool.submit(request, i, due))
    samples = [f.result() for f in futures]
    done.set()
    watcher.join()
    return samples, rss


def percentile_ms(latencies: list[float], q: float) -> float | None:
    value = percentiles_ms(latencies, (q,))[f"p{int(q)}"]
    return None if value is None else round(value, 2)


def windows(samples: list[Sample], rss: list[RssSample], duration_s: float, window_s: float) -> list[dict]:
    out = []
    for index in range(math.ceil(duration_s / window_s - 1e-9)):
        lo, hi = index * window_s, (index + 1) * window_s
        in_window = [s for s in samples if lo <= s.due < hi]
        latencies = [s.latency_s for s in in_window if s.ok]
        memory = [r for r in rss if lo <= r.t < hi]
        out.append({
            "index": index, "start_s": lo, "requests": len(in_window),
            "errors": sum(not s.ok for s in in_window),
            "p50_ms": percentile_ms(latencies, 50), "p99_ms": percentile_ms(latencies, 99),
            "frontend_mb": _median([r.frontend_mb for r in memory]),
            "workers_mb": _median([sum(r.workers_mb.values()) for r in memory]),
        })
    return out


def _median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 1) if values else None


def rss_growth(rows: list[dict], warmup_windows: int) -> dict[str, float | None]:
    """Percent change of median RSS from the first window after warm-up to the last window."""
    measured = [w for w in rows[warmup_windows:] if w["frontend_mb"] is not None]
    growth: dict[str, float | None] = {"frontend": None, "workers": None, "total": None}
    if len(measured) < 2:
        return growth
    first, last = measured[0], measured[-1]
    for key, a, b in (("frontend", first["frontend_mb"], last["frontend_mb"]),
                      ("workers", first["workers_mb"], last["workers_mb"]),
                      ("total", first["frontend_mb"] + first["workers_mb"], last["frontend_mb"] + last["workers_mb"])):
        growth[key] = round(100.0 * (b - a) / a, 2) if a else None
    return growth


def markdown(report: dict) -> str:
    cfg, totals, growth = report["config"], report["totals"], report["rss"]["growth_pct"]

    def fmt(value: float | None, unit: str = "") -> str:
        return "n/a" if value is None else f"{value}{unit}"

    lines = [
        f"# Soak: {cfg['duration_s']:g} s at {cfg['rate']:g} req/s",
        "",
        f"Target {cfg['url']} ({report['started']}), frontend pid {report['frontend_pid']}, "
        f"{cfg['concurrency']} client threads, {cfg['window_s']:g} s windows, first {cfg['warmup_windows']} "
        "excluded from the RSS growth.",
        "",
        "| requests | errors | achieved req/s | p50 ms | p99 ms | RSS growth (frontend / workers / total) | verdict |",
        "|---:|---:|---:|---:|---:|---|---|",
        f"| {totals['requests']} | {totals['errors']} | {totals['achieved_rate']} | {fmt(totals['p50_ms'])} | "
        f"{fmt(totals['p99_ms'])} | {fmt(growth['frontend'], '%')} / {fmt(growth['workers'], '%')} / "
        f"{fmt(growth['total'], '%')} | {'PASS' if report['passed'] else 'FAIL'} |",
        "",
        "| window | start s | requests | errors | p50 ms | p99 ms | frontend RSS MB | workers RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {w['index']} | {w['start_s']:g} | {w['requests']} | {w['errors']} | {fmt(w['p50_ms'])} | "
              f"{fmt(w['p99_ms'])} | {fmt(w['frontend_mb'])} | {fmt(w['workers_mb'])} |" for w in report["windows"]]
    if report["errors_sample"]:
        lines += ["", "Errors (first 10): " + "; ".join(report["errors_sample"])]
    if report["rss"]["worker_pids_changed"]:
        lines += ["", "Worker pids changed during the run (a worker restarted)."]
    return "\n".join(lines) + "\n"


def build_report(args: argparse.Namespace, url: str, pid: int, started: str, samples: list[Sample],
                 rss: list[RssSample], elapsed: float) -> dict:
    rows = windows(samples, rss, args.duration_s, args.window_s)
    growth = rss_growth(rows, args.warmup_windows)
    ok_latencies = [s.latency_s for s in samples if s.ok]
    errors = [s for s in samples if not s.ok]
    pid_sets = {tuple(sorted(r.workers_mb)) for r in rss}
    total_growth = growth["total"]
    passed = not errors and total_growth is not None and total_growth < args.max_rss_growth_pct
    return {
        "started": started,
        "config": {"url": url, "duration_s": args.duration_s, "rate": args.rate, "concurrency": args.concurrency,
                   "window_s": args.window_s, "warmup_windows": args.warmup_windows,
                   "rss_interval_s": args.rss_interval_s, "max_rss_growth_pct": args.max_rss_growth_pct},
        "frontend_pid": pid,
        "totals": {"requests": len(samples), "errors": len(errors), "elapsed_s": round(elapsed, 2),
                   "achieved_rate": round(len(samples) / elapsed, 2) if elapsed else None,
                   "p50_ms": percentile_ms(ok_latencies, 50), "p99_ms": percentile_ms(ok_latencies, 99)},
        "windows": rows,
        "rss": {"samples": [{"t": round(r.t, 2), "frontend_mb": round(r.frontend_mb, 1),
                             "workers_mb": {str(k): round(v, 1) for k, v in r.workers_mb.items()}} for r in rss],
                "growth_pct": growth, "worker_pids_changed": len(pid_sets) > 1},
        "errors_sample": [f"{s.due:.2f}s: {s.error or s.status}" for s in errors[:10]],
        "passed": passed,
        "samples": [asdict(s) for s in samples] if args.keep_samples else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, required=True)
    p.add_argument("--rate", type=float, required=True, help="requests per second (open loop)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="inference address of a running TorchServe, e.g. http://127.0.0.1:8080")
    target.add_argument("--model-store", type=Path, help="start a TorchServe of our own from this model store")
    p.add_argument("--key-file", type=Path, help="key_file.json of the running TorchServe (token authorization)")
    p.add_argument("--model-name", default=MODEL_NAME, help="model name (default: %(default)s)")
    p.add_argument("--pid", type=int, help="frontend pid (default: the process listening on the URL's port)")
    p.add_argument("--concurrency", type=int, default=16, help="client threads")
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--warmup-windows", type=int, default=1, help="windows excluded from the RSS growth")
    p.add_argument("--rss-interval-s", type=float, default=1.0)
    p.add_argument("--max-rss-growth-pct", type=float, default=5.0)
    p.add_argument("--timeout-s", type=float, default=30.0, help="per request")
    p.add_argument("--keep-samples", action="store_true", help="store every request in raw/soak.json")
    p.add_argument("--out", type=Path, default=Path("logs/soak"),
                   help="directory for soak.md, soak.summary.json, raw/soak.json and (with --model-store) the server's logs")
    args = p.parse_args(argv)
    if args.duration_s <= 0 or args.rate <= 0 or args.window_s <= 0 or args.concurrency < 1:
        p.error("--duration-s, --rate, --window-s and --concurrency must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from dataclasses import replace

    from serving.server import LocalServerError as TorchServeError, private_instance, start, stop

    instance = None
    try:
        if args.model_store:
            workdir = args.out.resolve() / "torchserve"  # its logs stay beside the results
            instance = replace(private_instance(workdir), model_name=args.model_name)
            seconds = start(instance, args.model_store.resolve())
            print(f"soak: TorchServe READY in {seconds:.1f}s ({workdir})", flush=True)
            url, token = instance.endpoints.inference, instance.keys().get("inference")
        else:
            url = args.url
            token = from_key_file(args.key_file, "inference").value if args.key_file else None
        pid = args.pid or (instance.pid() if instance is not None else None) or frontend_pid(url)
        client = EmbeddingClient(url, model=args.model_name, token=token, timeout=args.timeout_s, retries=0)
        images = [user_digit_png(canvas) for canvas in held_out_digits()]
        started = datetime.now(UTC).isoformat(timespec="seconds")
        began = time.monotonic()
        samples, rss = run_load(client, images, args.duration_s, args.rate, args.concurrency, pid,
                                args.rss_interval_s)
        report = build_report(args, url, pid, started, samples, rss, time.monotonic() - began)
    except (TorchServeError, ClientError, OSError, KeyError, ValueError, psutil.Error) as exc:
        print(f"soak: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if instance is not None:
            stop(instance)
    args.out.mkdir(parents=True, exist_ok=True)
    output.write(args.out, "soak", report, markdown(report))
    totals, growth = report["totals"], report["rss"]["growth_pct"]
    print(f"soak: {totals['requests']} requests, {totals['errors']} errors, p50 {totals['p50_ms']} ms, "
          f"p99 {totals['p99_ms']} ms, RSS growth after warm-up {growth['total']}% "
          f"-> {'PASS' if report['passed'] else 'FAIL'} ({args.out / 'soak.md'})")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
