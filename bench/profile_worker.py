"""`python -m bench profile-worker`: where a TorchServe worker's time goes under load, and every process's CPU.

The benchmark says how far the server is from the in-process ceiling; this says where the difference goes.
It starts the shipped configuration (its own .mar and TorchServe, as `python -m bench latency` does), warms it
at c=16 until two 3 s windows agree within 5% (at least 15 s), then samples every Python worker with
py-spy (`record --format raw --nonblocking`: the worker is never paused) during one wrk run. Each sample is
put in the first stage of STAGES whose frames it holds. Over the same run psutil gives the CPU of the Java
frontend and of the workers, and wrk its own: the two cores' budget. Writes worker-profile.md and
worker-profile.summary.json (raw/worker-profile.json: the full record).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Iterable

import psutil

from serving.server import ServerError
from settings import DEFAULT_ARTIFACTS, cache_root

from . import env, output
from .data import serving_data
from .latency import Server, uptime
from .loadgen import exit_cpu_seconds
from .series import WARMUP_MIN_S, WARMUP_STEADY, WARMUP_WINDOW_S
from .torchserve import TorchServeRun, shipped_config, worker_role

#: (stage, frames that must all be on the stack); a stage may have several rules. First match wins, so the handler's
#: own log line and metrics (one write to stdout per batch, since they share it) are told apart from the rest of its
#: postprocess, decoding from the rest of preprocessing, and TorchServe's frames only take what no handler stage
#: claimed: every sample under the handler's entry points (embedding_handler.py) is the handler's. Frames read
#: "function (file:line)"; the .mar unpacks embedding_handler.py at the model directory's root, beside handler/.
#: bench/tests/unit/test_bench_profile.py checks that these functions still exist under these names.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("handler: per-batch log line and metrics", ("record_metrics (",)),
    ("handler: per-batch log line and metrics", ("EmbeddingHandler.postprocess (", "Logger.")),
    ("handler: per-batch log line and metrics", ("batch_log_line (",)),
    ("model forward pass", ("EmbeddingService.embed (",)),
    ("image decoding (Pillow)", ("EmbeddingService.prepare (", "decode_image (")),
    ("preprocessing (grey, crop, centre, normalise)", ("EmbeddingService.prepare (",)),
    ("gallery search", ("GallerySearcher.",)),
    ("answers to JSON", ("EmbeddingHandler.postprocess (",)),
    ("handler: reading request rows", ("read_row (",)),
    ("handler: the rest (content types, stacking the batch)", ("(embedding_handler.py:",)),
    ("TorchServe: reading requests from the frontend", ("retrieve_msg (",)),
    ("TorchServe: its own metrics and logging", ("ts/metrics/",)),
    ("TorchServe: encoding answers", ("create_predict_response (",)),
    ("TorchServe: the rest (socket, service wrapper)", ("ts/",)),
    ("other", ()),
)
#: Innermost frames kept per stage (the functions a stage's samples were running), so a reader can check the rules.
TOP_FRAMES = 5
SAMPLE_HZ = 200


class ProfileError(RuntimeError):
    """The profile could not be taken (no py-spy, no permission to attach, no samples)."""


def stage_names() -> list[str]:
    """The stages in order (a stage may have several rules)."""
    return list(dict.fromkeys(stage for stage, _ in STAGES))


def stage_of(frames: list[str]) -> str:
    """The first stage in STAGES whose required frames are all on the stack."""
    for stage, needles in STAGES:
        if all(any(needle in frame for frame in frames) for needle in needles):
            return stage
    return "other"


def function_of(frame: str) -> str:
    """A frame without its line number: "function (file:line)" -> "function (file)"."""
    name, sep, rest = frame.rpartition(":")
    return f"{name})" if sep and rest.rstrip(")").isdigit() else frame


def tally(raw_lines: Iterable[str], leaves: dict[str, Counter] | None = None) -> Counter:
    """Samples per stage from py-spy's raw (folded) output: ``frame;frame;... count`` per line. With `leaves`,
    also the samples per innermost function of each stage (leaves[stage][function])."""
    counts: Counter = Counter()
    for line in raw_lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if stack and n.isdigit():
            frames = stack.split(";")
            stage = stage_of(frames)
            counts[stage] += int(n)
            if leaves is not None:
                leaves.setdefault(stage, Counter())[function_of(frames[-1])] += int(n)
    return counts


def py_spy() -> str:
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise ProfileError("py-spy not found: .venv/bin/pip install -r requirements-bench.txt")
    return found


def profile(server: Server, concurrency: int, seconds: int, workdir: Path, spy: str) -> dict[str, Any]:
    """One wrk run at `concurrency` with py-spy (the `spy` binary) on every worker; stage shares and the run's CPU
    per role."""
    workers = [p.pid for p in server.run.tree.processes() if worker_role(p) == "worker"]
    if not workers:
        raise ProfileError("no TorchServe worker process found")
    spies = {}
    for pid in workers:
        with open(workdir / f"py-spy-{pid}.err", "w") as err:
            spies[pid] = subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(seconds + 1),
                                           "--rate", str(SAMPLE_HZ), "--format", "raw", "--nonblocking",
                                           "--output", str(workdir / f"worker-{pid}.txt")],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    spy_cpu = 0.0
    try:
        trial = server.trial(concurrency, seconds)
    finally:
        for proc in spies.values():  # the profiler's own CPU, read before it is reaped: it shares the two cores
            spy_cpu += exit_cpu_seconds(proc)
    counts: Counter = Counter()
    leaves: dict[str, Counter] = {}
    for pid, proc in spies.items():
        out = workdir / f"worker-{pid}.txt"
        if proc.returncode != 0 or not out.exists():
            err = (workdir / f"py-spy-{pid}.err").read_text().strip().splitlines()
            raise ProfileError(f"py-spy could not sample worker {pid} (exit {proc.returncode}): "
                               f"{err[-1] if err else 'no output'}")
        counts += tally(out.read_text().splitlines(), leaves)
    total = sum(counts.values())
    if not total:
        raise ProfileError("py-spy took no samples: the workers were idle")
    return {"concurrency": concurrency, "seconds": seconds, "workers": len(workers), "samples": total,
            "stages": {stage: {"samples": counts.get(stage, 0), "share": counts.get(stage, 0) / total,
                               "top": [[name, n / total]
                                       for name, n in leaves.get(stage, Counter()).most_common(TOP_FRAMES)]}
                       for stage in stage_names()},
            "throughput": trial["throughput"], "p50_ms": trial["p50_ms"], "p99_ms": trial["p99_ms"],
            "errors": trial["errors"], "cpu": trial["cpu"], "loadgen_cpu_pct": trial["loadgen_cpu_pct"],
            "profiler_cpu_pct": 100.0 * spy_cpu / (seconds + 1),
            "mean_batch": (trial.get("split") or {}).get("mean_batch")}


def per_batch_us(run: dict[str, Any], cpu_pct: float) -> float:
    """CPU microseconds per batch that `cpu_pct` (100 = one core) of a run stands for; NaN without a mean batch."""
    batches_per_s = run["throughput"] / run["mean_batch"] if run.get("mean_batch") else 0.0
    return 1e4 * cpu_pct / batches_per_s if batches_per_s > 0 else float("nan")


def _stage_rows(run: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """{stage: (share of worker samples, CPU us per batch)} of a run."""
    worker_cpu = run["cpu"].get("worker", 0.0)
    return {stage: (s["share"], per_batch_us(run, s["share"] * worker_cpu)) for stage, s in run["stages"].items()}


def _run_line(label: str, res: dict[str, Any]) -> str:
    run = res["run"]
    return (f"{label}: `{res['command']}` at {res['started']} ({res.get('label', '')}; c={run['concurrency']}, "
            f"{run['seconds']} s; load average {res['load']['start']} at start, {res['load'].get('end', '?')} at end): "
            f"{run['throughput']:.0f} req/s, p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, "
            f"{run['errors']} errors, mean batch {run['mean_batch'] or float('nan'):.1f}, "
            f"{run['samples']} samples.")


def comparison(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Markdown table: share of worker samples and CPU us per batch of each stage, before and after, with the
    worker's and the Java frontend's CPU per batch."""
    rows_before, rows_after = _stage_rows(before["run"]), _stage_rows(after["run"])
    names = [*rows_after, *(n for n in rows_before if n not in rows_after)]
    nan = (float("nan"), float("nan"))

    def cells(row: tuple[float, float]) -> str:
        share, us = row
        return f"{share:.1%} | {us:.0f}" if share == share else "- | -"

    lines = ["| per batch | before: share of worker samples | before: CPU us | after: share | after: CPU us |",
             "|---|---|---|---|---|"]
    for name in names:
        b, a = rows_before.get(name, nan), rows_after.get(name, nan)
        if (b[0] == b[0] and b[0] > 0) or (a[0] == a[0] and a[0] > 0):
            lines.append(f"| {name} | {cells(b)} | {cells(a)} |")
    for role, label in (("worker", "**worker, all stages**"), ("frontend (java)", "**TorchServe frontend (Java), "
                                                                                  "IPC and HTTP included**")):
        us_b = per_batch_us(before["run"], before["run"]["cpu"].get(role, 0.0))
        us_a = per_batch_us(after["run"], after["run"]["cpu"].get(role, 0.0))
        lines.append(f"| {label} | | {us_b:.0f} | | {us_a:.0f} |")
    return lines


def render(result: dict[str, Any]) -> str:
    run = result["run"]
    cpu = run["cpu"]
    worker_cpu = cpu.get("worker", 0.0)
    lines = [
        "# Where a TorchServe worker's time goes", "",
        f"`{result['command']}`; {result['data']['description']}; shipped configuration ({result['label']}); "
        f"c={run['concurrency']}, {run['seconds']} s after a warm-up of {result['warmup']['seconds']} s; "
        f"started {result['started']}; "
        f"load average {result['load']['start']} at start, {result['load']['end']} at end.", "",
        f"Served {run['throughput']:.0f} req/s, p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, "
        f"{run['errors']} errors, mean batch {run['mean_batch'] or float('nan'):.1f}.", "",
        f"CPU over the run (100% = one core; {result['machine']['logical_cores']} cores):", "",
        "| process | CPU | CPU us per batch |", "|---|---|---|",
        *(f"| {role} | {pct:.0f}% | {per_batch_us(run, pct):.0f} |" for role, pct in sorted(cpu.items())
          if role != "total"),
        f"| wrk (load generator, same machine) | {run['loadgen_cpu_pct']:.0f}% | |",
        f"| py-spy (the profiler, same machine) | {run['profiler_cpu_pct']:.0f}% | |",
        f"| all of the above | {cpu['total'] + run['loadgen_cpu_pct'] + run['profiler_cpu_pct']:.0f}% | |", "",
        f"Inside the workers ({run['samples']} py-spy samples at {SAMPLE_HZ} Hz over {run['workers']} workers; "
        "share of the samples in which a worker was running Python or native code, that share of the "
        "workers' measured CPU, and of the workers' CPU per batch (CPU / (req/s / mean batch))):", "",
        "| stage | share of worker samples | of one core | CPU us per batch |", "|---|---|---|---|",
        *(f"| {stage} | {s['share']:.1%} | {s['share'] * worker_cpu:.0f}% | "
          f"{per_batch_us(run, s['share'] * worker_cpu):.0f} |"
          for stage, s in run["stages"].items() if s["samples"]),
        "",
    ]
    baseline = result.get("baseline")
    if baseline:
        lines += ["## Before and after", "",
                  "The same profile of the handler before the change (`before`) and of the working tree (`after`), "
                  "one after the other on the same machine. Shares of the worker samples compare across runs on "
                  "a shared machine; CPU us per batch follow the machine's speed at the time.", "",
                  "- " + _run_line("before", baseline), "- " + _run_line("after", result), "",
                  *comparison(baseline, result), ""]
    tops = [(stage, s["top"]) for stage, s in run["stages"].items() if s["samples"] and s.get("top")]
    if tops:
        lines += ["## What each stage was running", "",
                  "Innermost functions of each stage's samples (share of all worker samples):", ""]
        lines += [f"- {stage}: " + "; ".join(f"`{name}` {share:.1%}" for name, share in top[:3])
                  for stage, top in tops]
        lines.append("")
    return "\n".join(lines)


def read_baseline(path: Path) -> dict[str, Any]:
    """What the comparison needs from an earlier profile's summary or raw record."""
    earlier = json.loads(Path(path).read_text())
    try:
        return {key: earlier[key] for key in ("command", "started", "load", "label", "run")}
    except (KeyError, TypeError):
        raise ValueError(f"{path}: not a worker-profile record") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench profile-worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS, help="artifacts to serve (read only)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=int, default=12, help="length of the profiled run")
    p.add_argument("--warmup-min", type=float, default=WARMUP_MIN_S, help="seconds of c=16 warm-up at least (the JVM's)")
    p.add_argument("--request-images", type=int, default=256)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--baseline", type=Path, default=None,
                   help="an earlier worker-profile.summary.json (or raw record): rendered beside this run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m bench profile-worker " + " ".join(argv if argv is not None else sys.argv[1:])
    result: dict[str, Any] = {"schema_version": 1, "command": command.strip(),
                              "started": datetime.now(UTC).isoformat(timespec="seconds"),
                              "machine": env.machine(), "versions": env.versions(), "load": {"start": uptime()}}
    cfg = shipped_config()
    try:
        if args.baseline is not None:
            result["baseline"] = read_baseline(args.baseline)
        spy = py_spy()  # before any server starts
        with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
            data = serving_data(args.artifacts, cache_root() / "bench", True, args.request_images, 10, print)
            result["data"] = data.summary()
            with TorchServeRun(cfg, data.artifacts, Path(tmp)) as run:
                server = Server(run, data.images)
                try:
                    result["warmup"] = server.warm(WARMUP_WINDOW_S, args.warmup_min, max(60.0, args.warmup_min),
                                                   WARMUP_STEADY)
                    result["run"] = profile(server, args.concurrency, args.seconds, Path(tmp), spy)
                finally:
                    server.script.remove()
    except (ProfileError, ServerError, ValueError, OSError, RuntimeError, psutil.Error) as exc:
        print(f"bench.profile_worker: error: {exc}", file=sys.stderr)
        return 1
    result["label"] = cfg.label
    result["load"]["end"] = uptime()
    args.out.mkdir(parents=True, exist_ok=True)
    output.write(args.out, "worker-profile", result, render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
