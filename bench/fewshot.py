"""Few-shot enrollment benchmark: `python -m bench fewshot [--out bench/results] [--seeds 0,1,2] [--work DIR]
[--data-source SOURCE]`.

Trains the default model (default config, 4,000 synthetic negatives as for the ten digits) on the digits 0-7
only of --data-source (the bundled MNIST sample by default; any `python -m training --data-source` source of the ten digits,
such as `download:mnist` or `idx:DIR` for the full MNIST), then enrolls 8 and 9 from --shots training images each
with `python -m training enroll` (training.enroll.enroll_artifacts), and reports, on that data's held-out split:
accuracy on 8 and 9 after enrollment, accuracy on 0-7 before and after, and the share of held-out 8s and 9s
answered `unknown` at the open-set operating point before (and after) enrollment. Writes fewshot.md and
fewshot.summary.json into --out (raw/fewshot.json: the full record). Base models are cached under --work (training takes minutes, enrollment seconds).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from settings import DEFAULT_DATA_SOURCE

from . import output

if TYPE_CHECKING:
    from training.data import Dataset

BASE_CLASSES = tuple(str(d) for d in range(8))
NEW_CLASSES = ("8", "9")
TARGET_NEW_ACCURACY = 0.90
TARGET_OLD_DROP = 0.005


def machine() -> dict[str, Any]:
    return {"load_average_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
            "platform": platform.platform(terse=True), "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}


@functools.lru_cache(maxsize=2)
def digits(source: str) -> "Dataset":
    """The ten-digit dataset `source` names (loaded once per process); refuses one without the classes 0-9."""
    from training.data import DataError, load_dataset

    ds = load_dataset(source)
    if sorted(ds.classes) != sorted(BASE_CLASSES + NEW_CLASSES):
        raise DataError(f"{source}: few-shot needs the ten digit classes 0-9, found {', '.join(ds.classes)}")
    return ds


def without(source: str, classes: tuple[str, ...]) -> "Dataset":
    """The dataset `source` restricted to `classes` (labels re-indexed in that order)."""
    from training.data import Dataset

    ds = digits(source)
    keep_names = list(classes)
    remap = {ds.classes.index(c): i for i, c in enumerate(keep_names)}

    def pick(images: np.ndarray, labels: np.ndarray,
             sources: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        mask = np.isin(labels, list(remap))
        new = np.array([remap[int(y)] for y in labels[mask]], dtype=np.int64)
        return images[mask], new, (None if sources is None else sources[mask])

    tr_x, tr_y, tr_s = pick(ds.train_images, ds.train_labels, ds.train_sources)
    te_x, te_y, _ = pick(ds.test_images, ds.test_labels)
    return Dataset(ds.name, tr_x, tr_y, te_x, te_y, tuple(keep_names), tr_s, ds.source_kind)


def train_base(out: Path, seed: int, epochs: int, log: Callable[[str], None] = print,
               negatives: int | None = None, source: str = DEFAULT_DATA_SOURCE) -> dict:
    """Train on digits 0-7 of `source` with the default config into `out` (atomically); return metadata."""
    import torch

    from training.build import staged_directory
    from training.steps import build_gallery, evaluate_and_finalize, prepare_data, train_and_export
    from training.train import DIGIT_NEGATIVES, TrainConfig

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    data = prepare_data(source, dataset=without(source, BASE_CLASSES))
    # resolve_negatives turns outlier exposure off for classes other than "0".."9"; these are still digits, so
    # keep the default digit model's 4,000 synthetic non-digits.
    config = replace(TrainConfig(seed=seed, epochs=epochs), negatives=DIGIT_NEGATIVES if negatives is None else negatives)
    with staged_directory(out) as staging:
        train_and_export(data, config, staging, log=log)
        build_gallery(data, staging, "auto", seed, log)
        metadata = evaluate_and_finalize(data, staging, plots=False, log=log)
    return metadata


def work_dir(root: Path | None, seed: int, epochs: int, negatives: int | None, source: str) -> Path:
    """Where a base model and its enrollments live: one directory per seed, epochs, negatives and data source."""
    suffix = ("" if negatives is None else f"-neg{negatives}") + (
        "" if source == DEFAULT_DATA_SOURCE else "-" + hashlib.sha256(source.encode()).hexdigest()[:10])
    return (root or Path("/tmp")) / f"fewshot-seed{seed}-e{epochs}{suffix}"


def cached_base_matches(base: Path, source: str) -> bool:
    """A cached base model is reused only when it was trained on what `source` holds now (name and split sizes):
    an idx:DIR whose files changed gets a new base model."""
    try:
        recorded = json.loads((base / "metadata.json").read_text())["dataset"]
    except (OSError, ValueError, KeyError):
        return False
    now = without(source, BASE_CLASSES)
    return (recorded.get("name"), recorded.get("train"), recorded.get("test")) == (
        now.name, len(now.train_labels), len(now.test_labels))


def seed_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench fewshot", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--work", type=Path, default=None,
                   help="base model cache root (default /tmp); each seed's base model lives in fewshot-seed<S>-e<E>")
    p.add_argument("--seeds", type=seed_list, default=[0], help="training seeds, comma-separated (default 0)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--shots", type=int, default=10)
    p.add_argument("--draws", type=int, default=5, help="independent draws of --shots images per new class")
    p.add_argument("--negatives", type=int, default=None, help="synthetic negatives (default 4,000, as for digits)")
    p.add_argument("--train-only", action="store_true", help="only train (or keep) the base models")
    p.add_argument("--data-source", default=DEFAULT_DATA_SOURCE,
                   help=f"ten-digit training data, as for python -m training (default {DEFAULT_DATA_SOURCE})")
    args = p.parse_args(argv)
    from training.data import DataError

    try:
        digits(args.data_source)
    except DataError as exc:
        print(f"bench.fewshot: error: {exc}", file=sys.stderr)
        return 1
    load_start = machine()
    runs = []
    for seed in args.seeds:
        work = work_dir(args.work, seed, args.epochs, args.negatives, args.data_source)
        base = work / "base"
        if not cached_base_matches(base, args.data_source):
            started = time.perf_counter()
            train_base(base, seed, args.epochs, log=lambda line: print(line, flush=True), negatives=args.negatives,
                       source=args.data_source)
            print(f"base model trained in {time.perf_counter() - started:.0f}s", flush=True)
        if not args.train_only:
            runs.append(run(base, work, seed, args.shots, machine(), args.draws, args.data_source))
    if args.train_only:
        return 0
    result = {"command": "python -m bench fewshot " + " ".join(argv if argv is not None else sys.argv[1:]),
              "data": args.data_source, "seeds": runs, "spread": spread(runs), "machine": {"start": load_start, "end": machine()}}
    text = markdown(result)
    args.out.mkdir(parents=True, exist_ok=True)
    output.write(args.out, "fewshot", result, text)
    print(text)
    return 0


def spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Across seeds: min and max of each seed's figures (the mean over its draws)."""
    def span(values: list[float]) -> dict[str, float]:
        return {"min": float(min(values)), "max": float(max(values)), "mean": float(np.mean(values))}

    return {"new_accuracy": span([r["summary"]["new_accuracy"]["mean"] for r in runs]),
            "old_accuracy_before": span([r["before"]["old"]["accuracy"] for r in runs]),
            "old_accuracy_drop_max": span([r["before"]["old"]["accuracy"] - r["summary"]["old_accuracy"]["min"]
                                           for r in runs]),
            "new_flagged_before": span([r["before"]["new"]["unknown"] for r in runs]),
            "new_unknown_after": span([r["summary"]["new_unknown_after"]["mean"] for r in runs]),
            "ceiling_new_accuracy": span([r["after"][-1]["new"]["accuracy"] for r in runs])}


def markdown(result: dict[str, Any]) -> str:
    """fewshot.md: the summary over seeds, then each seed's report."""
    return "\n".join([report_head(result), *(report(r) for r in result["seeds"])])


def report_head(result: dict[str, Any]) -> str:
    """The across-seeds summary that opens fewshot.md."""
    s, m = result["spread"], result["machine"]
    seeds = ", ".join(str(r["seed"]) for r in result["seeds"])
    new_met = s["new_accuracy"]["min"] >= TARGET_NEW_ACCURACY
    old_met = s["old_accuracy_drop_max"]["max"] <= TARGET_OLD_DROP + 1e-12

    def pct(span: dict[str, float], digits: int = 1) -> str:
        return f"{span['mean']:.{digits}%} ({span['min']:.{digits}%}-{span['max']:.{digits}%})"

    return "\n".join([
        "# Few-shot enrollment", "",
        f"`{result['command']}`; seeds {seeds}; mean (min-max over seeds) of each seed's mean over its draws.", "",
        "| figure | value | target |", "|---|---|---|",
        f"| accuracy on held-out 8 and 9 after enrolling {result['seeds'][0]['shots']} of each | {pct(s['new_accuracy'])} | >= 90%: "
        f"{'met' if new_met else '**MISSED**'} |",
        f"| accuracy on held-out 0-7 before | {pct(s['old_accuracy_before'], 2)} | |",
        f"| largest drop on 0-7 after, any draw | {s['old_accuracy_drop_max']['max'] * 100:.2f} pt | <= 0.5 pt: "
        f"{'met' if old_met else '**MISSED**'} |",
        f"| held-out 8s and 9s flagged unknown BEFORE enrollment | {pct(s['new_flagged_before'])} | (report) |",
        f"| held-out 8s and 9s flagged unknown after | {pct(s['new_unknown_after'])} | |",
        f"| ceiling: accuracy on 8 and 9 with every training image of each enrolled "
        f"({', '.join(sorted({str(r['after'][-1]['shots']) for r in result['seeds']}))} per class) | "
        f"{pct(s['ceiling_new_accuracy'])} | |", "",
        f"Load average (1 min) {m['start']['load_average_1m']} at start, {m['end']['load_average_1m']} at end, "
        f"{m['start']['cpus']} CPUs shared with other jobs; ended {m['end']['time']}.", "", ""])


def write_new_images(root: Path, seed: int, shots: int, source: str = DEFAULT_DATA_SOURCE) -> dict[str, list[int]]:
    """`shots` training images of each new class, drawn with `seed`, as PNGs root/<label>/sample<i>.png."""
    from PIL import Image

    ds = digits(source)
    ids = ds.train_sources if ds.train_sources is not None else np.arange(len(ds.train_labels))
    rng = np.random.default_rng(seed)
    chosen = {}
    for label in NEW_CLASSES:
        positions = rng.choice(np.flatnonzero(ds.train_labels == ds.classes.index(label)), shots, replace=False)
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in positions:
            # Named by the recorded id where it is a dataset index (the gallery's source then says which image it
            # is); a folder source's ids are paths, so its images are named by position.
            name = ids[i] if np.issubdtype(ids.dtype, np.integer) else i
            Image.fromarray(ds.train_images[i]).save(root / label / f"sample{int(name)}.png")
        chosen[label] = sorted(ids[i].item() for i in positions)
    return chosen


@functools.lru_cache(maxsize=2)
def held_out_inputs(source: str) -> np.ndarray:
    """The held-out digits of `source` as model inputs, preprocessed once: every base and enrolled model answers
    the same images."""
    from handler.preprocessing import canvases_from_arrays, normalize

    return normalize(canvases_from_arrays(digits(source).test_images))


def served(artifacts: Path, source: str = DEFAULT_DATA_SOURCE) -> dict[str, Any]:
    """Answers of `artifacts` (EmbeddingService, as served) to the held-out digits of `source`, per group."""
    from handler.service import EmbeddingService

    ds = digits(source)
    service = EmbeddingService.from_dir(artifacts)
    answers = service.searcher.classify(service.embed(held_out_inputs(source)))
    truth = np.array([ds.classes[y] for y in ds.test_labels])
    pred = np.array([str(a["pred"]) for a in answers])
    unknown = np.array([a["unknown"] for a in answers], dtype=bool)
    out = {}
    for group, classes in (("old", BASE_CLASSES), ("new", NEW_CLASSES)):
        mask = np.isin(truth, classes)
        out[group] = {"n": int(mask.sum()), "accuracy": float(np.mean(pred[mask] == truth[mask])),
                      "unknown": float(np.mean(unknown[mask])),
                      "correct_and_known": float(np.mean((pred[mask] == truth[mask]) & ~unknown[mask]))}
    out["threshold"] = service.searcher.threshold
    out["gallery"] = int(service.searcher.index.ntotal)
    return out


def enroll_and_measure(base: Path, work: Path, name: str, draw: int, shots: int, holdout: float,
                       before: dict[str, Any], source: str = DEFAULT_DATA_SOURCE) -> dict[str, Any]:
    """Enroll `shots` images of 8 and 9 (drawn with `draw`) into a copy of `base`; the served figures after."""
    import shutil

    from training.enroll import enroll_artifacts

    new_root = work / f"new-{name}"
    shutil.rmtree(new_root, ignore_errors=True)
    chosen = write_new_images(new_root, draw, shots, source)
    out = work / f"enrolled-{name}"
    started = time.perf_counter()
    meta = enroll_artifacts(base, f"folder:{new_root}", out, new_only=True, holdout=holdout, calibration_data=source,
                            log=lambda _: None)
    after = served(out, source)
    after.update(name=name, draw=draw, shots=shots, holdout=holdout, enroll_seconds=round(time.perf_counter() - started, 2),
                 enrolled=meta["enrollment"][-1]["added"], calibration_n=meta["open_set"]["calibration"]["n"],
                 new_images=chosen)
    after["met"] = {"new_accuracy": after["new"]["accuracy"] >= TARGET_NEW_ACCURACY,
                    "old_within": before["old"]["accuracy"] - after["old"]["accuracy"] <= TARGET_OLD_DROP + 1e-12}
    return after


def run(base: Path, work: Path, seed: int, shots: int, load_start: dict[str, Any], draws: int = 5,
        source: str = DEFAULT_DATA_SOURCE) -> dict[str, Any]:
    """Before, then after enrolling: `draws` independent draws of `shots` images per class (all in the gallery),
    the first draw again with 20% held out for calibration, and, for reference, every training 8 and 9."""
    base_meta = json.loads((base / "metadata.json").read_text())
    before = served(base, source)
    runs = [enroll_and_measure(base, work, f"shots{shots}-draw{d}", d, shots, 0.0, before, source)
            for d in range(draws)]
    runs.append(enroll_and_measure(base, work, f"shots{shots}-draw0-holdout", 0, shots, 0.2, before, source))
    ds = digits(source)
    all_new = int(min(np.sum(ds.train_labels == ds.classes.index(c)) for c in NEW_CLASSES))
    runs.append(enroll_and_measure(base, work, f"all{all_new}", 0, all_new, 0.0, before, source))
    main_runs = runs[:draws]
    summary = {key: {"mean": float(np.mean(vals)), "min": float(np.min(vals)), "max": float(np.max(vals))}
               for key, vals in (("new_accuracy", [r["new"]["accuracy"] for r in main_runs]),
                                 ("old_accuracy", [r["old"]["accuracy"] for r in main_runs]),
                                 ("new_unknown_after", [r["new"]["unknown"] for r in main_runs]))}
    summary["met"] = {"new_accuracy": summary["new_accuracy"]["mean"] >= TARGET_NEW_ACCURACY,
                      "old_within": before["old"]["accuracy"] - summary["old_accuracy"]["min"] <= TARGET_OLD_DROP + 1e-12,
                      "new_flagged_before": before["new"]["unknown"]}
    return {
        "seed": seed, "shots": shots, "draws": draws, "base": str(base), "data": source,
        "held_out": {"old": before["old"]["n"], "new": before["new"]["n"]},
        "base_training": {"classes": list(BASE_CLASSES), "train": base_meta["dataset"]["train"],
                          "test": base_meta["dataset"]["test"], "config": base_meta["training"]["config"],
                          "train_seconds": base_meta["training"]["train_seconds"],
                          "open_set_score": base_meta["open_set"]["score"]},
        "before": before, "after": runs, "summary": summary,
        "targets": {"new_accuracy_min": TARGET_NEW_ACCURACY, "old_accuracy_max_drop": TARGET_OLD_DROP},
        "machine": {"start": load_start, "end": machine()},
    }


def report(result: dict) -> str:
    """fewshot.md: before, the per-draw table and the summary, targets marked met or MISSED."""
    before, summary, cfg = result["before"], result["summary"], result["base_training"]["config"]
    lines = [
        f"## Seed {result['seed']}", "",
        f"Base model: default config ({cfg['epochs']} epochs, {cfg['negatives']} synthetic negatives, seed "
        f"{result['seed']}) trained on the digits 0-7 only of `{result.get('data', DEFAULT_DATA_SOURCE)}` "
        f"({result['base_training']['train']} "
        f"images, {result['base_training']['train_seconds']:.0f} s); open-set score "
        f"{result['base_training']['open_set_score']}. Then 8 and 9 enrolled with `python -m training enroll --new-only` "
        f"from {result['shots']} training images each, {result['draws']} independent draws. Held-out: the data's "
        f"{before['old']['n'] + before['new']['n']:,} test digits ({before['old']['n']:,} of 0-7, "
        f"{before['new']['n']:,} of 8 and 9), answered by handler.service.EmbeddingService as served. "
        "Accuracy is the k-NN answer; `unknown` is the open-set flag at the recorded threshold.", "",
        f"**Before** enrollment: accuracy on 0-7 {before['old']['accuracy']:.2%} ({before['old']['unknown']:.2%} of them "
        f"flagged unknown); held-out 8s and 9s flagged `unknown` at the operating point: "
        f"**{before['new']['unknown']:.1%}** (threshold {before['threshold']:.4f}; the rest are answered as one of 0-7).",
        "",
        f"**After** ({result['draws']} draws of {result['shots']}): accuracy on 8 and 9 "
        f"**{summary['new_accuracy']['mean']:.1%}** (range {summary['new_accuracy']['min']:.1%}-"
        f"{summary['new_accuracy']['max']:.1%}; target >= 90%: "
        f"{'met' if summary['met']['new_accuracy'] else '**MISSED**'}); accuracy on 0-7 "
        f"{before['old']['accuracy']:.2%} -> {summary['old_accuracy']['min']:.2%}-{summary['old_accuracy']['max']:.2%} "
        f"(target within 0.5 pt: {'met' if summary['met']['old_within'] else '**MISSED**'}).", "",
        "| run | enrolled per class | calibration set | accuracy 8, 9 | accuracy 0-7 (before " + f"{before['old']['accuracy']:.2%})"
        " | 8, 9 flagged unknown | 0-7 flagged unknown | threshold | enroll time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["after"]:
        enrolled = ", ".join(f"{k}: {v}" for k, v in r["enrolled"].items())
        lines.append(
            f"| {r['name']} | {enrolled} | {r['calibration_n']} held-out | {r['new']['accuracy']:.1%} "
            f"| {r['old']['accuracy']:.2%} | {r['new']['unknown']:.1%} | {r['old']['unknown']:.2%} "
            f"| {r['threshold']:.4f} | {r['enroll_seconds']:.1f} s |")
    m = result["machine"]
    lines += ["", "The last row enrolls every training 8 and 9 of the data: the ceiling of this embedding for classes it "
              "was not trained on, whatever the number of shots.", "",
              f"Machine: {m['start']['cpus']} CPUs shared with other jobs, load average (1 min) "
              f"{m['start']['load_average_1m']} at start, {m['end']['load_average_1m']} at end ({m['end']['time']}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
