"""Few-shot enrollment benchmark: `python -m bench fewshot [--data-source SOURCE] [--new-classes A+B[,C+D...]]
[--seeds 0,1,2] [--epochs E] [--precision fp32|bf16] [--threads N] [--train-per-class N] [--shots 10] [--draws 5]
[--no-ceiling] [--work DIR] [--out bench/results]`.

For each group of held-out classes (--new-classes; default from the data, BENCHMARKS) and each seed: trains a
model (default config, --epochs) on the other classes of --data-source only, then enrolls the held-out
classes from --shots training images each with `python -m training enroll` (training.enroll.enroll_artifacts),
and reports, on that data's held-out split: accuracy on the new classes after enrollment, accuracy on the trained
classes before and after, and the share of held-out new-class images answered `unknown` at the open-set operating
point before (and after) enrollment.

- Digits (the bundled MNIST sample by default, or any ten-digit source such as `download:mnist` or `idx:DIR`):
  trained on 0-7, 8 and 9 enrolled, the shipped model's synthetic non-digits in training
  (training.config.DIGIT_NEGATIVES) and epochs (TrainConfig); writes fewshot.md.
- Fashion-MNIST (`idx:/usr/share/datasets/fashion-mnist`, `full-frame` preprocessing): three pairs held out in
  turn, one easy, one medium, one hard; no synthetic negatives (resolve_negatives keeps them for digits only);
  writes fewshot-fashion.md. A full-size sweep does not fit a shared 2-core machine in an hour:
  --train-per-class trains the network on fewer images while the gallery keeps them all.

Writes NAME.md and NAME.summary.json into --out (raw/NAME.json: the full record) after every (seed, pair) run, so
an interrupted sweep leaves its finished runs, marked partial. Base models are cached under --work (training takes
minutes, enrollment seconds).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from cli_common import EXIT_USAGE, Parser, UsageError, fail, output_dir, positive_int
from settings import DEFAULT_DATA_SOURCE, DEFAULT_THREADS, env_threads
from training.config import PRECISION, TrainConfig

from . import output

if TYPE_CHECKING:
    from handler.preprocessing import Profile
    from training.data import Dataset

PROG = "python -m bench fewshot"
DIGIT_CLASSES = tuple(str(d) for d in range(10))
#: Fashion-MNIST's classes in label order (training.data.idx.FASHION_CLASSES; repeated so that parsing a command
#: line imports no training code).
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
#: The digit benchmark's pair (kept as the work directory name without a class suffix).
DIGIT_PAIR = ("8", "9")
#: (classes trained on, classes held out and enrolled) of one experiment.
Split = tuple[tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True)
class Benchmark:
    """What the benchmark does for one kind of data: which classes it holds out, its targets, its report name."""

    kind: str
    title: str
    #: Groups of classes held out of training and enrolled, one experiment each, when --new-classes is not given.
    new_classes: tuple[tuple[str, ...], ...]
    #: Least accuracy on the new classes after enrollment (mean over draws) and largest drop on the trained ones.
    target_new_accuracy: float
    target_old_drop: float
    #: Results file stem in --out.
    name: str
    #: Train with the shipped digit model's synthetic non-digits (outlier exposure); only digits have them.
    synthetic_negatives: bool


BENCHMARKS = {
    "digits": Benchmark("digits", "Few-shot enrollment", (DIGIT_PAIR,), 0.90, 0.005, "fewshot", True),
    # Easy: trousers and bags look like nothing else. Medium: sandals and sneakers are footwear beside the ankle
    # boots that stay in training, and like each other. Hard: shirts and pullovers are tops like the T-shirts and
    # coats that stay in training; even fully trained, shirts are the least-recalled class (79%).
    "fashion-mnist": Benchmark("fashion-mnist", "Few-shot enrollment on Fashion-MNIST",
                               (("Trouser", "Bag"), ("Sandal", "Sneaker"), ("Shirt", "Pullover")),
                               0.85, 0.01, "fewshot-fashion", False),
}


class SelectionError(ValueError):
    """--new-classes does not fit the data; the message is one line."""


def benchmark_for(classes: tuple[str, ...] | list[str]) -> Benchmark | None:
    """The benchmark of data with these classes (digits 0-9 in any order, or Fashion-MNIST's), else None."""
    if sorted(classes) == list(DIGIT_CLASSES):
        return BENCHMARKS["digits"]
    if tuple(classes) == FASHION_CLASSES:
        return BENCHMARKS["fashion-mnist"]
    return None


def parse_new_classes(text: str) -> tuple[tuple[str, ...], ...]:
    """`A+B,C+D` -> (("A", "B"), ("C", "D")): comma-separated groups of `+`-joined class names (spaces around
    names are dropped, so `Ankle boot` keeps its inner space)."""
    groups = []
    for chunk in text.split(","):
        names = tuple(name.strip() for name in chunk.split("+"))
        if not chunk.strip() or any(not name for name in names):
            raise SelectionError(f"--new-classes {text!r}: expected class names joined by + and groups separated "
                                 "by commas, such as Trouser+Bag,Shirt+Pullover")
        groups.append(names)
    return tuple(groups)


def split_classes(classes: tuple[str, ...] | list[str], new: tuple[str, ...]) -> Split:
    """(trained classes in the data's order, new classes as given) for holding `new` out of data with `classes`;
    SelectionError when a name is not a class, repeats, cannot be a folder name (enroll reads labels from
    folder:DIR/<label>/), or fewer than two classes would be left to train on."""
    unknown = [name for name in new if name not in classes]
    if unknown:
        raise SelectionError(f"--new-classes: {unknown[0]!r} is not a class of the data; its classes are "
                             f"{', '.join(classes)}")
    if len(set(new)) != len(new):
        raise SelectionError(f"--new-classes: {'+'.join(new)} names a class twice")
    for name in new:
        if "/" in name or name in (".", ".."):
            raise SelectionError(f"--new-classes: {name!r} cannot be enrolled: training enroll reads labels from "
                                 "folder names, and this one cannot be a folder name")
    base = tuple(c for c in classes if c not in new)
    if len(base) < 2:
        raise SelectionError(f"--new-classes: holding out {'+'.join(new)} leaves {len(base)} class to train on, "
                             "at least 2 are needed")
    return base, new


def select(classes: tuple[str, ...] | list[str], text: str | None) -> tuple[Benchmark, list[Split]]:
    """The benchmark and its (trained, new) class splits: `text` (--new-classes) or the data's default groups."""
    bench = benchmark_for(classes)
    if text is None and bench is None:
        raise SelectionError(f"no default classes to hold out for data with the classes {', '.join(classes)}: "
                             "pass --new-classes A+B")
    groups = parse_new_classes(text) if text is not None else bench.new_classes
    if len(set(groups)) != len(groups):
        raise SelectionError("--new-classes: a group is given twice")
    if bench is None:  # other data: the digit targets, a report of its own
        bench = replace(BENCHMARKS["digits"], kind="other", title="Few-shot enrollment", new_classes=groups,
                        name="fewshot-other", synthetic_negatives=False)
    return bench, [split_classes(classes, group) for group in groups]


def class_list(names: tuple[str, ...] | list[str]) -> str:
    """`0-7` for consecutive digits, else the names joined (`Trouser and Bag`, `T-shirt/top, Pullover, ...`)."""
    if len(names) > 2 and all(n.isdigit() for n in names) and [int(n) for n in names] == list(
            range(int(names[0]), int(names[0]) + len(names))):
        return f"{names[0]}-{names[-1]}"
    return " and ".join(names) if len(names) <= 2 else ", ".join(names)


def slug(names: tuple[str, ...]) -> str:
    """A file-name-safe spelling of a class group: ("Ankle boot", "Bag") -> `ankle-boot+bag`."""
    return "+".join(re.sub(r"[^a-z0-9]+", "-", n.lower()).strip("-") or "x" for n in names)


def machine() -> dict[str, Any]:
    one, five, fifteen = os.getloadavg()
    return {"load_average_1m": round(one, 2), "load_average_5m": round(five, 2), "load_average_15m": round(fifteen, 2),
            "cpus": os.cpu_count(), "platform": platform.platform(terse=True),
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}


@functools.lru_cache(maxsize=2)
def dataset(source: str) -> "Dataset":
    """The dataset `source` names, raw (loaded once per process)."""
    from training.data import load_dataset

    return load_dataset(source)


def training_subset(labels: np.ndarray, per_class: int | None, seed: int = 0) -> np.ndarray:
    """Sorted positions of at most `per_class` items of each label (all with None), drawn with `seed`: the same
    items whichever training seed uses them."""
    if per_class is None:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    picked = [rng.choice(where, min(per_class, len(where)), replace=False)
              for where in (np.flatnonzero(labels == y) for y in np.unique(labels))]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


def without(source: str, classes: tuple[str, ...]) -> "Dataset":
    """The dataset `source` restricted to `classes` (labels re-indexed in that order)."""
    from training.data import Dataset

    ds = dataset(source)
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
               negatives: int | None = None, source: str = DEFAULT_DATA_SOURCE,
               base_classes: tuple[str, ...] = DIGIT_CLASSES[:8], synthetic_negatives: bool = True,
               precision: str = "fp32", per_class: int | None = None) -> dict:
    """Train on `base_classes` of `source` with the default config into `out` (atomically); return metadata.

    `negatives` None: the shipped digit model's synthetic non-digits when `synthetic_negatives`, else none.
    `per_class`: the network trains on that many training images of each class (training_subset) and the
    gallery still holds every training image of `base_classes`, as a full build's does."""
    from training.build import staged_directory
    from training.config import DIGIT_NEGATIVES, TrainConfig
    from training.data import Dataset
    from training.steps import build_gallery, evaluate_and_finalize, prepare_data, train_and_export

    data = prepare_data(source, dataset=without(source, base_classes))
    keep = training_subset(data.train_labels, per_class)
    subset = Dataset(data.name, data.train_images[keep], data.train_labels[keep], data.test_images, data.test_labels,
                     data.classes, None if data.train_sources is None else data.train_sources[keep], data.source_kind,
                     data.profile)
    # resolve_negatives turns outlier exposure off for classes other than "0".."9"; digits 0-7 are still digits,
    # so the digit benchmark asks for the default digit model's synthetic non-digits itself.
    if negatives is None:
        negatives = DIGIT_NEGATIVES if synthetic_negatives else 0
    config = replace(TrainConfig(seed=seed, epochs=epochs, precision=precision), negatives=negatives)
    with staged_directory(out) as staging:
        train_and_export(subset, config, staging, log=log)
        build_gallery(data, staging, "auto", seed, log)
        metadata = evaluate_and_finalize(data, staging, plots=False, log=log)
    return metadata


def work_dir(root: Path | None, seed: int, epochs: int, negatives: int | None, source: str,
             new: tuple[str, ...] = DIGIT_PAIR, precision: str = "fp32", per_class: int | None = None) -> Path:
    """Where a base model and its enrollments live: one directory per seed, epochs, negatives, precision, training
    images per class, data source and held-out classes."""
    suffix = ("" if negatives is None else f"-neg{negatives}") + ("" if precision == "fp32" else f"-{precision}") + (
        "" if per_class is None else f"-n{per_class}") + (
        "" if source == DEFAULT_DATA_SOURCE else "-" + hashlib.sha256(source.encode()).hexdigest()[:10]) + (
        "" if tuple(new) == DIGIT_PAIR else f"-new-{slug(new)}")
    return (root or Path("/tmp")) / f"fewshot-seed{seed}-e{epochs}{suffix}"


def cached_base_matches(base: Path, source: str, base_classes: tuple[str, ...] = DIGIT_CLASSES[:8]) -> bool:
    """A cached base model is reused only when it was trained on what `source` holds now (name, classes and split
    sizes): an idx:DIR whose files changed gets a new base model."""
    try:
        recorded = json.loads((base / "metadata.json").read_text())["dataset"]
    except (OSError, ValueError, KeyError):
        return False
    now = without(source, base_classes)
    return (recorded.get("name"), recorded.get("train"), recorded.get("test"),
            list(recorded.get("classes", base_classes))) == (
        now.name, len(now.train_labels), len(now.test_labels), list(base_classes))


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("expected at least one seed")
    return seeds


def parser() -> Parser:
    p = Parser(prog=PROG, description=__doc__)
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="where NAME.md and NAME.summary.json go")
    p.add_argument("--work", type=Path, default=None,
                   help="base model cache root (default /tmp); one directory per seed, recipe and held-out classes")
    p.add_argument("--data-source", default=DEFAULT_DATA_SOURCE,
                   help="training data, as for python -m training: ten digits, Fashion-MNIST, or any data with "
                        "--new-classes")
    p.add_argument("--new-classes", default=None, metavar="A+B[,C+D...]",
                   help="groups of classes held out of training and enrolled, one experiment each (default: 8+9 "
                        "for digits; Trouser+Bag,Sandal+Sneaker,Shirt+Pullover for Fashion-MNIST)")
    p.add_argument("--seeds", type=seed_list, default=[0], help="training seeds, comma-separated")
    p.add_argument("--epochs", type=positive_int, default=TrainConfig().epochs,
                   help="training epochs of each base model (default: the shipped training's, %(default)s)")
    p.add_argument("--precision", choices=PRECISION, default="fp32",
                   help="training forward pass (python -m training --precision)")
    p.add_argument("--threads", type=positive_int, default=env_threads(),
                   help=f"torch intra-op threads (default: $OMP_NUM_THREADS, else {DEFAULT_THREADS})")
    p.add_argument("--train-per-class", type=positive_int, default=None, metavar="N",
                   help="train the network on N training images of each class, the same ones for every run (default: "
                        "all); the gallery still holds every training image and the held-out split stays whole")
    p.add_argument("--shots", type=positive_int, default=10, help="training images enrolled per new class")
    p.add_argument("--draws", type=positive_int, default=5, help="independent draws of --shots images per new class")
    p.add_argument("--no-ceiling", action="store_true",
                   help="skip the reference enrollment of every training image of the new classes")
    p.add_argument("--negatives", type=int, default=None,
                   help="synthetic negatives (default 4,000 for digits, as the shipped model; 0 otherwise)")
    p.add_argument("--train-only", action="store_true", help="only train (or keep) the base models")
    p.add_argument("--resume", action="store_true",
                   help="keep the finished runs of the record already in --out when its data and recipe are these "
                        "(a sweep cut short goes on where it stopped)")
    return p


def carried_runs(prior: dict[str, Any] | None, data: str,
                 recipe: dict[str, Any]) -> dict[tuple[tuple[str, ...], int], dict[str, Any]]:
    """The finished runs of an earlier record, by (new classes, seed), when it measured the same data with the same
    recipe (its seeds aside); none otherwise."""
    if not prior or prior.get("data") != data:
        return {}

    def same(r: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in r.items() if key != "seeds"}

    if same(prior.get("recipe", {})) != same(recipe):
        return {}
    return {(tuple(g["new"]), int(r["seed"])): r for g in prior.get("groups", []) for r in g["seeds"]}


def prior_record(out: Path, name: str) -> dict[str, Any] | None:
    """The full record a previous command wrote into `out` (raw/NAME.json, else the summary), or None."""
    for path in (output.raw_path(out, name), output.summary_path(out, name)):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    from training.data import DataError

    try:
        for flag, path in (("--out", args.out), ("--work", args.work)):
            if path is not None:
                output_dir(path, flag)
    except UsageError as exc:
        return fail(PROG, exc, EXIT_USAGE)
    try:
        ds = dataset(args.data_source)
    except DataError as exc:
        return fail(PROG, exc)
    try:
        bench, splits = select(tuple(ds.classes), args.new_classes)
    except SelectionError as exc:
        return fail(PROG, exc, EXIT_USAGE)
    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "command": f"{PROG} " + " ".join(argv), "data": args.data_source, "dataset": ds.name, "kind": bench.kind,
        "title": bench.title,
        "recipe": {"epochs": args.epochs, "precision": args.precision, "threads": args.threads, "shots": args.shots,
                   "draws": args.draws, "ceiling": not args.no_ceiling, "seeds": args.seeds,
                   "train_per_class": args.train_per_class},
        "targets": {"new_accuracy_min": bench.target_new_accuracy, "old_accuracy_max_drop": bench.target_old_drop},
        "groups": [{"base": list(base), "new": list(new), "seeds": []} for base, new in splits],
        "planned_runs": len(splits) * len(args.seeds), "complete": False,
        "machine": {"start": machine()},
    }
    prior = prior_record(args.out, bench.name) if args.resume else None
    carried = carried_runs(prior, args.data_source, result["recipe"])
    if prior is not None:
        earlier = prior.get("wall_seconds", 0) + prior.get("resumed", {}).get("wall_seconds", 0)
        result["resumed"] = {"command": prior["command"], "started": prior["machine"]["start"]["time"],
                             "wall_seconds": earlier, "runs": 0}

    def publish() -> None:
        result["machine"]["end"] = machine()
        result["wall_seconds"] = round(time.perf_counter() - started, 1)
        result["complete"] = sum(len(g["seeds"]) for g in result["groups"]) == result["planned_runs"]
        args.out.mkdir(parents=True, exist_ok=True)
        write(args.out, bench.name, result)

    # Seed-major: a sweep cut short has finished every pair of its first seeds.
    for seed in args.seeds:
        for group, (base_classes, new) in zip(result["groups"], splits):
            if (new, seed) in carried and not args.train_only:
                group["seeds"].append(carried[(new, seed)])
                group["spread"] = spread(group["seeds"])
                result["resumed"]["runs"] += 1
                continue
            run_started = time.perf_counter()
            work = work_dir(args.work, seed, args.epochs, args.negatives, args.data_source, new, args.precision,
                            args.train_per_class)
            base = work / "base"
            cached = cached_base_matches(base, args.data_source, base_classes)
            if not cached:
                train_base(base, seed, args.epochs, log=lambda line: print(line, flush=True), negatives=args.negatives,
                           source=args.data_source, base_classes=base_classes,
                           synthetic_negatives=bench.synthetic_negatives, precision=args.precision,
                           per_class=args.train_per_class)
                print(f"base model without {'+'.join(new)}, seed {seed}: trained in "
                      f"{time.perf_counter() - run_started:.0f}s", flush=True)
            if args.train_only:
                continue
            record = run(base, work, seed, args.shots, machine(), args.draws, args.data_source, new, base_classes,
                         bench, ceiling=not args.no_ceiling, per_class=args.train_per_class)
            record.update(seconds=round(time.perf_counter() - run_started, 1), base_cached=cached)
            group["seeds"].append(record)
            group["spread"] = spread(group["seeds"])
            publish()
            print(f"{'+'.join(new)} seed {seed}: new {record['summary']['new_accuracy']['mean']:.1%}, old "
                  f"{record['before']['old']['accuracy']:.2%} -> {record['summary']['old_accuracy']['min']:.2%} "
                  f"({record['seconds']:.0f}s; {time.perf_counter() - started:.0f}s so far)", flush=True)
    if not args.train_only:
        publish()
        print(markdown(result))
    return 0


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    """The committed summary: output.compact of the record without the image ids of the every-image runs (all the
    training images of the new classes, thousands of ids each; raw/NAME.json keeps them)."""
    summary = output.compact(output.as_json(result))
    for group in groups_of(summary):
        for run_record in group["seeds"]:
            for entry in run_record["after"]:
                if entry["name"].startswith("all"):
                    entry.pop("new_images", None)
    return summary


def write(out: Path, name: str, result: dict[str, Any]) -> None:
    """NAME.md, NAME.summary.json (summary_of) and raw/NAME.json into `out`."""
    output.write(out, name, result, markdown(result))
    output.summary_path(out, name).write_text(output.dumps(summary_of(result)) + "\n")


def spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Across seeds: min and max of each seed's figures (the mean over its draws)."""
    def span(values: list[float]) -> dict[str, float]:
        return {"min": float(min(values)), "max": float(max(values)), "mean": float(np.mean(values))}

    out = {"new_accuracy": span([r["summary"]["new_accuracy"]["mean"] for r in runs]),
           "old_accuracy_before": span([r["before"]["old"]["accuracy"] for r in runs]),
           "old_accuracy_drop_max": span([r["before"]["old"]["accuracy"] - r["summary"]["old_accuracy"]["min"]
                                          for r in runs]),
           "new_flagged_before": span([r["before"]["new"]["unknown"] for r in runs]),
           "new_unknown_after": span([r["summary"]["new_unknown_after"]["mean"] for r in runs])}
    for key in ("new_prototype_accuracy", "new_vote_accuracy", "new_switched", "old_switched"):
        if all(key in r["summary"] for r in runs):
            out[key] = span([r["summary"][key]["mean"] for r in runs])
    ceilings = [r["after"][-1]["new"]["accuracy"] for r in runs if has_ceiling(r)]
    if ceilings:
        out["ceiling_new_accuracy"] = span(ceilings)
    return out


def has_ceiling(run_record: dict[str, Any]) -> bool:
    """Whether a seed's runs end with the every-training-image reference enrollment."""
    return run_record.get("ceiling", True) and run_record["after"][-1]["name"].startswith("all")


def groups_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each held-out group of a record; a record from before groups is one group, 8 and 9 after 0-7."""
    if "groups" in result:
        return result["groups"]
    return [{"base": list(DIGIT_CLASSES[:8]), "new": list(DIGIT_PAIR), "seeds": result["seeds"],
             "spread": result["spread"]}]


def targets_of(result: dict[str, Any]) -> dict[str, float]:
    if "targets" in result:
        return result["targets"]
    return result["seeds"][0]["targets"]


def markdown(result: dict[str, Any]) -> str:
    """NAME.md: the summary over seeds per held-out group, the per-run table, then each run's report."""
    parts = [report_head(result)]
    for group in groups_of(result):
        parts += [report(r, group, targets_of(result)) for r in group["seeds"]]
    return "\n".join(parts)


def _pct(span: dict[str, float], digits: int = 1) -> str:
    return f"{span['mean']:.{digits}%} ({span['min']:.{digits}%}-{span['max']:.{digits}%})"


def _mark(met: bool) -> str:
    return "met" if met else "**MISSED**"


def report_head(result: dict[str, Any]) -> str:
    """The opening of NAME.md: what ran, a summary table per held-out group and, with several, one row per run."""
    targets, m = targets_of(result), result["machine"]
    groups = [g for g in groups_of(result) if g["seeds"]]
    new_target, drop_target = targets["new_accuracy_min"], targets["old_accuracy_max_drop"]
    first = groups[0]["seeds"][0]
    lines = [f"# {result.get('title', 'Few-shot enrollment')}", ""]
    done, planned = sum(len(g["seeds"]) for g in groups), result.get("planned_runs")
    if result.get("complete") is False:
        lines += [f"**PARTIAL: {done} of {planned} runs finished** (the sweep stopped or is still running).", ""]
    seeds = sorted({r["seed"] for g in groups for r in g["seeds"]})
    lines += [f"`{result['command']}`; seeds {', '.join(map(str, seeds))}; mean (min-max over seeds) of each seed's "
              "mean over its draws.", ""]
    recipe = result.get("recipe")
    if recipe:
        cfg = first["base_training"]["config"]
        per_class = recipe.get("train_per_class")
        trained = (f"the network trained on {per_class:,} training images of each class "
                   f"({first['base_training']['trained_on']:,} in all), the gallery holding all "
                   f"{first['base_training']['train']:,} of the trained classes" if per_class else
                   "the network trained on every training image of the trained classes, all in the gallery")
        lines += [f"Recipe: {recipe['epochs']} epochs, {recipe['precision']}, {recipe['threads']} torch thread(s), "
                  f"{cfg['negatives']} synthetic negatives, otherwise the default training config; {trained}; "
                  f"{recipe['shots']} images per new class, {recipe['draws']} draws"
                  + ("" if recipe["ceiling"] else ", no every-image ceiling run") + ".", ""]
    for group in groups:
        s, new, base = group["spread"], class_list(group["new"]), class_list(group["base"])
        if len(groups) > 1:
            lines += [f"### {' + '.join(group['new'])} held out, trained on {base}", ""]
        lines += [
            "| figure | value | target |", "|---|---|---|",
            f"| accuracy on held-out {new} after enrolling {group['seeds'][0]['shots']} of each | "
            f"{_pct(s['new_accuracy'])} | >= {new_target:.0%}: {_mark(s['new_accuracy']['min'] >= new_target)} |",
            f"| accuracy on held-out {base} before | {_pct(s['old_accuracy_before'], 2)} | |",
            f"| largest drop on {base} after, any draw | {s['old_accuracy_drop_max']['max'] * 100:.2f} pt | "
            f"<= {drop_target * 100:g} pt: {_mark(s['old_accuracy_drop_max']['max'] <= drop_target + 1e-12)} |",
            f"| held-out {new} flagged unknown BEFORE enrollment | {_pct(s['new_flagged_before'])} | (report) |",
            f"| held-out {new} flagged unknown after | {_pct(s['new_unknown_after'])} | |"]
        if "ceiling_new_accuracy" in s:
            sizes = ", ".join(sorted({str(r["after"][-1]["shots"]) for r in group["seeds"] if has_ceiling(r)}))
            lines.append(f"| ceiling: accuracy on {new} with all {sizes} training images of each enrolled | "
                         f"{_pct(s['ceiling_new_accuracy'])} | |")
        if "new_vote_accuracy" in s:
            lines.append(f"| for comparison, not served: {new} right by the k-NN vote alone (without the "
                         f"enrolled-class switch) | {_pct(s['new_vote_accuracy'])} | |")
        if "new_switched" in s and "old_switched" in s:
            lines.append(f"| answers changed by the enrolled-class switch: held-out {new} / {base} | "
                         f"{_pct(s['new_switched'])} / {_pct(s['old_switched'], 2)} | |")
        if "new_prototype_accuracy" in s:
            lines.append(f"| diagnostic, not served: {new} right by nearest class prototype after enrolling "
                         f"{group['seeds'][0]['shots']} | {_pct(s['new_prototype_accuracy'])} | |")
        lines.append("")
    if len(groups) > 1 or recipe:
        lines += runs_table(groups, new_target, drop_target)
    end = m.get("end", m["start"])
    cached = sum(bool(r.get("base_cached")) for g in groups for r in g["seeds"])
    wall = (f" This command: {result['wall_seconds'] / 60:.1f} min of wall time"
            + (f", {cached} of its base models taken from the --work cache." if cached else ".")
            if "wall_seconds" in result else "")
    resumed = result.get("resumed")
    if resumed and resumed["runs"]:
        wall += (f" {resumed['runs']} run(s) carried over (--resume) from `{resumed['command']}`, started "
                 f"{resumed['started']}, {resumed['wall_seconds'] / 60:.1f} min of wall time.")
    lines += [f"Load average (1 min) {m['start']['load_average_1m']} at start, {end['load_average_1m']} at end, "
              f"{m['start']['cpus']} CPUs shared with other jobs; started {m['start']['time']}, ended {end['time']}."
              + wall, "", ""]
    return "\n".join(lines)


def runs_table(groups: list[dict[str, Any]], new_target: float, drop_target: float) -> list[str]:
    """One row per (held-out group, seed): the figures of each seed's draws."""
    lines = ["| held out | seed | accuracy on new, mean of draws (min-max) | trained classes before -> after (lowest) "
             "| new flagged unknown before -> after | trained flagged unknown after | ceiling | nearest prototype, new "
             "(not served) | base training | run | load 1 min |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for group in groups:
        for r in group["seeds"]:
            s, before = r["summary"], r["before"]
            drop = before["old"]["accuracy"] - s["old_accuracy"]["min"]
            old_unknown = np.mean([a["old"]["unknown"] for a in r["after"][:r["draws"]]])
            ceiling = f"{r['after'][-1]['new']['accuracy']:.1%}" if has_ceiling(r) else "-"
            proto = s.get("new_prototype_accuracy")
            proto = "-" if proto is None else f"{proto['mean']:.1%}"
            new_mark = "" if s["new_accuracy"]["mean"] >= new_target else " (missed)"
            drop_mark = "" if drop <= drop_target + 1e-12 else " (missed)"
            lines.append(
                f"| {' + '.join(group['new'])} | {r['seed']} | {s['new_accuracy']['mean']:.1%} "
                f"({s['new_accuracy']['min']:.1%}-{s['new_accuracy']['max']:.1%}){new_mark} | "
                f"{before['old']['accuracy']:.2%} -> {s['old_accuracy']['min']:.2%}{drop_mark} | "
                f"{before['new']['unknown']:.1%} -> {s['new_unknown_after']['mean']:.1%} | {old_unknown:.2%} | "
                f"{ceiling} | {proto} | {r['base_training']['train_seconds']:.0f} s | "
                f"{(str(round(r['seconds'])) + ' s') if 'seconds' in r else '-'}"
                f"{' (base cached)' if r.get('base_cached') else ''} | "
                f"{r['machine']['start']['load_average_1m']} |")
    return [*lines, ""]


def write_new_images(root: Path, seed: int, shots: int, source: str = DEFAULT_DATA_SOURCE,
                     new: tuple[str, ...] = DIGIT_PAIR) -> dict[str, list[int]]:
    """`shots` training images of each new class, drawn with `seed`, as PNGs root/<label>/sample<i>.png."""
    from PIL import Image

    ds = dataset(source)
    ids = ds.train_sources if ds.train_sources is not None else np.arange(len(ds.train_labels))
    rng = np.random.default_rng(seed)
    chosen = {}
    for label in new:
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
def held_out_inputs(source: str, profile: "Profile") -> np.ndarray:
    """The held-out images of `source` as model inputs of preprocessing `profile` (the one the model records),
    prepared once: every base and enrolled model answers the same images."""
    return profile.normalize(profile.canvases_from_arrays(dataset(source).test_images))


#: Held-out embeddings by (model.pt SHA-256, source): enrollment copies model.pt, so a base model and every
#: enrollment into it embed the held-out images identically; only the gallery, prototypes and threshold differ.
_EMBEDDED: dict[tuple[str, str], np.ndarray] = {}


def held_out_embeddings(service: Any, source: str) -> np.ndarray:
    """`service`'s embeddings of the held-out images of `source`, computed once per model file."""
    key = (service.metadata["sha256"]["model.pt"], source)
    if key not in _EMBEDDED:
        _EMBEDDED.clear()  # one base model at a time
        _EMBEDDED[key] = service.embed(held_out_inputs(source, service.profile))
    return _EMBEDDED[key]


def served(artifacts: Path, source: str = DEFAULT_DATA_SOURCE, base_classes: tuple[str, ...] = DIGIT_CLASSES[:8],
           new: tuple[str, ...] = DIGIT_PAIR) -> dict[str, Any]:
    """Answers of `artifacts` (EmbeddingService, as served: verified, its searcher, prototypes, threshold and
    enrolled-class switch) to the held-out images of `source`, per group; with a switch, also the share of answers it
    changed from the vote's (``switched``) and the accuracy of the k-NN vote alone (``vote_accuracy``)."""
    from handler.service import EmbeddingService

    ds = dataset(source)
    service = EmbeddingService.from_dir(artifacts)
    embeddings = held_out_embeddings(service, source)
    searcher = service.searcher
    distances, ids, scores = searcher.search(embeddings)
    switched = searcher.switched(embeddings)
    vote = [searcher.answer(d, i, s) for d, i, s in zip(distances, ids, scores)]
    answers = vote if switched is None else [searcher.answer(d, i, s, to)
                                             for d, i, s, to in zip(distances, ids, scores, switched)]
    truth = np.array([ds.classes[y] for y in ds.test_labels])
    pred = np.array([str(a["pred"]) for a in answers])
    unknown = np.array([a["unknown"] for a in answers], dtype=bool)
    nearest = nearest_prototype(service.metadata, embeddings)
    out = {}
    for group, classes in (("old", base_classes), ("new", new)):
        mask = np.isin(truth, classes)
        out[group] = {"n": int(mask.sum()), "accuracy": float(np.mean(pred[mask] == truth[mask])),
                      "unknown": float(np.mean(unknown[mask])),
                      "correct_and_known": float(np.mean((pred[mask] == truth[mask]) & ~unknown[mask]))}
        if nearest is not None:
            out[group]["prototype_accuracy"] = float(np.mean(nearest[mask] == truth[mask]))
        if switched is not None:
            voted = np.array([str(a["pred"]) for a in vote])
            out[group]["switched"] = float(np.mean(pred[mask] != voted[mask]))
            out[group]["vote_accuracy"] = float(np.mean(voted[mask] == truth[mask]))
    if switched is not None:
        out["switch_tau"] = searcher.switch.tau
    out["threshold"] = service.searcher.threshold
    out["gallery"] = int(service.searcher.index.ntotal)
    return out


def nearest_prototype(metadata: dict[str, Any], embeddings: np.ndarray) -> np.ndarray | None:
    """The class of the nearest prototype metadata.json records for each embedding, or None without prototypes.
    Not what the endpoint answers (a k-NN vote over the gallery): a diagnostic of whether the embedding separates
    a class enrolled from a few images when each class counts once instead of once per gallery image."""
    recorded = (metadata.get("open_set") or {}).get("prototypes")
    if not recorded:
        return None
    names = np.array(recorded["labels"], dtype=object)
    return names[np.argmax(embeddings @ np.asarray(recorded["vectors"], np.float32).T, axis=1)]


def enroll_and_measure(base: Path, work: Path, name: str, draw: int, shots: int, holdout: float,
                       before: dict[str, Any], source: str = DEFAULT_DATA_SOURCE, new: tuple[str, ...] = DIGIT_PAIR,
                       base_classes: tuple[str, ...] = DIGIT_CLASSES[:8],
                       bench: Benchmark = BENCHMARKS["digits"]) -> dict[str, Any]:
    """Enroll `shots` images of each new class (drawn with `draw`) into a copy of `base`; the served figures after."""
    import shutil

    from training.enroll import enroll_artifacts

    new_root = work / f"new-{name}"
    shutil.rmtree(new_root, ignore_errors=True)
    chosen = write_new_images(new_root, draw, shots, source, new)
    out = work / f"enrolled-{name}"
    started = time.perf_counter()
    meta = enroll_artifacts(base, f"folder:{new_root}", out, new_only=True, holdout=holdout, calibration_data=source,
                            log=lambda _: None)
    after = served(out, source, base_classes, new)
    after.update(name=name, draw=draw, shots=shots, holdout=holdout, enroll_seconds=round(time.perf_counter() - started, 2),
                 enrolled=meta["enrollment"][-1]["added"], calibration_n=meta["open_set"]["calibration"]["n"],
                 new_images=chosen)
    after["met"] = {"new_accuracy": after["new"]["accuracy"] >= bench.target_new_accuracy,
                    "old_within": before["old"]["accuracy"] - after["old"]["accuracy"] <= bench.target_old_drop + 1e-12}
    return after


def run(base: Path, work: Path, seed: int, shots: int, load_start: dict[str, Any], draws: int = 5,
        source: str = DEFAULT_DATA_SOURCE, new: tuple[str, ...] = DIGIT_PAIR,
        base_classes: tuple[str, ...] = DIGIT_CLASSES[:8], bench: Benchmark = BENCHMARKS["digits"],
        ceiling: bool = True, per_class: int | None = None) -> dict[str, Any]:
    """Before, then after enrolling: `draws` independent draws of `shots` images per class (all in the gallery),
    the first draw again with 20% held out for calibration, and, for reference, every training image of the new
    classes (`ceiling`)."""
    base_meta = json.loads((base / "metadata.json").read_text())
    before = served(base, source, base_classes, new)
    kwargs = {"source": source, "new": new, "base_classes": base_classes, "bench": bench}
    runs = [enroll_and_measure(base, work, f"shots{shots}-draw{d}", d, shots, 0.0, before, **kwargs)
            for d in range(draws)]
    runs.append(enroll_and_measure(base, work, f"shots{shots}-draw0-holdout", 0, shots, 0.2, before, **kwargs))
    if ceiling:
        ds = dataset(source)
        all_new = int(min(np.sum(ds.train_labels == ds.classes.index(c)) for c in new))
        runs.append(enroll_and_measure(base, work, f"all{all_new}", 0, all_new, 0.0, before, **kwargs))
    main_runs = runs[:draws]
    summary = {key: {"mean": float(np.mean(vals)), "min": float(np.min(vals)), "max": float(np.max(vals))}
               for key, vals in (("new_accuracy", [r["new"]["accuracy"] for r in main_runs]),
                                 ("old_accuracy", [r["old"]["accuracy"] for r in main_runs]),
                                 ("new_unknown_after", [r["new"]["unknown"] for r in main_runs]))}
    for key, name in (("prototype_accuracy", "new_prototype_accuracy"), ("vote_accuracy", "new_vote_accuracy"),
                      ("switched", "new_switched")):
        if all(key in r["new"] for r in main_runs):
            values = [r["new"][key] for r in main_runs]
            summary[name] = {"mean": float(np.mean(values)), "min": float(np.min(values)),
                             "max": float(np.max(values))}
    if all("switched" in r["old"] for r in main_runs):
        values = [r["old"]["switched"] for r in main_runs]
        summary["old_switched"] = {"mean": float(np.mean(values)), "min": float(np.min(values)),
                                   "max": float(np.max(values))}
    summary["met"] = {"new_accuracy": summary["new_accuracy"]["mean"] >= bench.target_new_accuracy,
                      "old_within": before["old"]["accuracy"] - summary["old_accuracy"]["min"]
                      <= bench.target_old_drop + 1e-12,
                      "new_flagged_before": before["new"]["unknown"]}
    return {
        "seed": seed, "shots": shots, "draws": draws, "ceiling": ceiling, "base": str(base), "data": source,
        "new_classes": list(new),
        "held_out": {"old": before["old"]["n"], "new": before["new"]["n"]},
        "base_training": {"classes": list(base_classes), "train": base_meta["dataset"]["train"],
                          "trained_on": int(len(training_subset(without(source, base_classes).train_labels,
                                                                per_class))),
                          "test": base_meta["dataset"]["test"], "config": base_meta["training"]["config"],
                          "train_seconds": base_meta["training"]["train_seconds"],
                          "accuracy": base_meta["metrics"]["accuracy"],
                          "open_set_score": base_meta["open_set"]["score"],
                          "preprocessing": base_meta.get("preprocessing", {}).get("profile", "digits")},
        "before": before, "after": runs, "summary": summary,
        "targets": {"new_accuracy_min": bench.target_new_accuracy, "old_accuracy_max_drop": bench.target_old_drop},
        "machine": {"start": load_start, "end": machine()},
    }


def report(result: dict[str, Any], group: dict[str, Any] | None = None,
           targets: dict[str, float] | None = None) -> str:
    """One seed's section: before, the per-draw table and the summary, targets marked met or MISSED."""
    group = group or groups_of({"seeds": [result], "spread": {}})[0]
    targets = targets or result["targets"]
    before, summary, cfg = result["before"], result["summary"], result["base_training"]["config"]
    new, base = class_list(group["new"]), class_list(group["base"])
    n_new, n_base = len(group["new"]), len(group["base"])
    new_target, drop_target = targets["new_accuracy_min"], targets["old_accuracy_max_drop"]
    profile = result["base_training"].get("preprocessing", "digits")
    proto = all("prototype_accuracy" in r["new"] for r in result["after"])
    switch = all("switch_tau" in r for r in result["after"])
    precision = cfg.get("precision", "fp32")
    lines = [
        f"## {' + '.join(group['new'])} held out, seed {result['seed']}" if group["new"] != list(DIGIT_PAIR)
        else f"## Seed {result['seed']}", "",
        f"Base model: default config ({cfg['epochs']} epochs, {precision}, {cfg['negatives']} synthetic negatives, "
        f"`{profile}` preprocessing, seed {result['seed']}) trained on {base} only of "
        f"`{result.get('data', DEFAULT_DATA_SOURCE)}` ({result['base_training']['train']} images"
        + (f", the network on {result['base_training']['trained_on']} of them"
           if result["base_training"].get("trained_on", result["base_training"]["train"])
           != result["base_training"]["train"] else "")
        + f", {result['base_training']['train_seconds']:.0f} s of training); open-set score "
        f"{result['base_training']['open_set_score']}. Then {new} enrolled with `python -m training enroll "
        f"--new-only` from {result['shots']} training images each, {result['draws']} independent draws. Held-out: "
        f"the data's {before['old']['n'] + before['new']['n']:,} test images ({before['old']['n']:,} of the "
        f"{n_base} trained classes, {before['new']['n']:,} of the {n_new} new ones), answered by "
        "handler.service.EmbeddingService as served. Accuracy is the "
        + ("served answer: the k-NN vote, or the enrolled class the enrolled-class switch picks where it fires"
           if switch else "k-NN answer")
        + "; `unknown` is the open-set flag at the recorded threshold.", "",
        f"**Before** enrollment: accuracy on {base} {before['old']['accuracy']:.2%} ({before['old']['unknown']:.2%} "
        f"of them flagged unknown); held-out {new} flagged `unknown` at the operating point: "
        f"**{before['new']['unknown']:.1%}** (threshold {before['threshold']:.4f}; the rest are answered as one of "
        "the trained classes).", "",
        f"**After** ({result['draws']} draws of {result['shots']}): accuracy on {new} "
        f"**{summary['new_accuracy']['mean']:.1%}** (range {summary['new_accuracy']['min']:.1%}-"
        f"{summary['new_accuracy']['max']:.1%}; target >= {new_target:.0%}: {_mark(summary['met']['new_accuracy'])}); "
        f"accuracy on {base} {before['old']['accuracy']:.2%} -> {summary['old_accuracy']['min']:.2%}-"
        f"{summary['old_accuracy']['max']:.2%} (target within {drop_target * 100:g} pt: "
        f"{_mark(summary['met']['old_within'])}).", "",
        f"| run | enrolled per class | calibration set | accuracy {new} | accuracy trained (before "
        f"{before['old']['accuracy']:.2%}) | new flagged unknown | trained flagged unknown | threshold | enroll time |"
        + (" switch: tau, answers it changed: new, trained | vote alone: new (not served) |" if switch else "")
        + (" nearest prototype: new, trained (not served) |" if proto else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if switch else "") + ("---|" if proto else ""),
    ]
    for r in result["after"]:
        enrolled = ", ".join(f"{k}: {v}" for k, v in r["enrolled"].items())
        lines.append(
            f"| {r['name']} | {enrolled} | {r['calibration_n']} held-out | {r['new']['accuracy']:.1%} "
            f"| {r['old']['accuracy']:.2%} | {r['new']['unknown']:.1%} | {r['old']['unknown']:.2%} "
            f"| {r['threshold']:.4f} | {r['enroll_seconds']:.1f} s |"
            + (f" {r['switch_tau']:.2f}, {r['new']['switched']:.1%}, {r['old']['switched']:.2%} "
               f"| {r['new']['vote_accuracy']:.1%} |" if switch else "")
            + (f" {r['new']['prototype_accuracy']:.1%}, {r['old']['prototype_accuracy']:.2%} |" if proto else ""))
    m = result["machine"]
    if has_ceiling(result):
        lines += ["", f"The last row enrolls every training image of {new}: the ceiling of this embedding for classes "
                  "it was not trained on, whatever the number of shots."]
    lines += ["", f"Machine: {m['start']['cpus']} CPUs shared with other jobs, load average (1 min) "
              f"{m['start']['load_average_1m']} at start, {m['end']['load_average_1m']} at end ({m['end']['time']}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
