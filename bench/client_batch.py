"""python -m bench client-batch: images/s of `python -m client predict` / `embed` over a folder, end to end, against
the in-process ceiling measured in the same sitting.

Starts a private TorchServe (the project's config, the shipped model-config.yaml) serving --artifacts and writes
--images test digits of the bundled sample (cycled when more are asked for) as PNGs under DIR/<label>/, as users
send them. Then, in each of --repeats rounds, one after the other on the same files:

- the in-process ceiling (:mod:`bench.ceiling`: 2 processes x 1 torch thread, the server's budget, at batch 8 and 64)
  and its CPU cost per image (one process, one thread, every file once at batch 64),
- batched requests without the client: every file once in KServe v1 bodies of B images (base64 PNGs) encoded
  beforehand, posted --concurrency at a time: what the server does with the client's requests alone,
- the whole client command per --commands and --batch-sizes (process start to exit, the output file written) and
  a run over one file (the fixed cost: start-up, one request, exit),

with the CPU seconds of the client, TorchServe's frontend (Java) and its workers for each. Before the first round
every file goes through the server once per batch size and once through the client (warm-up, not counted). A figure's share of the
ceiling is taken against the ceiling of its own round. The CPU share (in-process CPU per image over client +
frontend + workers CPU per image) is what the run would reach if the machine had nothing else to do; it is the
steadier figure on a shared machine. Writes client-batch.md, client-batch.summary.json and raw/client-batch.json
into --out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Sequence

from settings import REPO

NAME = "client-batch"
#: The bulk target: end to end at least this share of the in-process ceiling.
TARGET_SHARE = 0.8
CEILING_BATCHES = (8, 64)
COST_BATCH = 64


def write_images(root: Path, count: int) -> int:
    """`count` test digits of the bundled sample as users send them (dark on white PNG), under root/<label>/; the
    sample's 1,000 test digits are used in turn when more are asked for (each file its own name)."""
    from serving.samples import user_digit_png
    from training.steps import prepare_data

    data = prepare_data("mnist-sample")
    encoded: dict[int, bytes] = {}
    for i in range(count):
        j = i % len(data.test_images)
        if j not in encoded:
            encoded[j] = user_digit_png(data.test_images[j])
        folder = root / str(int(data.test_labels[j]))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.png").write_bytes(encoded[j])
    return count


def v1_bodies(images: Sequence[bytes], batch: int) -> list[bytes]:
    """KServe v1 request bodies of `batch` images each, as the client sends them: enough bodies to hold every image
    once (at least one), the images taken in turn, so a body is full even when there are fewer images than `batch`."""
    from client.kserve_codec import encode_v1

    if not images or batch < 1:
        raise ValueError("v1 bodies need images and a batch of at least 1")
    count = max(1, -(-len(images) // batch))
    return [json.dumps(encode_v1([images[(k * batch + j) % len(images)] for j in range(batch)])).encode()
            for k in range(count)]


def v1_script(path: str, bodies: Sequence[bytes], token: str | None) -> Any:
    """A wrk script (see :mod:`bench.loadgen`) posting `bodies` as ``application/json``, the type the handler reads
    a v1 body under."""
    from .loadgen import WrkScript

    return WrkScript.create(path, bodies, token, content_type="application/json")


def preencoded_run(url: str, token: str, bodies: Sequence[bytes], concurrency: int) -> dict[str, Any]:
    """Post every body once (v1, already encoded), `concurrency` at a time from threads with their own keep-alive
    connection: what the server does with the client's requests when sending them costs next to nothing. Seconds,
    the images answered and this process's CPU seconds over the run (it does nothing else meanwhile)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import requests

    local = threading.local()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}

    def post(body: bytes) -> int:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        response = session.post(url, data=body, headers=headers, timeout=300)
        if response.status_code != 200:
            raise SystemExit(f"batched request: HTTP {response.status_code}: {response.text[:200]}")
        return len(response.json()["predictions"])

    cpu, started = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answered = sum(pool.map(post, bodies))
    return {"seconds": time.perf_counter() - started, "images": answered, "cpu_s": time.process_time() - cpu}


def _cost_worker(artifacts: Path, images: Sequence[bytes], batch: int, conn: Connection) -> None:
    import faiss
    import torch

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    from handler.service import EmbeddingService

    service = EmbeddingService.from_dir(artifacts)
    service.answer(list(images[:8]))
    began = time.process_time()
    for i in range(0, len(images), batch):
        service.answer(list(images[i:i + batch]))
    conn.send((time.process_time() - began) / len(images))


def inprocess_cpu_ms(artifacts: Path, images: Sequence[bytes], batch: int = COST_BATCH) -> float:
    """CPU milliseconds per image of `EmbeddingService.answer` in a fresh one-thread process (load not counted)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_cost_worker, args=(artifacts, list(images), batch, child), daemon=True)
    proc.start()
    try:
        if not parent.poll(600):
            raise RuntimeError("the in-process cost worker did not answer")
        return 1e3 * parent.recv()
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


class ServerCpu:
    """CPU seconds of a TorchServe's frontend (the root process) and its workers (the rest of its tree)."""

    def __init__(self, pid: int) -> None:
        from .procs import ProcessTree

        self.pid = pid
        self.tree = ProcessTree(pid)

    def snapshot(self) -> dict[int, float]:
        return self.tree.cpu_snapshot()

    def since(self, before: dict[int, float]) -> dict[str, float]:
        after = self.snapshot()
        used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
        return {"frontend": used.get(self.pid, 0.0), "workers": sum(v for p, v in used.items() if p != self.pid)}


def run_client(command: str, inputs: Sequence[Path], url: str, key_file: Path, batch: int, concurrency: int,
               out_dir: Path) -> dict[str, Any]:
    """One `python -m client COMMAND` run, timed from process start to exit: seconds, the client's CPU seconds and
    the rows or vectors it wrote (exit 0 expected)."""
    from .loadgen import exit_cpu_seconds

    out = out_dir / ("rows.jsonl" if command == "predict" else "vectors.npy")
    argv = [sys.executable, "-m", "client", command, *map(str, inputs), "--url", url, "--key-file", str(key_file),
            "--batch-size", str(batch), "--concurrency", str(concurrency), "--no-progress", "--out", str(out)]
    log = out_dir / "client.log"
    with open(log, "w") as fh:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
        cpu = exit_cpu_seconds(proc)
        seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{command} --batch-size {batch}: exit {proc.returncode}: {log.read_text().strip()[-500:]}")
    if command == "predict":
        written = sum(1 for _ in out.open())
    else:
        import numpy as np

        written = int(np.load(out, allow_pickle=False).shape[0])
    return {"seconds": seconds, "client_cpu_s": cpu, "written": written}


def _summary(values: Sequence[float | None]) -> dict[str, Any]:
    from .stats import summarize

    return summarize(values)


def measure(args: argparse.Namespace, log: Any = print) -> dict[str, Any]:
    """Every round's figures and their medians (see the module's docstring)."""
    from serving.archive import build_mar
    from serving.server import private_instance, start, stop

    from . import ceiling, env

    sizes = [int(size) for size in args.batch_sizes.split(",")]
    commands = [c for c in args.commands.split(",") if c]
    result: dict[str, Any] = {
        "command": "python -m bench client-batch " + " ".join(args.argv), "started": _now(),
        "load_average": {"start": env.load_average()}, "machine": env.machine(),
        "settings": {"images": args.images, "batch_sizes": sizes, "commands": commands,
                     "concurrency": args.concurrency, "repeats": args.repeats, "ceiling_s": args.ceiling_seconds,
                     "artifacts": _shown(args.artifacts)},
    }
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="client-batch-") as tmp:
        work = Path(tmp)
        count = write_images(work / "images", args.images)
        files = sorted((work / "images").rglob("*.png"))
        distinct = [path.read_bytes() for path in files[:min(len(files), 1000)]]
        result["settings"]["mean_file_bytes"] = round(sum(map(len, distinct)) / len(distinct))
        (work / "store").mkdir()
        build_mar(args.artifacts, work / "store")
        instance = private_instance(work / "ts")
        try:
            start(instance, work / "store", timeout=180)
            url, key = instance.endpoints.inference, instance.keys()["inference"]
            pid = instance.pid()
            if pid is None:
                raise SystemExit("TorchServe is READY but its pid is unknown")
            server = ServerCpu(pid)
            path = f"/predictions/{instance.model_name}"
            (work / "out").mkdir()
            warm = [path.read_bytes() for path in files]
            for batch in sizes:  # the frontend's JIT: its CPU per image fell by half over the first few runs
                preencoded_run(url + path, key, [json.dumps(_encode(warm[i:i + batch])).encode()
                                                 for i in range(0, len(warm), batch)], args.concurrency)
            run_client("predict", [work / "images"], url, instance.key_file, 64, args.concurrency, work / "out")
            for number in range(args.repeats):
                log(f"round {number + 1} of {args.repeats}, load {env.load_average()}")
                rounds.append(_round(args, work, files, distinct, count, sizes, commands, server, url, key, path,
                                     instance.key_file, ceiling, log))
        finally:
            stop(instance)
    result["load_average"]["end"] = env.load_average()
    result["finished"] = _now()
    result["trials"] = rounds  # the raw record (raw/client-batch.json); the summary keeps the rows
    result["rows"] = summarize_rounds(rounds)
    return result


def _round(args: argparse.Namespace, work: Path, files: list[Path], distinct: list[bytes], count: int,
           sizes: list[int], commands: list[str], server: ServerCpu, url: str, key: str, path: str, key_file: Path,
           ceiling: Any, log: Any) -> dict[str, Any]:
    rows = ceiling.measure(args.artifacts, distinct, 2, 1, CEILING_BATCHES, 1, args.ceiling_seconds, log=log)
    best = max(rows, key=lambda r: r["images_per_s"]["median"])
    entry: dict[str, Any] = {"load": _load(), "ceiling": {"images_per_s": best["images_per_s"]["median"],
                                                        "batch": best["batch"], "layout": best["layout"],
                                                        "rows": {r["batch"]: r["images_per_s"]["median"] for r in rows}},
                             "inprocess_cpu_ms": inprocess_cpu_ms(args.artifacts, distinct), "runs": []}
    log(f"  in-process CPU {entry['inprocess_cpu_ms']:.3f} ms/image")
    everything = [path.read_bytes() for path in files]
    for batch in sizes:
        bodies = [json.dumps(_encode(everything[i:i + batch])).encode() for i in range(0, len(everything), batch)]
        before = server.snapshot()
        load = preencoded_run(url + path, key, bodies, args.concurrency)
        used = server.since(before)
        entry["runs"].append(_run("batched requests, no client", batch, load["images"] / load["seconds"],
                                  load["images"], used, load["cpu_s"], entry, seconds=load["seconds"]))
        for command in commands:
            before = server.snapshot()
            done = run_client(command, [work / "images"], url, key_file, batch, args.concurrency, work / "out")
            used = server.since(before)
            if done["written"] != count:
                raise SystemExit(f"{command} --batch-size {batch}: wrote {done['written']} of {count}")
            entry["runs"].append(_run(f"client {command}", batch, count / done["seconds"], count, used,
                                      done["client_cpu_s"], entry, seconds=done["seconds"]))
    one = run_client("predict", [files[0]], url, key_file, 1, 1, work / "out")
    entry["fixed_s"] = one["seconds"]
    entry["fixed_client_cpu_s"] = one["client_cpu_s"]
    log(f"  one-file run {one['seconds']:.2f} s (client CPU {one['client_cpu_s']:.2f} s)")
    return entry


def _encode(images: Sequence[bytes]) -> dict[str, Any]:
    from client.kserve_codec import encode_v1

    return encode_v1(images)


def _run(what: str, batch: int, images_per_s: float, images: float, used: dict[str, float], client_cpu_s: float,
         entry: dict[str, Any], **more: Any) -> dict[str, Any]:
    per = {key: 1e3 * value / images for key, value in
           {"client": client_cpu_s, "frontend": used["frontend"], "workers": used["workers"]}.items()}
    total = sum(per.values())
    run = {"what": what, "batch": batch, "images_per_s": images_per_s,
           "share": images_per_s / entry["ceiling"]["images_per_s"], "cpu_ms": per,
           "cpu_share": entry["inprocess_cpu_ms"] / total if total else None, **more}
    print(f"  {what:<32} batch {batch:<4d} {images_per_s:7.0f} images/s = {run['share']:4.0%} of the ceiling "
          f"({entry['ceiling']['images_per_s']:.0f}); CPU ms/image client {per['client']:.3f} frontend "
          f"{per['frontend']:.3f} workers {per['workers']:.3f}; CPU share {run['cpu_share'] or 0:.0%}", flush=True)
    return run


def summarize_rounds(rounds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (what, batch): the median, min and max over rounds of images/s, share of the ceiling, CPU per image and
    CPU share, in the order measured; first the ceiling's own row."""
    rows: list[dict[str, Any]] = [{
        "what": "in-process ceiling", "batch": None,
        "images_per_s": _summary([r["ceiling"]["images_per_s"] for r in rounds]),
        "cpu_ms": {"workers": _summary([r["inprocess_cpu_ms"] for r in rounds])},
        "fixed_s": _summary([r.get("fixed_s") for r in rounds]),
    }]
    keys = list(dict.fromkeys((run["what"], run["batch"]) for r in rounds for run in r["runs"]))
    for what, batch in keys:
        pairs = [(r, run) for r in rounds for run in r["runs"] if (run["what"], run["batch"]) == (what, batch)]
        runs = [run for _, run in pairs]
        rows.append({"what": what, "batch": batch,
                     "images_per_s": _summary([run["images_per_s"] for run in runs]),
                     "share": _summary([run["share"] for run in runs]),
                     "steady_share": _summary([_steady_share(r, run) for r, run in pairs]),
                     "cpu_ms": {part: _summary([run["cpu_ms"][part] for run in runs])
                                for part in ("client", "frontend", "workers")},
                     "cpu_share": _summary([run["cpu_share"] for run in runs])})
    return rows


def _steady_share(entry: dict[str, Any], run: dict[str, Any]) -> float | None:
    """A client run's share of the ceiling without its fixed cost (the one-file run's time: start-up, one request,
    exit), what a collection large enough to hide start-up would reach; None for rows without a client process."""
    fixed, seconds = entry.get("fixed_s"), run.get("seconds")
    if not run["what"].startswith("client") or fixed is None or seconds is None or seconds <= fixed:
        return None
    return run["images_per_s"] * seconds / (seconds - fixed) / entry["ceiling"]["images_per_s"]


def markdown(result: dict[str, Any]) -> str:
    """The report: settings, then one row per measured figure (median over rounds, min-max in parentheses)."""
    from .stats import fmt, median

    s, load = result["settings"], result["load_average"]
    ceiling_row, *rows = result["rows"]
    lines = [
        "# Batch client end to end against the in-process ceiling", "",
        f"`{result['command']}`, {result['started']} to {result['finished']}, load average (1/5/15 min) "
        f"{load['start']} at the start, {load['end']} at the end"
        + (" — **the machine was busy with other work: treat the figures as indicative**"
           if load["start"][0] >= 0.3 else "") + ".", "",
        f"- Machine: {result['machine'].get('cpu_model')}, {result['machine'].get('logical_cores')} logical cores.",
        f"- {s['images']:,} PNG files (dark on white, 84x84, mean {s.get('mean_file_bytes', 0):,} bytes) under "
        f"DIR/<label>/; artifacts `{s['artifacts']}`; TorchServe with the shipped configuration; --concurrency "
        f"{s['concurrency']}; {s['repeats']} rounds, each measuring every row below one after the other.",
        "- Ceiling: `EmbeddingService.answer` on the same files' bytes, 2 processes x 1 thread, best of batch "
        f"{' and '.join(map(str, CEILING_BATCHES))}, {s['ceiling_s']} s per round. Share = images/s over the "
        "ceiling of the same round.",
        "- CPU ms/image: client process, TorchServe frontend (Java) and workers over the run. CPU share = "
        "in-process CPU per image (one process, one thread, batch 64) over client + frontend + workers: the share "
        "the run would reach with the machine to itself. Share without the fixed cost: the client run's images over "
        "its time less the one-file run's, against the ceiling (what a collection large enough to hide start-up "
        "would reach).",
        "- Batched requests, no client: every file once, as KServe v1 bodies of B images (base64 PNGs, "
        f"application/json) encoded beforehand, posted to /predictions {s['concurrency']} at a time from threads "
        "(requests, keep-alive); client CPU = that loader's.",
        f"- Client rows: `python -m client predict|embed DIR --batch-size B --concurrency {s['concurrency']} "
        "--no-progress --out FILE`, process start to exit (JSONL, or .npy and its file list).", "",
        f"In-process ceiling: {fmt(ceiling_row['images_per_s'], 0)} images/s; in-process CPU "
        f"{fmt(ceiling_row['cpu_ms']['workers'], 3)} ms/image; a one-file predict run (start-up, one request, "
        f"exit) {fmt(ceiling_row['fixed_s'], 2)} s.", "",
        "| what | B | images/s | share of ceiling | share without the fixed cost | client CPU ms/img | frontend | "
        "workers | CPU share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cpu = row["cpu_ms"]
        lines.append(f"| {row['what']} | {row['batch']} | {fmt(row['images_per_s'], 0)} | {_pct(row['share'])} | "
                     f"{_pct(row.get('steady_share'))} | {fmt(cpu['client'], 3)} | {fmt(cpu['frontend'], 3)} | {fmt(cpu['workers'], 3)} | "
                     f"{_pct(row['cpu_share'])} |")
    client = [row for row in rows if row["what"].startswith("client") and median(row["share"]) is not None]
    if client:
        from client.__main__ import DEFAULT_BATCH_SIZE

        default = [row for row in client if row["batch"] == DEFAULT_BATCH_SIZE]
        best = max(client, key=lambda row: median(row["share"]))
        judged = default or [best]
        met = all(median(row["share"]) >= TARGET_SHARE for row in judged)
        shown = "; ".join(f"{row['what']} {_pct(row['share'])}" for row in judged)
        lines += ["", f"Target (end to end >= {TARGET_SHARE:.0%} of the ceiling), "
                      + (f"at the client's default --batch-size {DEFAULT_BATCH_SIZE}: " if default else "best row: ")
                      + f"{shown} — **{'met' if met else 'missed'}**"
                      + (f" (best row: {best['what']} B={best['batch']} at {_pct(best['share'])})" if default else "")
                      + (", on wall-clock shares this run cannot vouch for (below)" if _over(rows) else "") + "."]
    over = _over(rows)
    if over:
        lines += ["", f"{len(over)} row(s) reached more than 100% of their round's ceiling in some round: other work "
                      "slowed the ceiling's window more than the run's, so the wall-clock shares here are unreliable; "
                      "the CPU share does not depend on when each figure was taken."]
    return "\n".join(lines) + "\n"


def _over(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that reached more than the ceiling of their round in some round."""
    return [row for row in rows if (row.get("share") or {}).get("max") is not None and row["share"]["max"] > 1.0]


def _pct(summary: dict[str, Any] | None) -> str:
    if not summary or summary.get("median") is None:
        return "n/a"
    text = f"{100 * summary['median']:.0f}%"
    return text if summary["n"] < 2 else f"{text} ({100 * summary['min']:.0f}-{100 * summary['max']:.0f}%)"


def _shown(path: Path) -> str:
    """`path` relative to the repository when it is inside it (the committed record names no home folder)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench client-batch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts",
                        help="trained artifacts to serve (default: artifacts/)")
    parser.add_argument("--images", type=int, default=2000, help="files per run (default: 2000)")
    parser.add_argument("--batch-sizes", default="16,64,256", help="comma-separated B values (default: 16,64,256)")
    parser.add_argument("--commands", default="predict,embed",
                        help="client commands to time, comma-separated; '' for none (default: predict,embed)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (default: 4)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default: 3)")
    parser.add_argument("--ceiling-seconds", type=float, default=3.0, help="ceiling time per batch (default: 3)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results",
                        help="where client-batch.md and its summary go (default: bench/results)")
    args = parser.parse_args(argv)
    args.argv = argv
    from . import output

    result = measure(args)
    output.write(args.out, NAME, result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
