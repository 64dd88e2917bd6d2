"""`python -m bench.limits`: the serving image under the CPU and memory limits a cluster would set.

For each gallery and each (cpu, memory) limit pair, the serving image runs as the ServingRuntime describes
it (bench.container.start_container) with the limits enforced as the kubelet does (a CFS quota, a memory
cgroup limit without swap), then: start to ready, a warm-up at c=16, one wrk trial per concurrency with
KServe v1 JSON bodies (the cluster path) and raw PNGs. Memory is the container's memory cgroup: its peak
(`memory.max_usage_in_bytes`, page cache included, as the kubelet's OOM decisions see it) and the RSS of
its processes after the load; an OOM kill or a failed start is recorded as the figure for that pair.
Writes bench/results/limits.md and limits.summary.json (the full record to raw/, not committed).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from settings import REPO

from . import env, output
from .container import (BODIES, Server, build_image, check_answer, command_line, gallery_artifacts, log,
                        request_bodies, scripts_for, stage, start_container, warm_up)
from .loadgen import LoadError, run_wrk
from .series import sweep
from .stats import fmt

CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")


def cgroup_memory(images: dict, name: str) -> dict[str, float | None]:
    """Peak and current memory (MB) of the container's memory cgroup (cgroup v1 or v2), None where unreadable."""
    cli_env = {**os.environ, "CONTAINERS_CONF": images.get("containers_conf") or ""}
    path = subprocess.run([images["engine"], "inspect", "-f", "{{.State.CgroupPath}}", name], capture_output=True,
                          text=True, env=cli_env).stdout.strip().lstrip("/")
    candidates = {"peak": ["memory.max_usage_in_bytes", "memory.peak"], "current": ["memory.usage_in_bytes",
                                                                                  "memory.current"]}
    out: dict[str, float | None] = {}
    for key, files in candidates.items():
        out[f"{key}_mb"] = None
        for root in (CGROUP_MEMORY, Path("/sys/fs/cgroup")):
            for file in files:
                target = root / path / file
                if path and target.is_file():
                    out[f"{key}_mb"] = round(int(target.read_text()) / 2**20, 1)
                    break
            if out[f"{key}_mb"] is not None:
                break
    return out


def container_state(images: dict, name: str) -> dict[str, Any]:
    cli_env = {**os.environ, "CONTAINERS_CONF": images.get("containers_conf") or ""}
    out = subprocess.run([images["engine"], "inspect", "-f", "{{.State.Status}} {{.State.OOMKilled}} "
                          "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}", name], capture_output=True, text=True,
                         env=cli_env).stdout.split()
    if len(out) != 4:
        return {"status": "gone"}
    return {"status": out[0], "oom_killed": out[1] == "true", "applied_cpus": int(out[2]) / 1e9,
            "applied_memory_mb": round(int(out[3]) / 2**20)}


def measure_pair(images: dict, mnt: Path, bodies: dict[str, list[bytes]], limits: dict[str, str],
                 args: argparse.Namespace) -> dict[str, Any]:
    name = f"bench-limits-{secrets.token_hex(3)}"
    entry: dict[str, Any] = {"limits": limits, "load_start": env.load_average(), "runs": {}}
    server: Server | None = None
    try:
        server = start_container(images, mnt, name, limits)
        entry["start_to_ready_s"] = round(server.start_to_ready_s, 2)
        entry["idle_memory"] = cgroup_memory(images, name)
        scripts = scripts_for(server, bodies)
        try:
            for kind, script in scripts.items():
                check_answer(server, kind, bodies[kind][0])
                warm_up(server, script)
                entry["runs"][kind] = sweep(lambda c: run_wrk(server.base, script, c, args.duration),
                                            args.concurrency, 1, server.tree, None,
                                            label=f"{limits} {kind}", log=log)
        finally:
            for script in scripts.values():
                script.remove()
        entry["rss_mb"] = round(sum(row["rss_mb"] for row in server.tree.memory()), 1)
    except (LoadError, RuntimeError, OSError) as exc:
        entry["error"] = str(exc)[:300]
        log(f"  {limits}: {entry['error']}")
    finally:
        entry["memory"] = cgroup_memory(images, name)
        entry["state"] = container_state(images, name)
        if server is not None:
            server.stop()
        else:
            cli_env = {**os.environ, "CONTAINERS_CONF": images.get("containers_conf") or ""}
            subprocess.run([images["engine"], "rm", "-f", name], capture_output=True, env=cli_env)
    entry["load_end"] = env.load_average()
    return entry


def markdown(results: dict) -> str:
    lines = [
        "# The serving image under CPU and memory limits", "",
        f"Started {results['started']}, took {results['duration_s']:.0f} s. Command: `{results['command']}`", "",
        f"- Machine: {results['machine']['cpu_model']}, {results['machine']['logical_cores']} logical cores, "
        f"{results['machine']['memory_gib']} GiB; load average (1/5/15 min) start {results['load_start']}, "
        f"end {results['load_end']} (per pair below). The load generator (wrk -t1) runs outside the limits, on "
        "the same cores.",
        f"- Image `{results['image']['ref']}`; limits enforced by {results['image']['engine']} as the kubelet does "
        "(`--cpus` = CFS quota, `--memory` = memory cgroup limit, swap off).",
        f"- One {results['settings']['duration_s']} s trial per concurrency after a c=16 warm-up; "
        "v1 = KServe v1 JSON to the gateway, png = raw PNG to `/predictions/<m>`. Peak = the memory cgroup's "
        "high-water mark over the whole run (start included, page cache included); RSS = the processes after "
        "the load.", "",
        "| gallery | cpu | memory | ready s | body | c | req/s | p50 ms | p99 ms | errors | server CPU % | "
        "peak MB | RSS MB | OOM killed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for gallery, pairs in results["galleries"].items():
        for e in pairs:
            lim = e["limits"]
            head = f"| {gallery} | {lim.get('cpu')} | {lim.get('memory')} | {e.get('start_to_ready_s', 'n/a')}"
            tail = f"{e['memory'].get('peak_mb')} | {e.get('rss_mb', 'n/a')} | {e['state'].get('oom_killed')} |"
            if e.get("error") and not e["runs"]:
                lines.append(f"{head} | | | error: {e['error'][:120]} | | | | | | {tail}")
                continue
            for kind in BODIES:
                for r in e["runs"].get(kind, []):
                    lines.append(f"{head} | {kind} | {r['concurrency']} | {fmt(r['throughput'], 0)} | "
                                 f"{fmt(r['p50_ms'], 1)} | {fmt(r['p99_ms'], 1)} | {r['errors']} | "
                                 f"{fmt(r['server_cpu_pct'], 0)} | {tail}")
    lines += ["", "Load average (1/5/15 min) per pair: " + "; ".join(
        f"{g} {e['limits']}: {e['load_start']} -> {e['load_end']}" for g, pairs in results["galleries"].items()
        for e in pairs)]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__.splitlines()[0])
    p.add_argument("--gallery", default="5k,60k", help="comma-separated: 5k (artifacts/), 60k (Fashion-MNIST); "
                   "default 5k,60k")
    p.add_argument("--cpus", default="1,2", help="comma-separated CPU limits, Kubernetes quantities (default 1,2)")
    p.add_argument("--memory", default="1Gi,2Gi", help="comma-separated memory limits (default 1Gi,2Gi)")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated concurrencies (default 1,16,64)")
    p.add_argument("--duration", type=int, default=8, help="seconds per load trial (default 8)")
    p.add_argument("--build-args", default=os.environ.get("BUILD_IMAGES_ARGS", ""),
                   help="extra scripts/build-images.sh options (default $BUILD_IMAGES_ARGS)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    args = p.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency: not a list of integers: {args.concurrency!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    argv = argv if argv is not None else sys.argv[1:]
    started = time.time()
    results: dict[str, Any] = {
        "schema_version": 1, "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command_line(argv).replace(" container", " limits", 1),
        "machine": env.machine(), "versions": env.versions(), "load_start": env.load_average(),
        "settings": {"duration_s": args.duration, "concurrency": args.concurrency}, "galleries": {},
    }
    images = build_image(shlex.split(args.build_args))
    results["image"] = {"engine": images["engine"], "ref": images["serving"]["ref"]}
    pairs = [{"cpu": c, "memory": m} for c in args.cpus.split(",") for m in args.memory.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        os.chmod(tmp, 0o755)  # the image's uid 10001 reads the staged directory through the bind mount
        for gallery in args.gallery.split(","):
            artifacts = gallery_artifacts(gallery)
            mnt = stage(artifacts, Path(tmp) / gallery)
            bodies = request_bodies(artifacts)
            results["galleries"][gallery] = []
            for limits in pairs:
                log(f"{gallery}: limits {limits}, load {env.load_average()}")
                results["galleries"][gallery].append(measure_pair(images, mnt, bodies, limits, args))
                write(results, args.out, started)
    log(f"wrote {args.out}/limits.md and limits.summary.json (full record in raw/)")
    return 0


def write(results: dict, out: Path, started: float) -> None:
    results["load_end"] = env.load_average()
    results["duration_s"] = round(time.time() - started, 1)
    output.write(out, "limits", results, markdown(results))


if __name__ == "__main__":
    sys.exit(main())
