"""`python -m bench ab --a DIR --b DIR --name NAME [--rounds 2] [--out bench/results]`: two artifact directories
(say the float and the int8 model) served the same way, measured alternately.

Each round runs `python -m bench run --sections ceiling,rest --configs shipped` on both, in separate processes, A first
in even rounds and B first in odd ones (A B B A ...), so a slow stretch of the shared machine, or load that builds
up over the run, hits both sides alike. Per figure it reports each side's median
over rounds and the median of the per-round ratios B / A. Writes ab-NAME.md and ab-NAME.summary.json into --out (raw/ab-NAME.json: the full record); each
bench run's own results stay under --work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from . import output
from .env import cpu_model, load_average
from .stats import median

CONCURRENCIES = (1, 16, 64)


def run_bench(artifacts: Path, out: Path, trials: int, log=print) -> dict[str, Any]:
    """One `python -m bench run` run (ceiling and REST, shipped configuration, no peers); its full record."""
    cmd = [sys.executable, "-m", "bench", "run", "--artifacts", str(artifacts), "--out", str(out), "--sections",
           "ceiling,rest", "--configs", "shipped", "--peers", "", "--concurrency",
           ",".join(map(str, CONCURRENCIES)), "--trials", str(trials)]
    log(f"[{datetime.now(UTC):%H:%M:%S}] {' '.join(cmd[1:])}")
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ABError(f"python -m bench on {artifacts} exited with {done.returncode}: {last}")
    return json.loads(output.raw_path(out, "results").read_text())


class ABError(Exception):
    """A side could not be measured (the message names it and why)."""


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The compared figures of one bench run, by name; ABError when the server did not serve them."""
    served = result.get("torchserve") or [{}]
    if served[0].get("error") or not served[0].get("runs"):
        raise ABError(f"{result['data']['artifacts']}: TorchServe did not serve it: {served[0].get('error', 'no runs')}")
    out: dict[str, float] = {}
    for row in result["ceiling"]["rows"]:
        if row["layout"] == "2x1" and row["batch"] in (8, 128):
            out[f"ceiling 2x1 batch {row['batch']}, images/s"] = row["images_per_s"]["median"]
    runs = {run["concurrency"]: run for run in served[0]["runs"]}
    for c in CONCURRENCIES:
        if c not in runs or median(runs[c]["throughput"]) is None:
            raise ABError(f"{result['data']['artifacts']}: no REST figure at c={c}")
        out[f"REST c={c}, req/s"] = median(runs[c]["throughput"])
        out[f"REST c={c}, p50 ms"] = median(runs[c]["p50_ms"])
        out[f"REST c={c}, p99 ms"] = median(runs[c]["p99_ms"])
    split = [trial["split"] for trial in runs[16]["trials"] if trial.get("split")]
    if split:
        out["c=16 embed ms per batch"] = float(np.median([s["embed"] for s in split]))
        out["c=16 preprocess ms per batch"] = float(np.median([s["preprocess"] for s in split]))
    out["accuracy (held-out, as served)"] = result["data"]["accuracy"]
    return out


def compare(rounds: list[tuple[dict[str, float], dict[str, float]]]) -> list[dict[str, Any]]:
    rows = []
    for name in rounds[0][0]:
        a = [r[0][name] for r in rounds]
        b = [r[1][name] for r in rounds]
        ratios = [y / x for x, y in zip(a, b) if x and y is not None]
        rows.append({"figure": name, "a": float(np.median(a)), "b": float(np.median(b)), "a_values": a, "b_values": b,
                     "ratio_b_over_a": float(np.median(ratios)) if ratios else None})
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [f"# A/B: {result['name']}", "",
             f"`{result['command']}` on {result['cpu']}, {result['started']} to {result['finished']}; load average "
             f"(1 min) {result['load_start']} at start, {result['load_end']} at end.", "",
             f"A = `{result['a']}`, B = `{result['b']}`. {result['rounds']} rounds, A first in even rounds and B first in "
             "odd ones; every bench run is "
             f"`python -m bench run --sections ceiling,rest --configs shipped --peers '' --concurrency 1,16,64 --trials "
             f"{result['trials']}` (median of its trials). Below: median over rounds (per-round values in brackets) "
             "and the median per-round ratio B / A.", "",
             "| figure | A | B | B / A |", "|---|---|---|---|"]
    for row in result["rows"]:
        digits = 4 if row["figure"].startswith("accuracy") else 2 if " ms" in row["figure"] else 0

        def cell(value: float, values: list[float]) -> str:
            return f"{value:.{digits}f} [{', '.join(f'{v:.{digits}f}' for v in values)}]"
        ratio = "" if row["ratio_b_over_a"] is None else f"{row['ratio_b_over_a']:.2f}"
        lines.append(f"| {row['figure']} | {cell(row['a'], row['a_values'])} | {cell(row['b'], row['b_values'])} "
                     f"| {ratio} |")
    return "\n".join(lines) + "\n"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench ab", description=__doc__.splitlines()[0])
    p.add_argument("--a", type=Path, required=True, help="artifact directory A (the baseline)")
    p.add_argument("--b", type=Path, required=True, help="artifact directory B")
    p.add_argument("--name", required=True, help="names the output files: ab-NAME.md, ab-NAME.json")
    p.add_argument("--rounds", type=_positive, default=2)
    p.add_argument("--trials", type=_positive, default=3)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--work", type=Path, default=Path("local_outputs/bench-ab"))
    args = p.parse_args(argv)
    for side in (args.a, args.b):
        if not (side / "metadata.json").is_file():
            print(f"bench.ab: error: {side} is not an artifact directory (no metadata.json)", file=sys.stderr)
            return 1
    started, load_start = datetime.now(UTC), load_average()[0]
    rounds = []
    t0 = time.perf_counter()
    try:
        for i in range(args.rounds):
            order = (("a", args.a), ("b", args.b)) if i % 2 == 0 else (("b", args.b), ("a", args.a))
            measured = {tag: figures(run_bench(side, args.work / f"round{i}-{tag}", args.trials)) for tag, side in order}
            rounds.append((measured["a"], measured["b"]))
    except (ABError, OSError, ValueError) as exc:
        print(f"bench.ab: error: {exc}", file=sys.stderr)
        return 1
    result = {"name": args.name, "a": str(args.a), "b": str(args.b), "rounds": args.rounds, "trials": args.trials,
              "command": "python -m bench ab " + " ".join(sys.argv[1:] if argv is None else argv),
              "cpu": f"{cpu_model()}, {os.cpu_count()} logical cores", "started": started.isoformat(timespec="seconds"),
              "finished": datetime.now(UTC).isoformat(timespec="seconds"), "seconds": round(time.perf_counter() - t0),
              "load_start": load_start, "load_end": load_average()[0], "rows": compare(rounds)}
    args.out.mkdir(parents=True, exist_ok=True)
    output.write(args.out, f"ab-{args.name}", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
