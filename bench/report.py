"""results.json -> targets (met/missed, by how much, why) and the results.md tables."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .peers import PYTHON_RUNTIME, cpu_verdict
from .stats import fmt, median, mid

TARGET_C = 16
#: The shipped REST configuration's req/s at each of these concurrencies, over the best in-process ceiling.
TARGET_RATIO_CS = (16, 64)
TARGET_RATIO = 0.53
TARGET_P99_MS = 25.0
TARGET_START_S = 6.0
TARGET_ARCHIVE_S = 10.0
#: Bulk work (python -m client predict DIR): batched requests at least this share of the in-process ceiling.
TARGET_BULK_RATIO = 0.8
#: The python runtime's targets (#39): requests against TorchServe's shipped configuration at c=16 and 64, the
#: share of the in-process ceiling there, and at least the FastAPI peer at every concurrency with p99 no worse.
TARGET_PY_VS_TS, TARGET_PY_CEILING, TARGET_PY_CS = 1.3, 0.70, (16, 64)
SPLIT_ORDER = ("frontend", "queue", "worker_other", "preprocess", "embed", "search")
SPLIT_COLUMNS = (*SPLIT_ORDER, "outside_handler", "mean_batch")
CEILING_NOTE = ("`EmbeddingService.answer` on the same PNG bytes, same model, index and preprocessing, no server. "
                "Layout `2x1` = 2 processes x 1 torch thread (the shipped workers' budget), `1x2` = 1 process x "
                "2 threads. images/s is summed over processes.")
REST_NOTE = ("Load: `wrk -t1 -c<c>` with a Lua script posting the PNG bodies with `Authorization: Bearer "
             "<inference key>`; the repo's config.properties on free ports, each configuration its own .mar "
             "(generated model-config.yaml) and server. CPU: 100% = one core of the machine.")
SPLIT_NOTE = ("frontend = client mean - TorchServe inference latency; queue = `ts_queue_latency_microseconds` "
              "(includes waiting for the batch to fill: a lone request shows about maxBatchDelay); "
              "worker other = inference - queue - handler (IPC, TorchServe's Python wrapper, logging and metrics, "
              "waiting for a CPU); "
              "preprocess / embed / search = the handler's per-batch stage times, request-weighted; "
              "outside handler = client mean - handler.")
BATCHED_NOTE = ("Load: `wrk -t1 -c<c>` posting KServe v1 bodies (`{{\"instances\": [{{\"data\": <base64 PNG>}}, ...]}}`, "
                "`application/json`) of {batch} request images each to /predictions, what `python -m client predict "
                "DIR` sends; images/s = req/s x {batch}. Shipped configuration; share = images/s over the best "
                "in-process ceiling above. End to end through the client (files on disk to JSONL/NPY): "
                "`python -m bench client-batch` (bench/results/client-batch.md).")
GRPC_SPLIT_NOTE = ("TorchServe 0.12 does not add gRPC requests to `ts_inference_latency_microseconds` or "
                   "`ts_queue_latency_microseconds`, so only the handler stages and the time outside the handler "
                   "(client mean - handler) are split out.")
PEERS_NOTE = ("Same `EmbeddingService`, same PNG bodies and wrk load, loopback, no token check. "
              "LitServe: its batching (`max_batch_size`, `batch_timeout`), `workers_per_device` inference "
              "processes, `num_api_servers` HTTP processes (one per worker, its default), `fast_queue`. FastAPI + "
              "uvicorn: worker processes each on its own `SO_REUSEPORT` socket on the port (uvicorn's `--workers` "
              "shares one socket, and one worker took every connection at c=16), each with an asyncio "
              "micro-batcher running one `answer` per batch on one thread. Server CPU covers each server's whole "
              "process tree.")
BOTH_CORES_NOTE = ("Whether each peer used both cores under load (median server CPU >= {pct:.0f}%, 100% = one "
                   "core), its median CPU by process, the whole machine's busy CPU including hypervisor steal "
                   "(other work = machine - server - load generator) and, below the mark, why.")
GALLERY_NOTE = ("Build with 2 threads; search with 1 thread (one worker's budget); recall@1 against exact search on "
                "real held-out queries; index MB = serialized size.")


def _run_at(runs: Iterable[dict] | None, concurrency: int) -> dict | None:
    return next((r for r in runs or [] if r["concurrency"] == concurrency), None)


def _shipped(results: dict) -> dict | None:
    return next((c for c in results.get("torchserve", []) if c.get("shipped")), None)


def ceiling_best(results: dict) -> dict | None:
    rows = (results.get("ceiling") or {}).get("rows") or []
    return max(rows, key=lambda r: median(r["images_per_s"]) or 0.0) if rows else None


def _ceiling_at(results: dict, processes: int, threads: int, batch: int) -> dict | None:
    rows = (results.get("ceiling") or {}).get("rows") or []
    return next((r for r in rows if (r["processes"], r["threads"], r["batch"]) == (processes, threads, batch)), None)


def _target(name: str, goal: str, measured: str, met: bool | None, margin: str, why: str) -> dict[str, Any]:
    return {"target": name, "goal": goal, "measured": measured, "met": met, "margin": margin, "why": why}


def _split_text(run: dict) -> str:
    split = run.get("split_ms") or {}
    parts = [f"{k.replace('_', ' ')} {median(split[k]):.2f}" for k in SPLIT_ORDER if median(split.get(k)) is not None]
    batch = mid(split.get("mean_batch"))
    return ("mean latency split (ms): " + ", ".join(parts) + (f"; mean batch {batch:.1f}" if batch else "")) if parts else ""


def _cpu_text(run: dict) -> str:
    return (f"server CPU {median(run['server_cpu_pct']) or 0:.0f}%, load generator CPU "
            f"{median(run['loadgen_cpu_pct']) or 0:.0f}% (100% = one core)")


def _ratio_target(results: dict, shipped: dict | None, best_ceiling: dict | None, c: int,
                  caveat: str) -> dict[str, Any]:
    """The shipped configuration's REST req/s at concurrency `c` as a share of the best in-process ceiling."""
    name = f"REST throughput, shipped config, c={c}"
    run = _run_at(shipped.get("runs") if shipped else None, c)
    if not (shipped and run and best_ceiling):
        return _target(name, f">= {TARGET_RATIO:.0%} of ceiling", "not measured", None, "",
                       f"needs the ceiling and rest sections at c={c}")
    ceil = mid(best_ceiling["images_per_s"])
    thr = mid(run["throughput"])
    ratio = thr / ceil if ceil else 0.0
    same_batch = _ceiling_at(results, shipped["workers"], shipped["threads"], shipped["batch_size"])
    same_text = (f"; the ceiling with the server's layout and batch ({same_batch['layout']}, batch "
                 f"{same_batch['batch']}) is {mid(same_batch['images_per_s']):.0f} images/s") if same_batch else ""
    return _target(name, f">= {TARGET_RATIO:.0%} of the in-process ceiling",
                   f"{thr:.0f} req/s = {ratio:.0%} of {ceil:.0f} images/s ({best_ceiling['layout']}, batch "
                   f"{best_ceiling['batch']})", ratio >= TARGET_RATIO, f"{100 * (ratio - TARGET_RATIO):+.0f} points",
                   _cpu_text(run) + "; " + _split_text(run) + same_text + caveat)


def targets(results: dict) -> list[dict[str, Any]]:
    """Each serving target (throughput vs ceiling, p99, peers, configs, gallery, start times) as met / missed / not
    measured, with the margin and the figures behind it."""
    out = []
    data_name = (results.get("data") or {}).get("name", "")
    caveat = "" if data_name.startswith("fashion-mnist-60k") else f" [measured on {data_name}, not the 60k gallery]"
    shipped = _shipped(results)
    best_ceiling = ceiling_best(results)
    for c in TARGET_RATIO_CS:
        out.append(_ratio_target(results, shipped, best_ceiling, c, caveat))
    run = _run_at(shipped.get("runs") if shipped else None, TARGET_C)
    if run:
        p99 = mid(run["p99_ms"])
        out.append(_target(f"REST p99, shipped config, c={TARGET_C}", f"<= {TARGET_P99_MS:.0f} ms", f"{p99:.1f} ms",
                           p99 <= TARGET_P99_MS, f"{TARGET_P99_MS - p99:+.1f} ms headroom",
                           f"p50 {mid(run['p50_ms']):.1f} ms, p90 {mid(run['p90_ms']):.1f} ms; " + _split_text(run)
                           + caveat))
    else:
        out.append(_target(f"REST p99, shipped config, c={TARGET_C}", f"<= {TARGET_P99_MS:.0f} ms", "not measured",
                           None, "", "needs the rest section at c=16"))
    out.append(_bulk_target(results, shipped, best_ceiling))
    out.append(_peer_target(results, shipped))
    out.extend(python_runtime_targets(results, shipped, best_ceiling))
    out.append(_best_config_target(results))
    out.append(_gallery_target(results))
    cold = results.get("cold_start") or {}
    mar = f".mar {cold.get('mar_mb', 0):.1f} MB"
    out.append(_time_target("TorchServe start to READY", cold.get("start_to_ready_s"), TARGET_START_S,
                            "READY = a worker of the model reports READY: JVM start, .mar unpack, then the worker "
                            f"imports torch, verifies the SHA-256 of model/index/labels and loads them; {mar}"))
    out.append(_time_target("./archive.sh with existing artifacts", cold.get("archive_s"), TARGET_ARCHIVE_S,
                            f"bootstrap check, Python start, SHA-256 verification, torch-model-archiver zipping; {mar}"))
    return out


def _best_batched(shipped: dict | None) -> dict | None:
    runs = ((shipped or {}).get("batched") or {}).get("runs") or []
    measured = [r for r in runs if median(r.get("images_per_s")) is not None]
    return max(measured, key=lambda r: median(r["images_per_s"])) if measured else None


def _bulk_target(results: dict, shipped: dict | None, best_ceiling: dict | None) -> dict[str, Any]:
    name = "REST batched requests (bulk), shipped config"
    goal = f">= {TARGET_BULK_RATIO:.0%} of the in-process ceiling"
    run = _best_batched(shipped)
    if run is None or best_ceiling is None:
        return _target(name, goal, "not measured", None, "", "needs the ceiling and batched sections")
    batch = shipped["batched"]["batch"]
    ceil, images = mid(best_ceiling["images_per_s"]), mid(run["images_per_s"])
    ratio = images / ceil if ceil else 0.0
    return _target(name, goal, f"{images:.0f} images/s ({mid(run['throughput']):.0f} req/s x {batch}, c="
                               f"{run['concurrency']}) = {ratio:.0%} of {ceil:.0f} images/s", ratio >= TARGET_BULK_RATIO,
                   f"{100 * (ratio - TARGET_BULK_RATIO):+.0f} points",
                   f"KServe v1 bodies of {batch} images; p99 {mid(run['p99_ms']):.0f} ms per request; "
                   + _cpu_text(run))


def _at_target_c(items: Iterable[Any], runs_of: Any) -> list[tuple[Any, dict]]:
    """(item, its run at the target concurrency) for the items measured there."""
    return [(item, run) for item in items if (run := _run_at(runs_of(item), TARGET_C)) is not None]


def _time_target(name: str, summary: dict | None, limit_s: float, why: str) -> dict[str, Any]:
    value = median(summary)
    if value is None:
        return _target(name, f"<= {limit_s:.0f} s", "not measured", None, "", "")
    return _target(name, f"<= {limit_s:.0f} s", fmt(summary, 2, " s"), value <= limit_s, f"{limit_s - value:+.2f} s", why)


def _peer_target(results: dict, shipped: dict | None) -> dict[str, Any]:
    name = f"TorchServe ahead of peers at c={TARGET_C}"
    goal = "higher req/s than every peer at equal or better p99"
    peers = _at_target_c([p for p in results.get("peers", []) if p["name"] != PYTHON_RUNTIME], lambda p: p.get("runs"))
    ts_runs = _at_target_c([("REST", (shipped or {}).get("runs")), ("gRPC", (results.get("grpc") or {}).get("runs"))],
                           lambda kr: kr[1])
    if not peers or not ts_runs:
        return _target(name, goal, "not measured", None, "", "needs rest or grpc, and peers, at c=16")
    wins, lines = [], []
    for peer, pr in peers:
        beaten_by = [k for (k, _), r in ts_runs if mid(r["throughput"]) > mid(pr["throughput"])
                     and mid(r["p99_ms"]) <= mid(pr["p99_ms"])]
        wins.append(bool(beaten_by))
        lines.append(f"{peer['name']} {mid(pr['throughput']):.0f} req/s p99 {mid(pr['p99_ms']):.1f} ms"
                     + (f" (server CPU {mid(pr['server_cpu_pct']):.0f}%: below both cores)" if unsaturated(pr) else "")
                     + (f" (beaten by {'/'.join(beaten_by)})" if beaten_by else " (not beaten)"))
    best_ts = max(mid(r["throughput"]) for _, r in ts_runs)
    best_peer = max(mid(r["throughput"]) for _, r in peers)
    ts_text = "; ".join(f"{k} {mid(r['throughput']):.0f} req/s p99 {mid(r['p99_ms']):.1f} ms" for (k, _), r in ts_runs)
    return _target(name, goal, ts_text, all(wins), f"best TorchServe / best peer = {best_ts / best_peer:.2f}x",
                   "; ".join(lines))


def _peer_runs(results: dict, name: str) -> list[dict] | None:
    return next((p.get("runs") for p in results.get("peers", []) if p["name"] == name), None)


def python_runtime_targets(results: dict, shipped: dict | None, best_ceiling: dict | None) -> list[dict[str, Any]]:
    """#39's targets for the python runtime, measured beside TorchServe and the peers in the same run."""
    py = _peer_runs(results, PYTHON_RUNTIME)
    if py is None:
        return [_target("python runtime", "its #39 targets", "not measured", None, "", "needs --peers python")]
    out = []
    ceil = mid(best_ceiling["images_per_s"]) if best_ceiling else 0.0
    for c in TARGET_PY_CS:
        run, ts = _run_at(py, c), _run_at((shipped or {}).get("runs"), c)
        if run is None or ts is None:
            out.append(_target(f"python runtime vs TorchServe, c={c}", f">= {TARGET_PY_VS_TS}x", "not measured",
                               None, "", ""))
            continue
        ratio = mid(run["throughput"]) / mid(ts["throughput"])
        out.append(_target(f"python runtime vs TorchServe shipped, c={c}", f">= {TARGET_PY_VS_TS}x req/s",
                           f"{mid(run['throughput']):.0f} vs {mid(ts['throughput']):.0f} req/s = {ratio:.2f}x",
                           ratio >= TARGET_PY_VS_TS, f"{ratio - TARGET_PY_VS_TS:+.2f}x",
                           f"p99 {mid(run['p99_ms']):.1f} vs {mid(ts['p99_ms']):.1f} ms; " + _cpu_text(run)))
        if ceil:
            share = mid(run["throughput"]) / ceil
            out.append(_target(f"python runtime share of the ceiling, c={c}", f">= {TARGET_PY_CEILING:.0%}",
                               f"{share:.0%} of {ceil:.0f} images/s", share >= TARGET_PY_CEILING,
                               f"{100 * (share - TARGET_PY_CEILING):+.0f} points", _cpu_text(run)))
    fastapi = _peer_runs(results, "fastapi")
    if fastapi:
        rows, ok = [], True
        for run in sorted(py, key=lambda r: r["concurrency"]):
            other = _run_at(fastapi, run["concurrency"])
            if other is None:
                continue
            better = (mid(run["throughput"]) >= mid(other["throughput"])
                      and mid(run["p99_ms"]) <= mid(other["p99_ms"]))
            ok &= better
            rows.append(f"c={run['concurrency']}: {mid(run['throughput']):.0f} vs {mid(other['throughput']):.0f} "
                        f"req/s, p99 {mid(run['p99_ms']):.1f} vs {mid(other['p99_ms']):.1f} ms"
                        + ("" if better else " (not)"))
        out.append(_target("python runtime vs the FastAPI peer", "more req/s, p99 no worse, at every c",
                           f"{sum(not r.endswith('(not)') for r in rows)} of {len(rows)} concurrencies", ok, "",
                           "; ".join(rows)))
    no_batching = next((c for c in results.get("torchserve", []) if c["name"] == "no-batching"), None)
    one, ts_one = _run_at(py, 1), _run_at((no_batching or {}).get("runs"), 1)
    if one and ts_one:
        p50, ts_p50 = mid(one["p50_ms"]), mid(ts_one["p50_ms"])
        out.append(_target("python runtime p50 at c=1", "<= TorchServe without batching", f"{p50:.2f} vs "
                           f"{ts_p50:.2f} ms", p50 <= ts_p50, f"{ts_p50 - p50:+.2f} ms", ""))
    return out


def _best_config_target(results: dict) -> dict[str, Any]:
    name = "Shipped defaults are the best configuration"
    goal = f"highest c={TARGET_C} req/s among configurations with p99 <= {TARGET_P99_MS:.0f} ms"
    rows = _at_target_c(results.get("torchserve", []), lambda c: c.get("runs"))
    if len(rows) < 2:
        return _target(name, goal, "not measured", None, "", "needs more than one configuration at c=16")
    ok = [(c, r) for c, r in rows if mid(r["p99_ms"]) <= TARGET_P99_MS]
    if not ok:
        goal += " (none met it: ranked by req/s alone)"
        ok = rows
    best_cfg, best = max(ok, key=lambda cr: mid(cr[1]["throughput"]))
    shipped = next((r for c, r in rows if c.get("shipped")), None)
    if shipped is None:
        return _target(name, goal, "shipped configuration not measured", None, "", "")
    tie = shipped["throughput"]["max"] >= best["throughput"]["min"]
    met = best_cfg.get("shipped") or (tie and mid(shipped["p99_ms"]) <= TARGET_P99_MS)
    ranking = ", ".join(f"{c['name']} {mid(r['throughput']):.0f} req/s p99 {mid(r['p99_ms']):.1f} ms"
                        for c, r in sorted(rows, key=lambda cr: -mid(cr[1]["throughput"])))
    measured = f"best: {best_cfg['name']} ({best_cfg['label']})"
    margin = f"shipped = {mid(shipped['throughput']) / mid(best['throughput']):.2f}x best" + (
        " (min-max ranges overlap: a tie)" if tie and not best_cfg.get("shipped") else "")
    return _target(name, goal, measured, bool(met), margin, ranking)


def _gallery_target(results: dict) -> dict[str, Any]:
    gal = results.get("gallery") or {}
    rec = gal.get("recommendation", {}).get("largest")
    name = "Largest gallery: single query <= 1 ms at recall@1 >= 0.98"
    if not rec:
        return _target(name, "current HNSW or IVF params in training/index.py", "not measured", None, "", "")
    rows = [r for r in gal["rows"] if r["gallery"] == rec["gallery"] and r["index"] != "flat"]
    measured = "; ".join(f"{r['index']} {mid(r['latency_b1_ms']):.3f} ms recall {r['recall_at_1']:.4f}" for r in rows)
    met = any(rec["current_params_meet_target"].values())
    tuned = "; ".join(f"{k}: " + (", ".join(f"{p}={v}" for p, v in t.items() if p not in ("recall_at_1", "latency_b1_ms"))
                                  + f" (recall@1 {t['recall_at_1']:.4f}, {t['latency_b1_ms']:.3f} ms)"
                                  if t else "no swept value meets it") for k, t in rec["tuned"].items())
    margin = "; ".join(f"{r['index']}: {1.0 - mid(r['latency_b1_ms']):+.3f} ms, recall {r['recall_at_1'] - 0.98:+.4f}"
                       for r in rows)
    return _target(f"{name} ({rec['gallery']})", "with the current params in training/index.py", measured, met,
                   margin, f"cheapest swept settings meeting it: {tuned}")


WARMUP_HEADER = "warm-up s (c=16 req/s per window)"


def _warmup(entry: dict) -> str:
    """How long a server was loaded before its figures (series.warm_until_steady), with each window's req/s."""
    warm = entry.get("warmup")
    if not warm:
        return "-"
    rates = ", ".join(f"{r:.0f}" for r in warm["rates"])
    return f"{warm['seconds']:.0f} ({rates}){'' if warm['steady'] else ', not settled'}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _status(met: bool | None) -> str:
    return {True: "**met**", False: "**missed**", None: "not measured"}[met]


#: Server CPU (100% = one core) below which a server under load (c >= SATURATED_FROM_C) is flagged as not using
#: both cores of the machine: its throughput there is not the most it could do, so a comparison with it is unfair.
SATURATED_CPU_PCT = 180.0
SATURATED_FROM_C = 16


def unsaturated(run: dict) -> bool:
    """True for a run at c >= 16 whose server used less than 180% CPU."""
    cpu = median(run.get("server_cpu_pct"))
    return run["concurrency"] >= SATURATED_FROM_C and cpu is not None and round(cpu) < SATURATED_CPU_PCT


def _load_rows(runs: list[dict], label: str) -> list[list[str]]:
    return [[label, r["concurrency"], fmt(r["throughput"], 0), fmt(r["p50_ms"], 1), fmt(r["p90_ms"], 1),
             fmt(r["p99_ms"], 1), r["errors"], fmt(r["loadgen_cpu_pct"], 0),
             fmt(r["server_cpu_pct"], 0) + (" **below both cores**" if unsaturated(r) else "")]
            for r in runs]


def _both_cores_rows(peers: list[dict], cores: int) -> list[list[str]]:
    rows = []
    for p in peers:
        for run in p.get("runs", []):
            v = cpu_verdict(run, SATURATED_CPU_PCT, SATURATED_FROM_C, cores)
            if v:
                machine = ("n/a" if v["machine_busy_pct"] is None
                           else f"{v['machine_busy_pct']:.0f} ({v['others_pct']:.0f})")
                rows.append([p["name"], v["concurrency"], f"{v['server_cpu_pct']:.0f}",
                             "yes" if v["used_both_cores"] else "**no**", v["by_process"] or "n/a", machine,
                             v["why"] or "-"])
    return rows


CPU_FLAG_NOTE = (f"**below both cores**: at c >= {SATURATED_FROM_C} the server used less than "
                 f"{SATURATED_CPU_PCT:.0f}% CPU (100% = one core), so it did not use the machine's two cores and its "
                 "throughput there understates what it can do; compare with it knowing that.")


LOAD_HEADER = ["server / config", "c", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors", "load gen CPU %",
               "server CPU %"]


def _memory_rows(name: str, entry: dict) -> list[list[str]]:
    idle = {m["pid"]: m for m in entry.get("memory_idle", [])}
    loaded = {m["pid"]: m for m in entry.get("memory_loaded", [])}
    rows = [[name, f"{m['role']} ({pid})", f"{m['rss_mb']:.0f}",
             f"{loaded[pid]['rss_mb']:.0f}" if pid in loaded else "gone"] for pid, m in idle.items()]
    total_idle = sum(m["rss_mb"] for m in idle.values())
    total_loaded = sum(m["rss_mb"] for m in loaded.values())
    rows.append([name, "**total**", f"{total_idle:.0f}", f"{total_loaded:.0f}"])
    return rows


def markdown(results: dict) -> str:
    m, v, s = results["machine"], results["versions"], results["settings"]
    load = results.get("load_average", {})
    parts = [
        "# Embedding service benchmark",
        "",
        (f"Mode **{results['mode']}**, started {results['started']}, took {results.get('duration_s', 0):.0f} s. "
         f"Every figure is the median over {s['trials']} trial(s), min-max in parentheses; all were measured in this "
         "one run, one after the other, on this machine."),
        "",
        (f"- Machine: {m['cpu_model']}, {m['logical_cores']} logical / {m['physical_cores']} physical cores, "
         f"{m['memory_gib']} GiB, {m['os']}"),
        (f"- Versions: Python {v['python']}, torch {v['torch']}, faiss-cpu {v['faiss-cpu']}, torchserve "
         f"{v['torchserve']}, torch-model-archiver {v['torch-model-archiver']}, Java `{v['java']}`, {v['wrk']}, "
         f"grpcio {v['grpcio']}, litserve {v['litserve']}, fastapi {v['fastapi']}, uvicorn {v['uvicorn']}, "
         f"numpy {v['numpy']}, pillow {v['pillow']}"),
        f"- Load average (1/5/15 min) at start {load.get('start')}, at end {load.get('end')}"
        + (" — **the machine was not quiet: treat the figures as indicative**"
           if load.get("start") and load["start"][0] >= 0.3 else ""),
    ]
    data = results.get("data")
    if data:
        parts.append(f"- Served gallery: {data['description']} ({data['gallery_size']:,} x {data['dim']}, held-out "
                     f"k-NN accuracy {data.get('accuracy') or 0:.3f}). Requests: {data['request_images']} held-out "
                     f"images as PNG, dark on white, 112x112 (mean {data['mean_request_bytes']:.0f} bytes), "
                     "raw body `application/octet-stream`, cycled.")
    parts.append(f"- Server CPU marked {CPU_FLAG_NOTE}")
    parts += ["", "## Targets", "", _table(
        ["target", "goal", "measured", "status", "margin", "why (figures)"],
        [[t["target"], t["goal"], t["measured"], _status(t["met"]), t["margin"], t["why"]]
         for t in results.get("targets", [])])]
    if results.get("ceiling"):
        parts += ["", "## 1. In-process ceiling", "",
                  CEILING_NOTE, "",
                  _table(["layout", "batch", "images/s", "batch p50 ms"],
                         [[r["layout"], r["batch"], fmt(r["images_per_s"], 0), fmt(r["batch_ms_p50"], 2)]
                          for r in results["ceiling"]["rows"]])]
    ts = results.get("torchserve") or []
    if ts:
        parts += ["", "## 2. TorchServe REST", "",
                  REST_NOTE, "",
                  _table(["config", "workers x threads, batching", "index", "start to READY s", ".mar MB",
                          WARMUP_HEADER, "error"],
                         [[c["name"], c["label"], c["index"] or "as built",
                           f"{c['start_to_ready_s']:.2f}" if "start_to_ready_s" in c else "-",
                           f"{c['mar_mb']:.1f}" if "mar_mb" in c else "-", _warmup(c), c.get("error", "")]
                          for c in ts]),
                  "", _table(LOAD_HEADER, [row for c in ts for row in _load_rows(c.get("runs", []), c["name"])]),
                  *_batched_section(results),
                  "", "### Latency split (mean ms per request)", "",
                  SPLIT_NOTE, "",
                  _table(["config", "c", "client mean", *(k.replace("_", " ") for k in SPLIT_COLUMNS)],
                         [[c["name"], r["concurrency"], fmt(r["mean_ms"], 2), *_split_cells(r)]
                          for c in ts for r in c.get("runs", [])])]
    grpc = results.get("grpc")
    if grpc:
        parts += ["", "## 3. TorchServe gRPC", ""]
        if grpc.get("available"):
            parts += [(f"Shipped configuration ({grpc['label']}), `Predictions` RPC with the bearer token in "
                       f"metadata; load from {grpc['processes']} Python processes (grpc.aio closed loops, stubs from "
                       "`client.protos`), their CPU measured with psutil."), "",
                      _table(LOAD_HEADER, _load_rows(grpc["runs"], "gRPC shipped")), "",
                      GRPC_SPLIT_NOTE, "",
                      _table(["c", "client mean", *(k.replace("_", " ") for k in SPLIT_COLUMNS)],
                             [[r["concurrency"], fmt(r["mean_ms"], 2), *_split_cells(r)] for r in grpc["runs"]])]
        else:
            parts.append(f"Not measured: {grpc.get('reason')}")
    peers = results.get("peers") or []
    if peers:
        parts += ["", "## 4. Peers", "",
                  PEERS_NOTE, "",
                  _table(["peer", "settings", "start to ready s", WARMUP_HEADER, "error"],
                         [[p["name"], p["label"], f"{p.get('start_to_ready_s', 0):.2f}", _warmup(p),
                           p.get("error", "")] for p in peers]), "",
                  _table(LOAD_HEADER, [row for p in peers for row in _load_rows(p.get("runs", []), p["name"])])]
        cores = _both_cores_rows(peers, (results.get("machine") or {}).get("logical_cores") or 2)
        if cores:
            parts += ["", f"### Both cores at c >= {SATURATED_FROM_C}", "",
                      BOTH_CORES_NOTE.format(pct=SATURATED_CPU_PCT), "",
                      _table(["peer", "c", "server CPU %", "both cores", "CPU by process",
                              "machine busy % (other work)", "why not"], cores)]
    side = _side_by_side(results)
    if side:
        parts += ["", f"### Side by side at c={TARGET_C}", "", _table(LOAD_HEADER, side)]
    gal = results.get("gallery")
    if gal:
        parts += ["", "## 5. Gallery scaling", "", *(f"- **{s['name']}**: {s['description']}" for s in gal["sets"]), "",
                  GALLERY_NOTE, "",
                  _table(["gallery", "size", "index", "params", "build s", "index MB", "RSS delta MB", "recall@1",
                          "batch 1 ms/query", "batch 64 ms/batch"],
                         [[r["gallery"], f"{r['size']:,}", r["index"], _params(r["params"]), f"{r['build_s']:.2f}",
                           f"{r['index_mb']:.1f}", f"{r['rss_delta_mb']:.0f}", f"{r['recall_at_1']:.4f}",
                           fmt(r["latency_b1_ms"], 3), fmt(r["latency_b64_ms"], 2)] for r in gal["rows"]])]
        if gal.get("sweeps"):
            parts += ["", f"Search-time sweep on {gal['sweeps'][0]['gallery']} (build parameters as above):", "",
                      ("Meets target: median batch-1 latency <= 1 ms and recall@1 minus two standard errors over "
                       f"the {gal['sweeps'][0]['queries']} queries >= 0.98."), "",
                      _table(["index", "knob", "value", "recall@1", "batch 1 ms/query", "meets target"],
                             [[w["index"], w["param"], w["value"], f"{w['recall_at_1']:.4f}", fmt(w["latency_b1_ms"], 3),
                               "yes" if w["meets_target"] else "no"]
                              for w in gal["sweeps"]])]
        rec = gal.get("recommendation", {})
        parts += ["", f"Default index rule: {rec.get('rule', '')}.", ""]
        for gname, pick in rec.get("per_gallery", {}).items():
            parts.append(f"- {gname}: **{pick['index']}** ({_params(pick['params'])}, {pick['latency_b1_ms']:.3f} ms, "
                         f"recall@1 {pick['recall_at_1']:.4f})" if pick else f"- {gname}: no index meets recall")
    cold = results.get("cold_start")
    if cold:
        parts += ["", "## 6. Cold start", "",
                  _table(["step", "time", ".mar MB"],
                         [["./archive.sh --no-train (existing artifacts)", fmt(cold["archive_s"], 2, " s"),
                           f"{cold['mar_mb']:.1f}"],
                          ["TorchServe start to READY (shipped config)", fmt(cold.get("start_to_ready_s"), 2, " s"), ""]])]
    mem = [row for c in ts if c.get("memory_idle") for row in _memory_rows(f"TorchServe {c['name']}", c)]
    mem += [row for p in peers if p.get("memory_idle") for row in _memory_rows(p["name"], p)]
    if mem:
        parts += ["", "## 7. Memory (RSS MB)", "",
                  "Idle = 1 s after READY; after load = after the last trial.", "",
                  _table(["server", "process", "idle", "after load"], mem)]
    return "\n".join(parts) + "\n"


def _batched_section(results: dict) -> list[str]:
    """The batched-requests table (images/s beside req/s) of the shipped configuration, if measured."""
    shipped = _shipped(results)
    batched = (shipped or {}).get("batched")
    if not batched or not batched.get("runs"):
        return []
    best = ceiling_best(results)
    ceil = mid(best["images_per_s"]) if best else float("nan")
    rows = [[r["concurrency"], fmt(r["throughput"], 1), fmt(r["images_per_s"], 0),
             f"{mid(r['images_per_s']) / ceil:.0%}" if ceil == ceil and ceil else "n/a",
             fmt(r["p50_ms"], 1), fmt(r["p99_ms"], 1), str(r["errors"]), fmt(r["server_cpu_pct"], 0)]
            for r in batched["runs"]]
    return ["", f"### Batched requests: {batched['batch']} images per request ({batched['label']})", "",
            BATCHED_NOTE.format(batch=batched["batch"]), "",
            _table(["c", "req/s", "images/s", "share of ceiling", "p50 ms", "p99 ms", "errors", "server CPU %"], rows)]


def _split_cells(run: dict) -> list[str]:
    split = run.get("split_ms") or {}
    return [fmt(split.get(k), 1 if k == "mean_batch" else 2) for k in SPLIT_COLUMNS]


def _params(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "-"


def _side_by_side(results: dict) -> list[list[str]]:
    rows = []
    for c in results.get("torchserve", []):
        run = _run_at(c.get("runs"), TARGET_C)
        if run:
            rows += _load_rows([run], f"TorchServe REST {c['name']}")
    grpc = results.get("grpc") or {}
    run = _run_at(grpc.get("runs"), TARGET_C)
    if run:
        rows += _load_rows([run], "TorchServe gRPC shipped")
    for p in results.get("peers", []):
        run = _run_at(p.get("runs"), TARGET_C)
        if run:
            rows += _load_rows([run], p["name"])
    return rows
