"""python -m bench.client_batch: images/s of python -m client predict over a folder, by --batch-size.

Starts a private TorchServe (the project's config, the shipped model-config.yaml) serving --artifacts, writes --images
MNIST test digits as PNGs under DIR/<label>/, and times the whole command (process start to exit) for each batch size,
--repeats times in turn, at --concurrency requests in flight. Prints one line per run and a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from settings import REPO


def write_images(root: Path, count: int) -> int:
    """`count` test digits of the bundled sample as users send them (dark on white PNG), under root/<label>/."""
    from serving.samples import user_digit_png
    from training.steps import prepare_data

    data = prepare_data("mnist-sample")
    if count > len(data.test_images):
        raise SystemExit(f"--images {count}: the sample has {len(data.test_images)} test images")
    for i in range(count):
        folder = root / str(int(data.test_labels[i]))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.png").write_bytes(user_digit_png(data.test_images[i]))
    return count


def time_predict(folder: Path, url: str, key_file: Path, batch_size: int, concurrency: int, out: Path) -> float:
    """Seconds of one `python -m client predict` run over `folder` (exit 0 expected)."""
    command = [sys.executable, "-m", "client", "predict", str(folder), "--url", url, "--key-file", str(key_file),
               "--batch-size", str(batch_size), "--concurrency", str(concurrency), "--no-progress", "--out", str(out)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"batch size {batch_size}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client_batch", description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts", help="trained artifacts to serve")
    parser.add_argument("--images", type=int, default=1000, help="images to classify per run")
    parser.add_argument("--batch-sizes", default="1,16,64", help="comma-separated --batch-size values")
    parser.add_argument("--concurrency", type=int, default=4, help="the client's --concurrency")
    parser.add_argument("--repeats", type=int, default=3, help="runs per batch size, interleaved")
    args = parser.parse_args(argv)
    from serving.archive import build_mar
    from serving.server import private_instance, start, stop

    sizes = [int(size) for size in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="client-batch-") as tmp:
        work = Path(tmp)
        count = write_images(work / "images", args.images)
        (work / "store").mkdir()
        build_mar(args.artifacts, work / "store")
        instance = private_instance(work / "ts")
        try:
            start(instance, work / "store", timeout=120)
            url = instance.endpoints.inference
            time_predict(work / "images", url, instance.key_file, 64, args.concurrency, work / "warm.jsonl")
            load = [round(v, 2) for v in os.getloadavg()]
            runs: dict[int, list[float]] = {size: [] for size in sizes}
            for _ in range(args.repeats):
                for size in sizes:
                    seconds = time_predict(work / "images", url, instance.key_file, size, args.concurrency,
                                           work / f"rows-{size}.jsonl")
                    runs[size].append(seconds)
                    print(json.dumps({"batch_size": size, "seconds": round(seconds, 3),
                                      "images_per_s": round(count / seconds, 1)}), flush=True)
            load_after = [round(v, 2) for v in os.getloadavg()]
        finally:
            stop(instance)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n{count} images, concurrency {args.concurrency}, {when}, load average {load} before, {load_after} after\n")
    print("| --batch-size | median s | images/s |\n|---|---|---|")
    for size in sizes:
        median = statistics.median(runs[size])
        print(f"| {size} | {median:.2f} | {count / median:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
