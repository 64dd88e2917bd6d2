"""`python -m bench latency`: batch delay / size and worker count against the low-load target, interleaved.

The target: c=1 p50 <= 1.3x the no-batching p50 and c=16 throughput >= the shipped
configuration's, with one shipped configuration. On a shared 2-core machine absolute figures drift
from minute to minute, so this study does not measure one configuration after another:

- every configuration gets its own .mar and TorchServe (as in `python -m bench run`), all started at once
  and left idle while another one is measured;
- each server is warmed at c=16 in windows of `--warmup-window` s until two consecutive windows agree
  within `--steady` (relative throughput) and at least `--warmup-min` s have passed, at most
  `--warmup-max` s (bench.series.warm_until_steady, as every benchmark warms); every window is recorded;
- then `--trials` rounds: in each round, for each concurrency, every configuration runs once in a
  shuffled order (seeded), so each trial of a candidate sits next to a trial of the shipped and the
  no-batching configuration in time. Ratios are taken per round (paired) and their median reported;
- `shipped-copy` (the shipped settings in a second server) is an A/A control: its per-round c=16
  throughput ratio to `shipped` is the run's noise band. A candidate "keeps" c=16 throughput when its
  median paired ratio to shipped is >= 1 - that band.

Server CPU is split per role (the Java frontend vs the Python workers) from psutil over each trial.
Writes latency.md and latency.summary.json into --out (raw/latency.json: the full record).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from settings import DEFAULT_ARTIFACTS, cache_root

from . import env, output
from .data import serving_data
from .loadgen import WrkScript, run_wrk
from .series import WARMUP_MAX_S, WARMUP_MIN_S, WARMUP_STEADY, WARMUP_WINDOW_S, warm_until_steady
from .stats import summarize
from .torchserve import TorchServeProbe, TorchServeRun, all_configurations, worker_role

DEFAULT_CONFIGS = ("shipped", "shipped-copy", "no-batching", "2x1-b8-0ms", "2x1-b8-1ms", "2x1-b8-2ms", "2x1-b4-1ms",
                   "2x1-b4-2ms", "3x1-no-batching", "3x1-b8-1ms", "3x1-b8-2ms", "shipped-netty1")
TARGET_P50_RATIO = 1.3
LOW_C, HIGH_C = 1, 16
GIB = 2**30
RATIO_KEYS = ("p50_ms", "p99_ms", "mean_ms", "throughput")


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def uptime() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return " ".join(map(str, env.load_average()))


def cpu_by_pid(run: TorchServeRun) -> dict[int, tuple[str, float]]:
    out = {}
    for proc in run.tree.processes():
        try:
            times = proc.cpu_times()
            out[proc.pid] = (worker_role(proc), times.user + times.system)
        except psutil.Error:
            pass
    return out


def cpu_roles(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
              seconds: float) -> dict[str, float]:
    """Percent of one core per role over the window (frontend (java), worker, ...), plus the total."""
    roles: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        used = cpu - before.get(pid, (role, 0.0))[1]
        roles[role] = roles.get(role, 0.0) + 100.0 * used / seconds
    roles["total"] = sum(roles.values())
    return roles


class Server:
    """One running configuration: its TorchServe, wrk script and probe."""

    def __init__(self, run: TorchServeRun, images: list[bytes]) -> None:
        self.run = run
        self.cfg = run.cfg
        self.script = WrkScript.create(run.predict_path, images, run.token())
        self.probe = TorchServeProbe(run.instance)

    def trial(self, concurrency: int, duration_s: int) -> dict[str, Any]:
        before = cpu_by_pid(self.run)
        state = self.probe.begin()
        result = run_wrk(self.run.rest_base, self.script, concurrency, duration_s)
        result["cpu"] = cpu_roles(before, cpu_by_pid(self.run), result["seconds"])
        result["server_cpu_pct"] = result["cpu"]["total"]
        result["split"] = self.probe.end(state, result)
        return result

    def warm(self, window_s: int, min_s: float, max_s: float, steady: float) -> dict[str, Any]:
        """c=16 windows until the throughput settles (series.warm_until_steady), each window recorded with its CPU."""
        windows: list[dict[str, Any]] = []

        def window(seconds: int) -> float:
            t = self.trial(HIGH_C, seconds)
            windows.append({k: t[k] for k in ("throughput", "p50_ms", "p99_ms", "errors")} | {"cpu": t["cpu"]})
            return t["throughput"]

        warm = warm_until_steady(window, window_s, min_s, max_s, steady)
        return {"windows": windows, "seconds": warm["seconds"], "steady": warm["steady"]}


def paired(trials: dict[str, dict[int, list[dict]]], name: str, base: str, c: int, key: str) -> dict:
    """Per-round ratio name/base of `key` at concurrency c (round r of one against round r of the other)."""
    a, b = trials.get(name, {}).get(c, []), trials.get(base, {}).get(c, [])
    return summarize(x[key] / y[key] if x.get(key) and y.get(key) else None for x, y in zip(a, b))


def analyse(trials: dict[str, dict[int, list[dict]]], concurrencies: list[int]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for name, by_c in trials.items():
        row: dict[str, Any] = {}
        for c, ts in by_c.items():
            roles = sorted({r for t in ts for r in t["cpu"]})
            row[str(c)] = {
                **{k: summarize(t[k] for t in ts) for k in ("throughput", "p50_ms", "p99_ms", "mean_ms")},
                "errors": sum(t["errors"] for t in ts),
                "cpu": {r: summarize(t["cpu"].get(r, 0.0) for t in ts) for r in roles},
                "mean_batch": summarize((t.get("split") or {}).get("mean_batch") for t in ts),
                "queue_ms": summarize((t.get("split") or {}).get("queue") for t in ts),
                "vs_no_batching": {k: paired(trials, name, "no-batching", c, k) for k in RATIO_KEYS},
                "vs_shipped": {k: paired(trials, name, "shipped", c, k) for k in RATIO_KEYS},
            }
        rows[name] = row
    return rows


def noise_band(rows: dict[str, Any]) -> dict[str, float] | None:
    """How far the A/A control's per-round c=16 throughput ratio to shipped strays from 1: median and largest."""
    control = ((rows.get("shipped-copy") or {}).get(str(HIGH_C)) or {}).get("vs_shipped", {}).get("throughput")
    if not control or not control["values"]:
        return None
    dev = sorted(abs(v - 1) for v in control["values"])
    return {"median": float(statistics.median(dev)), "max": dev[-1]}


def verdicts(rows: dict[str, Any], noise: dict[str, float] | None) -> dict[str, dict[str, Any]]:
    """Meets = c=1 p50 within 1.3x no-batching and c=16 req/s >= shipped less the typical A/A deviation."""
    band = noise["median"] if noise else 0.0
    out = {}
    for name, row in rows.items():
        low, high = row.get(str(LOW_C)), row.get(str(HIGH_C))
        if not low or not high:
            continue
        p50_ratio = low["vs_no_batching"]["p50_ms"]["median"]
        thr_ratio = high["vs_shipped"]["throughput"]["median"]
        floor = 1 - band
        low_ok = p50_ratio is not None and p50_ratio <= TARGET_P50_RATIO
        high_ok = thr_ratio is not None and thr_ratio >= floor
        out[name] = {"c1_p50_over_no_batching": p50_ratio, "c16_throughput_over_shipped": thr_ratio,
                     "throughput_floor": floor, "low_load_ok": low_ok, "throughput_ok": high_ok,
                     "meets": low_ok and high_ok and (low["errors"] + high["errors"]) == 0}
    return out


def verdict_text(result: dict[str, Any]) -> list[str]:
    """Which configurations meet the target; if none, the closest one; notes the data make necessary."""
    ver, rows, labels = result["verdicts"], result["rows"], result["labels"]
    candidates = {n: v for n, v in ver.items() if n not in ("shipped", "shipped-copy", "no-batching")}
    met = [n for n, v in candidates.items() if v["meets"]]
    out = []
    if met:
        out.append("Meet the target: " + ", ".join(f"`{n}` ({labels[n]}): c=1 p50 {ver[n]['c1_p50_over_no_batching']:.2f}x "
                                                    f"no-batching, c=16 {ver[n]['c16_throughput_over_shipped']:.3f}x shipped"
                                                    for n in met) + ".")
    else:
        keep = [n for n, v in candidates.items() if v["throughput_ok"] and v["c1_p50_over_no_batching"] is not None]
        best = min(keep, key=lambda n: candidates[n]["c1_p50_over_no_batching"]) if keep else None
        out.append("No configuration meets the target (c=1 p50 <= "
                   f"{TARGET_P50_RATIO}x no-batching with c=16 throughput kept)."
                   + (f" Closest among those keeping c=16 throughput: `{best}` ({labels[best]}), c=1 p50 "
                      f"{ver[best]['c1_p50_over_no_batching']:.2f}x no-batching (shipped: "
                      f"{ver['shipped']['c1_p50_over_no_batching']:.2f}x), c=16 "
                      f"{ver[best]['c16_throughput_over_shipped']:.3f}x shipped." if best and "shipped" in ver else ""))
    zero = [n for n in rows if result["configs"][n]["max_batch_delay_ms"] == 0 and result["configs"][n]["batch_size"] > 1]
    if zero:
        out.append("maxBatchDelay 0 with batchSize > 1 (" + ", ".join(f"`{n}`" for n in zero) + "): TorchServe 0.12's "
                   "ModelManager takes a model-config.yaml maxBatchDelay <= 0 as unset and falls back to config.properties' "
                   "`models` JSON, which also ignores values <= 0, then to its 100 ms default: a lone request waits "
                   "100 ms (see the queue column). 1 ms is the smallest delay TorchServe honours, and a lone request "
                   "always waits it (Model.pollBatch polls the queue for the remaining delay before sending).")
    return out


def _f(summary: dict | None, digits: int = 1, spread: bool = False) -> str:
    if not summary or summary.get("median") is None:
        return "n/a"
    text = f"{summary['median']:.{digits}f}"
    if spread and summary["n"] > 1:
        text += f" ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"
    return text


def markdown(result: dict[str, Any]) -> str:
    rows, labels, ver = result["rows"], result["labels"], result["verdicts"]
    noise = result["noise_band"]
    band = noise["median"] if noise else 0.0
    cs = result["settings"]["concurrencies"]
    lines = [
        "# Low-load latency: batch delay / size and worker count", "",
        f"Command: `{result['command']}`"
        + (f" (niceness {result['launch']['nice']}, OMP_NUM_THREADS={result['launch']['OMP_NUM_THREADS']})"
           if result.get("launch") else ""), "",
        f"Started {result['started']}, finished {result['finished']} ({result['duration_s']:.0f} s). "
        f"Machine: {result['machine']['cpu_model']}, {result['machine']['logical_cores']} cores, "
        f"{result['machine']['memory_gib']} GiB; shared with other work. Data: {result['data']['description']}.", "",
        f"Load (`/proc/loadavg`) at start: `{result['load']['start']}`; after warm-up: "
        f"`{result['load']['after_warmup']}`; end: `{result['load']['end']}`. Per round: "
        + "; ".join(f"`{r['loadavg']}`" for r in result["rounds"]) + ".", "",
        "Method: all configurations run at once, each its own .mar and TorchServe (repo config.properties on free "
        "ports; token auth and Prometheus metrics on), idle while another is measured. Warm-up: each server at "
        f"c=16 in {result['settings']['warmup_window_s']} s windows until two consecutive windows agree within "
        f"{result['settings']['steady'] * 100:.0f}% and at least {result['settings']['warmup_min_s']} s have passed "
        f"(at most {result['settings']['warmup_max_s']} s). Then {result['settings']['trials']} rounds; in each "
        f"round, per concurrency, every configuration runs one `wrk -t1 -c<c> -d{result['settings']['duration_s']}s` "
        "trial in a shuffled order. Figures: median over rounds (min-max); ratios are per round (paired: same round, "
        "same concurrency) and their median is shown.", "",
        (f"Noise: the A/A control `shipped-copy` (same settings, second server) differs from `shipped` at c=16 by "
         f"{noise['median'] * 100:.1f}% per round (median; at most {noise['max'] * 100:.1f}%)" if noise
         else "Noise: no A/A control in this run")
        + f"; a candidate keeps c=16 throughput when its median paired ratio to shipped is >= {1 - band:.3f}. "
        f"Low-load target: c=1 p50 / no-batching p50 <= {TARGET_P50_RATIO}.", "",
        f"## c={LOW_C} and c={HIGH_C}", "",
        "| configuration | c=1 p50 ms | c=1 p99 ms | c=1 p50 / no-batching | c=1 p50 / shipped | c=1 mean / "
        "no-batching | c=16 req/s | c=16 p99 ms | c=16 req/s / shipped | c=16 req/s / no-batching | c=16 p99 / shipped "
        "| c=16 mean batch | c=16 frontend / workers CPU % | meets target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        lo, hi = row.get(str(LOW_C), {}), row.get(str(HIGH_C), {})
        v = ver.get(name, {})
        meets = "n/a" if not v else ("**yes**" if v["meets"] else "no (" + ", ".join(
            w for w, ok in (("c=1 p50", v["low_load_ok"]), ("c=16 req/s", v["throughput_ok"])) if not ok) + ")")
        lines.append(
            f"| `{name}` ({labels[name]}) | {_f(lo.get('p50_ms'), 2, True)} | {_f(lo.get('p99_ms'), 2)} | "
            f"{_f(lo.get('vs_no_batching', {}).get('p50_ms'), 2, True)} | "
            f"{_f(lo.get('vs_shipped', {}).get('p50_ms'), 2)} | {_f(lo.get('vs_no_batching', {}).get('mean_ms'), 2)} | "
            f"{_f(hi.get('throughput'), 0, True)} | "
            f"{_f(hi.get('p99_ms'), 1)} | {_f(hi.get('vs_shipped', {}).get('throughput'), 3, True)} | "
            f"{_f(hi.get('vs_no_batching', {}).get('throughput'), 3)} | "
            f"{_f(hi.get('vs_shipped', {}).get('p99_ms'), 2)} | {_f(hi.get('mean_batch'), 1)} | "
            f"{_f(hi.get('cpu', {}).get('frontend (java)'), 0)} / {_f(hi.get('cpu', {}).get('worker'), 0)} | {meets} |")
    lines += ["", "## Verdict", "", "\n\n".join(verdict_text(result)), "", "## Every concurrency", "",
              "| configuration | c | req/s | p50 ms | p99 ms | req/s / shipped | p50 / no-batching | p99 / shipped | "
              "queue ms | mean batch | frontend CPU % | workers CPU % | errors |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cs:
        for name, row in rows.items():
            r = row.get(str(c))
            if not r:
                continue
            lines.append(
                f"| `{name}` | {c} | {_f(r['throughput'], 0)} | {_f(r['p50_ms'], 2)} | {_f(r['p99_ms'], 1)} | "
                f"{_f(r['vs_shipped']['throughput'], 3)} | {_f(r['vs_no_batching']['p50_ms'], 2)} | "
                f"{_f(r['vs_shipped']['p99_ms'], 2)} | {_f(r['queue_ms'], 2)} | {_f(r['mean_batch'], 1)} | "
                f"{_f(r['cpu'].get('frontend (java)'), 0)} | {_f(r['cpu'].get('worker'), 0)} | {r['errors']} |")
    lines += ["", "## Warm-up (c=16 windows per server: req/s, frontend CPU %)", "",
              "| configuration | seconds | steady | windows: req/s (frontend CPU %) |", "|---|---|---|---|"]
    for name, w in result["warmup"].items():
        lines.append(f"| `{name}` | {w['seconds']} | {w['steady']} | " + ", ".join(
            f"{x['throughput']:.0f} ({x['cpu'].get('frontend (java)', 0):.0f}%)" for x in w["windows"]) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench latency", description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS, help="artifacts to serve (read only)")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="comma-separated names (see python -m bench run --help); shipped and no-batching are the bases")
    p.add_argument("--concurrency", default="1,16", help="comma-separated concurrencies (default 1,16)")
    p.add_argument("--trials", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--duration", type=int, default=4, help="seconds per trial (default 4)")
    p.add_argument("--warmup-window", type=int, default=WARMUP_WINDOW_S)
    p.add_argument("--warmup-min", type=float, default=WARMUP_MIN_S)
    p.add_argument("--warmup-max", type=float, default=WARMUP_MAX_S)
    p.add_argument("--steady", type=float, default=WARMUP_STEADY, help="relative throughput change counted as steady")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-images", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--name", default="latency", help="output file stem (default latency)")
    p.add_argument("--render", type=Path, default=None, help="only re-analyse this full record (OUT/raw/NAME.json): rewrite OUT/NAME.md and .summary.json")
    return p.parse_args(argv)


def finish(result: dict[str, Any], out: Path, name: str) -> None:
    trials = {n: {int(c): ts for c, ts in by_c.items()} for n, by_c in result["trials"].items()}
    result["rows"] = analyse(trials, result["settings"]["concurrencies"])
    result["noise_band"] = noise_band(result["rows"])
    result["verdicts"] = verdicts(result["rows"], result["noise_band"])
    output.write(out, name, result, markdown(result))


def render(raw: Path) -> int:
    """Re-analyse a full record (OUT/raw/NAME.json) and rewrite OUT/NAME.md and NAME.summary.json."""
    out = raw.parent.parent if raw.parent.name == output.RAW_DIR else raw.parent
    finish(json.loads(raw.read_text()), out, raw.stem)
    log(f"rewrote {out / raw.stem}.md and {output.summary_path(out, raw.stem)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(args.render)
    names = [n for n in args.configs.split(",") if n]
    known = {c.name: c for c in all_configurations()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown configurations: {', '.join(unknown)}")
    configs = [known[n] for n in names]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    need = sum(0.45 + 0.3 * c.workers for c in configs) * GIB
    if psutil.virtual_memory().available < need + 2 * GIB:
        raise SystemExit(f"{len(configs)} servers need about {need / GIB:.1f} GiB; not enough memory available")
    command = "python -m bench latency " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    result: dict[str, Any] = {
        "schema_version": 1, "command": command,
        "launch": {"nice": os.nice(0), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}, "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": env.machine(), "versions": env.versions(), "load": {"start": uptime()},
        "settings": {"configs": names, "concurrencies": concurrencies, "trials": args.trials,
                     "duration_s": args.duration, "warmup_window_s": args.warmup_window,
                     "warmup_min_s": args.warmup_min, "warmup_max_s": args.warmup_max, "steady": args.steady,
                     "seed": args.seed},
        "labels": {c.name: c.label for c in configs}, "configs": {c.name: c.__dict__ | {"properties": dict(c.properties)}
                                                                  for c in configs},
    }
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp, ExitStack() as stack:
        log(f"preparing data from {args.artifacts}")
        data = serving_data(args.artifacts, cache_root() / "bench", False, args.request_images, 10, log)
        result["data"] = data.summary()
        servers: dict[str, Server] = {}
        result["start_to_ready_s"] = {}
        for cfg in configs:
            run = TorchServeRun(cfg, data.artifacts, Path(tmp))
            stack.enter_context(run)
            servers[cfg.name] = server = Server(run, data.images)
            stack.callback(server.script.remove)
            result["start_to_ready_s"][cfg.name] = run.start_to_ready_s
            log(f"{cfg.name} ({cfg.label}): READY in {run.start_to_ready_s:.1f} s")
        result["warmup"] = {}
        for name, server in servers.items():
            w = server.warm(args.warmup_window, args.warmup_min, args.warmup_max, args.steady)
            result["warmup"][name] = w
            log(f"{name}: warm after {w['seconds']} s (steady={w['steady']}): "
                + ", ".join(f"{x['throughput']:.0f}" for x in w["windows"]) + " req/s")
        result["load"]["after_warmup"] = uptime()
        rng = random.Random(args.seed)
        trials: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in concurrencies} for n in names}
        result["rounds"] = []
        for r in range(args.trials):
            orders = {}
            for c in concurrencies:
                order = names[:]
                rng.shuffle(order)
                orders[c] = order
                for name in order:
                    t = servers[name].trial(c, args.duration)
                    t["round"] = r
                    trials[name][c].append(t)
            load = uptime()
            result["rounds"].append({"round": r, "order": orders, "loadavg": load})
            log(f"round {r + 1}/{args.trials} done, loadavg {load}; c=1 p50 / c=16 req/s: " + ", ".join(
                f"{n} {trials[n][concurrencies[0]][-1]['p50_ms']:.1f}/{trials[n][concurrencies[-1]][-1]['throughput']:.0f}"
                for n in names))
    result["load"]["end"] = uptime()
    result["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    result["duration_s"] = round(time.time() - started, 1)
    result["trials"] = trials
    finish(result, args.out, args.name)
    log(f"wrote {args.out}/{args.name}.md and .summary.json in {result['duration_s']:.0f} s")
    for name, v in result["verdicts"].items():
        log(f"  {name}: c=1 p50/no-batching {v['c1_p50_over_no_batching']:.2f}, c=16 req/s/shipped "
            f"{v['c16_throughput_over_shipped']:.3f} -> {'MEETS' if v['meets'] else 'misses'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
