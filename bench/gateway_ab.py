"""`python -m bench gateway-ab`: the serving image and TorchServe alone up at once, short trials interleaved.

`python -m bench container` measures each server in its own stretch of minutes, so a drift in the machine's speed
between two stretches lands on one server (TorchServe alone moved 30% between two rounds on the project machine).
Here three servers run side by side on the same staged /mnt/models directory:

- ``image``: the image as the ServingRuntime runs it (:func:`bench.container.start_container`: nginx front, key);
- ``in-image``: TorchServe alone in the same image, no front and no key (:func:`start_container_torchserve`);
- ``alone``: TorchServe alone on the host (same config.properties, no front, no key).

Each round runs every (body, concurrency) once on each server, back to back, in an order that changes from round to
round (over 6 rounds every order of the three sides once), and
the ratios are taken within the round: image / alone (the target), image / in-image (what the front costs) and
in-image / alone (what the container costs). The report gives the medians of those paired ratios, their spread,
and the servers' CPU per request split by process (nginx, TorchServe's Java frontend, its Python workers).
The idle servers cost next to nothing while one is loaded (their workers wait on a socket).

Usage: ``[--gallery 5k,60k] [--concurrency 16,64] [--rounds 6] [--duration 5] [--out bench/results]``; build options
as for `bench container` (--build-args or $BUILD_IMAGES_ARGS). Writes gateway-ab.md and gateway-ab.summary.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from settings import read_properties, write_properties

from . import output
from .container import (BODIES, TARGET_CONCURRENCY, TARGET_P99_RATIO, TARGET_RPS_RATIO, Server, add_image_args,
                        build_image, check_answer, gallery_artifacts, load, log, no_engine, record_header,
                        listen_everywhere, request_bodies, scripts_for, stage, start_container,
                        start_container_torchserve, start_host, warm_up)
from .loadgen import LoadError, WrkScript, run_wrk
from .procs import serving_role

NAME = "gateway-ab"
SIDES = ("image", "in-image", "alone")
#: Paired ratios reported per cell: name -> (numerator side, denominator side). rps_ratio is the target's.
RATIOS = {"rps_ratio": ("image", "alone"), "front_ratio": ("image", "in-image"),
          "container_ratio": ("in-image", "alone")}
#: Processes whose CPU per request the report shows, per side.
ROLES = {"image": ("nginx", "frontend", "workers", "gateway"), "in-image": ("frontend", "workers"),
         "alone": ("frontend", "workers")}


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (0-100) of `values`; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def trial(server: Server, script: WrkScript, concurrency: int, duration_s: int) -> dict[str, Any]:
    """One wrk run with the server's CPU over its window (100% = one core), and its CPU µs per answered request
    by process role (bench.procs.serving_role)."""
    before = server.tree.cpu_snapshot()
    run = run_wrk(server.base, script, concurrency, duration_s)
    used = server.tree.cpu_by_role_since(before, serving_role)
    run["server_cpu_pct"] = 100.0 * sum(used.values()) / run["seconds"] if run["seconds"] > 0 else None
    answered = run["throughput"] * run["seconds"]
    run["cpu_us_by_role"] = {role: seconds / answered * 1e6 for role, seconds in used.items()} if answered else {}
    return run


def paired_rounds(servers: dict[str, Server], scripts: dict[str, dict[str, WrkScript]], concurrencies: list[int],
                  rounds: int, duration_s: int, seed: int = 0) -> list[dict[str, Any]]:
    """`rounds` rounds; in each, every (body, c) in shuffled order, every side back to back. Each cell steps through
    every order of the sides from round to round (starting at a different one for neighbouring cells), so that over
    a multiple of len(servers)! rounds (2 sides: 2, 3 sides: 6) each side goes first equally often and follows each
    other side equally often in every cell: a later trial may run on a machine an earlier one has warmed or left
    busy."""
    rng = random.Random(seed)
    cells = [(kind, c) for kind in BODIES for c in concurrencies]
    out = []
    for number in range(1, rounds + 1):
        order = cells[:]
        rng.shuffle(order)
        done: dict[str, Any] = {"round": number, "load_start": load(), "cells": []}
        for kind, c in order:
            orders = list(itertools.permutations(servers))
            sides = list(orders[(number + cells.index((kind, c))) % len(orders)])
            cell: dict[str, Any] = {"kind": kind, "concurrency": c, "first": sides[0], "order": sides}
            for side in sides:
                cell[side] = trial(servers[side], scripts[side][kind], c, duration_s)
            done["cells"].append(cell)
            rates = " / ".join(f"{side} {cell[side]['throughput']:.0f}" for side in servers)
            image, alone = cell["image"]["throughput"], cell["alone"]["throughput"]
            log(f"  round {number} {kind} c={c} ({sides[0]} first): {rates} req/s; image / alone"
                f" = {fmt(image / alone if alone else None, 2)}")
        done["load_end"] = load()
        out.append(done)
    return out


def _cpu_us(run: dict[str, Any]) -> float | None:
    cpu, rps = run.get("server_cpu_pct"), run.get("throughput")
    return cpu / 100 / rps * 1e6 if cpu and rps else None


def summarize_cells(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (body, c): the paired ratios of every round (req/s and p99, image / alone) and their medians."""
    by_cell: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rounds:
        for cell in r["cells"]:
            by_cell.setdefault((cell["kind"], cell["concurrency"]), []).append(cell)
    rows = []
    for (kind, c), cells in sorted(by_cell.items(), key=lambda kv: (list(BODIES).index(kv[0][0]), kv[0][1])):
        p99 = [x["image"]["p99_ms"] / x["alone"]["p99_ms"] for x in cells if x["alone"]["p99_ms"]]
        ratios = {}
        for name, (top, bottom) in RATIOS.items():
            if all(top in x and bottom in x for x in cells):
                values = [x[top]["throughput"] / x[bottom]["throughput"] for x in cells if x[bottom]["throughput"]]
                ratios[name] = {"median": median(values), "p25": percentile(values, 25),
                                "p75": percentile(values, 75), "values": values}
        rps = ratios["rps_ratio"]["values"]
        sides = [side for side in SIDES if all(side in x for x in cells)]
        cpu_us = {side: {role: median([x[side].get("cpu_us_by_role", {}).get(role, 0.0) for x in cells])
                         for role in ROLES[side]} for side in sides}
        cpu = [a / b for x in cells if (a := _cpu_us(x["image"])) and (b := _cpu_us(x["alone"]))]
        row = {"kind": kind, "concurrency": c, "rounds": len(cells),
               **ratios,
               "p99_ratio": {"median": median(p99), "values": p99},
               "cpu_ratio": {"median": median(cpu), "values": cpu},
               "cpu_us": cpu_us,
               "rounds_at_target": sum(v >= TARGET_RPS_RATIO for v in rps),
               **{f"{side.replace('-', '_')}_rps": median([x[side]["throughput"] for x in cells]) for side in sides},
               "errors": sum(x[s]["errors"] for x in cells for s in sides)}
        if c in TARGET_CONCURRENCY:  # wrk counts error answers as requests: a fast failing side is not a pass
            row["target_met"] = bool(rps and p99 and row["errors"] == 0
                                     and row["rps_ratio"]["median"] >= TARGET_RPS_RATIO
                                     and row["p99_ratio"]["median"] <= TARGET_P99_RATIO)
        rows.append(row)
    return rows


def set_batch_delay(mnt: Path, delay_ms: int) -> None:
    """Every model version's maxBatchDelay in the staged config.properties' model_snapshot (what TorchServe loads
    the .mar with on all three sides), to try another batch delay without rebuilding the archive."""
    config = mnt / "config" / "config.properties"
    props = read_properties(config)
    if "model_snapshot" not in props:
        raise RuntimeError(f"{config}: no model_snapshot line")
    snapshot = json.loads(props["model_snapshot"])
    for versions in snapshot["models"].values():
        for settings in versions.values():
            settings["maxBatchDelay"] = delay_ms
    props["model_snapshot"] = json.dumps(snapshot, separators=(",", ":"))
    write_properties(props, config)


def run_gallery(name: str, images: dict, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The three servers up on one staged directory, checked, warmed, then the paired rounds."""
    artifacts = gallery_artifacts(name)
    mnt = stage(artifacts, root / name)
    if args.max_batch_delay is not None:
        set_batch_delay(mnt, args.max_batch_delay)
    bodies = request_bodies(artifacts)
    servers: dict[str, Server] = {}
    scripts: dict[str, dict[str, WrkScript]] = {}
    result: dict[str, Any] = {"artifacts": str(artifacts)}
    try:
        tag = secrets.token_hex(3)
        servers["image"] = start_container(images, mnt, f"bench-gateway-ab-{name}-{tag}")
        servers["in-image"] = start_container_torchserve(images, listen_everywhere(mnt, root / name / "mnt-open"),
                                                         f"bench-gateway-ab-{name}-{tag}-torchserve")
        servers["alone"] = start_host(mnt, root / name / "torchserve", front=None)
        result["warmup_rps"] = {}
        for side, server in servers.items():
            scripts[side] = scripts_for(server, bodies)
            for kind, script in scripts[side].items():
                check_answer(server, kind, bodies[kind][0])
                result["warmup_rps"][f"{side} {kind}"] = warm_up(server, script)
        log(f"{name}: all servers up and warm, load {load()}")
        result["rounds"] = paired_rounds(servers, scripts, args.concurrency, args.rounds, args.duration)
        result["cells"] = summarize_cells(result["rounds"])
    except (LoadError, RuntimeError, OSError) as exc:
        log(f"{name}: failed: {exc}")
        result["error"] = str(exc)
    finally:
        for side_scripts in scripts.values():
            for script in side_scripts.values():
                script.remove()
        for server in servers.values():
            server.stop()
    return result


def _ratio(row: dict[str, Any], name: str) -> str:
    r = row.get(name)
    return "n/a" if not r else f"{fmt(r['median'], 2)} ({fmt(r['p25'], 2)}-{fmt(r['p75'], 2)})"


def markdown(results: dict[str, Any]) -> str:
    s = results["settings"]
    lines = [
        "# The serving image against TorchServe alone, paired rounds", "",
        f"Started {results['started']}, took {results['duration_s']:.0f} s. Command: `{results['command']}`", "",
        f"- Machine: {results['machine']['cpu_model']}, {results['machine']['logical_cores']} logical cores; load "
        f"average (1/5/15 min) {results['load_start']} at the start, {results['load_end']} at the end.",
        f"- Image `{results['image']['ref']}`. Sides, all up for the whole run on the same staged model: "
        "**image** = the image as the ServingRuntime runs it (nginx front, bearer key); **in-image** = TorchServe "
        "alone in the same image (no front, no key; a copy of /mnt/models whose config.properties binds the "
        "container's addresses, so that a published port reaches it); **alone** = TorchServe alone on the host "
        "(same config.properties, no front, no key). "
        f"{s['rounds']} rounds; in each, every body and concurrency once per side, back to back, {s['duration_s']} s "
        "of wrk -t1 each, in an order that changes from round to round (every order of the sides once in 6 rounds). "
        "Ratios are taken within the round; median and interquartile range over the rounds.",
        *([f"- Every side served with maxBatchDelay {s['max_batch_delay_ms']} ms instead of the archive's."]
          if s.get("max_batch_delay_ms") else []),
        f"- Target: the image >= {TARGET_RPS_RATIO:g}x the req/s of TorchServe alone at "
        f"c={' and c='.join(map(str, TARGET_CONCURRENCY))}, p99 <= {TARGET_P99_RATIO:g}x (medians of the paired "
        "ratios image / alone). image / in-image is what the front costs; in-image / alone what the container "
        "costs.", "",
        "| gallery | body | c | image / in-image / alone req/s | image / alone, median (IQR) | rounds >= "
        f"{TARGET_RPS_RATIO:g} | p99 ratio | CPU per request ratio | errors | target | image / in-image (front) | "
        "in-image / alone (container) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cpu_lines = ["", "CPU µs per answered request by process, medians over the rounds (frontend = TorchServe's "
                 "Java process, workers = its two Python model workers, gateway = the image's Python process):", "",
                 "| gallery | body | c | image: nginx / frontend / workers / gateway | in-image: frontend / workers | "
                 "alone: frontend / workers |", "|---|---|---|---|---|---|"]
    for name, g in results["galleries"].items():
        if "error" in g:
            lines.append(f"| {name} | error: {g['error'][:200]} | | | | | | | | | | |")
            continue
        for row in g["cells"]:
            target = "" if "target_met" not in row else ("met" if row["target_met"] else "**missed**")
            rates = " / ".join(fmt(row.get(f"{side.replace('-', '_')}_rps"), 0) for side in SIDES)
            lines.append(f"| {name} | {row['kind']} | {row['concurrency']} | {rates} | {_ratio(row, 'rps_ratio')} "
                         f"| {row['rounds_at_target']}/{row['rounds']} | {fmt(row['p99_ratio']['median'], 2)} | "
                         f"{fmt(row['cpu_ratio']['median'], 2)} | {row['errors']} | {target} | "
                         f"{_ratio(row, 'front_ratio')} | {_ratio(row, 'container_ratio')} |")
            cpu = row.get("cpu_us", {})
            cells = [" / ".join(fmt(cpu[side].get(role), 0) for role in ROLES[side]) if side in cpu else "n/a"
                     for side in SIDES]
            cpu_lines.append(f"| {name} | {row['kind']} | {row['concurrency']} | {' | '.join(cells)} |")
    return "\n".join(lines + cpu_lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench gateway-ab", description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="16,64", help="comma-separated concurrencies (default 16,64)")
    p.add_argument("--rounds", type=int, default=6,
                   help="rounds (default 6: every order of the three sides once per cell)")
    p.add_argument("--duration", type=int, default=5, help="seconds per trial (default 5)")
    p.add_argument("--max-batch-delay", type=int, default=None, metavar="MS",
                   help="serve every side with this maxBatchDelay instead of the archive's (model-config.yaml)")
    add_image_args(p)
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.rounds < 1 or args.duration < 1:
        p.error("--rounds and --duration must be at least 1")
    if args.max_batch_delay is not None and args.max_batch_delay < 1:
        p.error("--max-batch-delay must be at least 1 (TorchServe takes 0 as unset)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if no_engine("bench.gateway_ab"):
        return 2
    started = time.time()
    results = record_header(argv, NAME, {"rounds": args.rounds, "duration_s": args.duration,
                                         "concurrency": args.concurrency, "build_args": args.build_args,
                                         "max_batch_delay_ms": args.max_batch_delay})
    log("building/checking the serving image")
    images = build_image(shlex.split(args.build_args))
    results["image"] = {k: images["serving"][k] for k in ("ref", "id", "size_bytes")}
    results["galleries"] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-ab-") as tmp:
        os.chmod(tmp, 0o755)  # the image's uid reads the staged directory through the bind mount
        for name in args.gallery.split(","):
            log(f"gallery {name}")
            results["galleries"][name] = run_gallery(name, images, args, Path(tmp))
            results["load_end"] = load()
            results["duration_s"] = round(time.time() - started, 1)
            output.write(args.out, NAME, results, markdown(results))
    log(f"wrote {args.out}/{NAME}.md in {results['duration_s']:.0f} s")
    return 0 if all("error" not in g for g in results["galleries"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
