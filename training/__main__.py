"""python -m training: train the embedding model and build its FAISS gallery into --out.

Subcommands (python -m training eval --help, python -m training enroll --help, python -m training report --help):
  eval    open-set figures of built artifacts (AUROC, share of unknowns flagged, digits accepted, accuracy)
  enroll  add labelled images (NEW/<label>/*.png) to a copy of built artifacts without retraining
  report  one self-contained HTML page showing what built artifacts do on their held-out split, or on a folder of
          your own images (--images DIR; with DIR/<label>/ folders also the accuracy against those labels)

Every --out replaces only what the same command wrote there before (training/outputs.py): never a folder of your
files, the current directory, home, a repository or anything the command reads.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from cli_common import (EXIT_INTERRUPTED, EXIT_USAGE, Parser, UsageError, add_params, fail, input_dir, output_dir,
                        output_file, positive_int)
from handler.artifacts import path_identity, quantization
from owned_paths import replaceable_file, starts_with
from settings import DEFAULT_DATA_SOURCE, DEFAULT_THREADS, cache_root, env_threads

from .data import SOURCE_FORMS, source_problem
from .outputs import artifacts_folder, is_eval_result, source_reads
from .params import TRAINING_PARAMS, train_config

DEFAULT_OUT = Path("artifacts")
THREADS_HELP = f"torch intra-op threads (default: $OMP_NUM_THREADS, else {DEFAULT_THREADS})"


def _data_source(text: str) -> str:
    """argparse type: a data source whose storage URI (if any) is well formed; nothing is read yet."""
    problem = source_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=positive_int, default=env_threads(), help=THREADS_HELP)
    p.add_argument("--cache-dir", type=Path, default=None, help=f"download cache (default: {cache_root()})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="python -m training", description=__doc__)
    p.add_argument("--data-source", type=_data_source, default=DEFAULT_DATA_SOURCE, metavar="SOURCE",
                   help=f"training data: {SOURCE_FORMS}")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="output folder: a new or empty one, or one training made before (replaced atomically)")
    add_params(p, TRAINING_PARAMS)
    _common(p)
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    return p.parse_args(argv)


def _ood_list(text: str) -> list[str]:
    from .evaluate import OOD_SETS

    names = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in names if name not in OOD_SETS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(OOD_SETS)}, got {text!r}")
    return names


def parse_eval_args(argv: list[str]) -> argparse.Namespace:
    from .evaluate import FASHION_DIR, OOD_SETS

    p = Parser(prog="python -m training eval",
               description="Open-set figures of built artifacts, as served (JSON on standard output).")
    p.add_argument("--artifacts", type=Path, default=DEFAULT_OUT, help="artifact folder")
    p.add_argument("--ood", type=_ood_list, default=list(OOD_SETS), help="unknown sets, comma-separated")
    p.add_argument("--data-source", type=_data_source, default=DEFAULT_DATA_SOURCE, metavar="SOURCE",
                   help="source of the held-out digits (as for training)")
    p.add_argument("--fashion-dir", type=Path, default=FASHION_DIR, help="Fashion-MNIST IDX folder")
    p.add_argument("--n-synthetic", type=positive_int, default=1000, help="images per synthetic unknown set")
    p.add_argument("--out", type=Path, default=None, metavar="FILE", help="also write the JSON to this file")
    p.add_argument("--threads", type=positive_int, default=env_threads(), help=THREADS_HELP)
    return p.parse_args(argv)


def eval_main(argv: list[str]) -> int:
    """python -m training eval: print (and optionally write) the open-set evaluation of --artifacts."""
    import json

    import torch

    from handler.artifacts import ArtifactError

    from .data import DataError
    from .evaluate import evaluate_open_set

    prog = "training eval"
    args = parse_eval_args(argv)
    try:
        input_dir(args.artifacts, "--artifacts")
        if args.out is not None:
            output_file(args.out, "--out")
            replaceable_file(args.out, "--out", ours=is_eval_result,
                             reads=[args.artifacts, args.fashion_dir, *source_reads(args.data_source)])
    except UsageError as exc:
        return fail(f"python -m {prog}", exc, EXIT_USAGE)
    torch.set_num_threads(args.threads)
    try:
        result = evaluate_open_set(args.artifacts, args.ood, args.data_source, args.fashion_dir, args.n_synthetic)
        text = json.dumps(result, indent=2)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
    except (ArtifactError, DataError, ValueError, OSError) as exc:
        return fail(prog, exc)
    except KeyboardInterrupt:
        return fail(prog, "interrupted", EXIT_INTERRUPTED)
    print(text)
    return 0


def parse_enroll_args(argv: list[str]) -> argparse.Namespace:
    from .enroll import DEFAULT_HOLDOUT

    p = Parser(prog="python -m training enroll",
               description="Add labelled images to a copy of built artifacts without retraining, and recalibrate "
                           "the open-set threshold.")
    p.add_argument("--artifacts", type=Path, required=True, help="artifact folder to enroll into (only read)")
    p.add_argument("--data-source", required=True, metavar="folder:DIR", help="folder:DIR with DIR/<label>/*.png")
    p.add_argument("--out", type=Path, required=True,
                   help="new artifact folder, or one training or enroll made before (published atomically)")
    p.add_argument("--new-only", action="store_true", help="refuse labels the gallery already holds")
    p.add_argument("--holdout", type=float, default=DEFAULT_HOLDOUT,
                   help="share of each new class held out for threshold calibration (0 enrolls every image)")
    p.add_argument("--calibration-data", default=None, metavar="SOURCE",
                   help="source the artifacts were trained on, whose held-out split recalibrates the threshold "
                        "(default: the recorded dataset when it is mnist-sample)")
    _common(p)
    return p.parse_args(argv)


def enroll_main(argv: list[str]) -> int:
    """python -m training enroll: one summary line, or one error line and exit 1 with nothing written."""
    import torch

    from handler.artifacts import ArtifactError

    from .data import DataError
    from .enroll import EnrollError, enroll_artifacts

    prog = "training enroll"
    args = parse_enroll_args(argv)
    try:
        input_dir(args.artifacts, "--artifacts")
        output_dir(args.out, "--out")
        # --artifacts itself: enroll_artifacts refuses an --out equal to or nested with it, first thing, by name
        artifacts_folder(args.out, reads=[*source_reads(args.data_source),
                                          *source_reads(args.calibration_data, args.cache_dir)])
    except UsageError as exc:
        return fail(f"python -m {prog}", exc, EXIT_USAGE)
    torch.set_num_threads(args.threads)
    try:
        enroll_artifacts(args.artifacts, args.data_source, args.out, args.new_only, args.holdout,
                         args.calibration_data, args.cache_dir, log=lambda line: print(line, flush=True))
    except UsageError as exc:  # --out changed hands during the work
        return fail(f"python -m {prog}", exc, EXIT_USAGE)
    except (EnrollError, ArtifactError, DataError, ValueError, OSError) as exc:
        return fail(prog, exc)
    except KeyboardInterrupt:
        return fail(prog, "interrupted", EXIT_INTERRUPTED)
    return 0


def _report_ood(text: str) -> list[str]:
    return [] if text.strip() == "none" else _ood_list(text)


def parse_report_args(argv: list[str]) -> argparse.Namespace:
    from .evaluate import FASHION_DIR
    from .report import DEFAULT_OOD, DEFAULT_OOD_IMAGES

    p = Parser(prog="python -m training report",
               description="One self-contained HTML page (images inline, no scripts) showing what built artifacts "
                           "do on their held-out split, as served: the confusion matrix, the worst errors and the "
                           "rejected images with their nearest gallery images, the open-set score histogram. With "
                           "--images DIR, the same for your own images: each one's canvas, answer, score and "
                           "neighbours, and with DIR/<label>/ folders the confusion matrix and accuracy against them.")
    p.add_argument("artifacts", type=Path, metavar="ARTIFACTS", help="artifact folder (only read)")
    p.add_argument("--images", type=Path, default=None, metavar="DIR",
                   help="report on the images in DIR and DIR/<label>/ instead of the held-out split (only read)")
    p.add_argument("--out", type=Path, default=Path("report.html"), metavar="FILE.html",
                   help="the page, written atomically; an existing file only if it is a report page")
    p.add_argument("--data-source", type=_data_source, default=None, metavar="SOURCE",
                   help=f"source of the held-out split and of the gallery's images (default: the one metadata.json "
                        f"records, else {DEFAULT_DATA_SOURCE})")
    p.add_argument("--ood", type=_report_ood, default=list(DEFAULT_OOD),
                   help="unknown sets drawn in the histogram, comma-separated, or none (a missing one is noted)")
    p.add_argument("--ood-images", type=positive_int, default=DEFAULT_OOD_IMAGES,
                   help="images per unknown set in the histogram")
    p.add_argument("--fashion-dir", type=Path, default=FASHION_DIR, help="Fashion-MNIST IDX folder")
    _common(p)
    return p.parse_args(argv)


def report_main(argv: list[str]) -> int:
    """python -m training report: write the page, print one line saying where; one error line otherwise."""
    import shlex
    import time

    import torch

    from handler.artifacts import ArtifactError

    from .data import DataError
    from .report import ReportError, build_report, write_atomically
    from .report_images import build_images_report
    from .report_page import PAGE_HEADER

    prog = "training report"
    args = parse_report_args(argv)
    try:
        input_dir(args.artifacts, "ARTIFACTS")
        if args.images is not None:
            input_dir(args.images, "--images")
        output_file(args.out, "--out")
        replaceable_file(args.out, "--out", ours=starts_with(PAGE_HEADER.encode()),
                         reads=[args.artifacts, args.images, args.fashion_dir, *source_reads(args.data_source)])
    except UsageError as exc:
        return fail(f"python -m {prog}", exc, EXIT_USAGE)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    command = shlex.join(["python", "-m", "training", "report", *argv])

    def log(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stderr)

    try:
        if args.images is not None:
            page = build_images_report(args.artifacts, args.images, args.data_source, command, args.cache_dir, log)
        else:
            page = build_report(args.artifacts, args.data_source, args.ood, args.fashion_dir, args.ood_images,
                                command=command, cache_dir=args.cache_dir, log=log)
        write_atomically(page, args.out)
    except (ReportError, ArtifactError, DataError, ValueError, OSError) as exc:
        return fail(prog, exc)
    except KeyboardInterrupt:
        return fail(prog, "interrupted", EXIT_INTERRUPTED)
    print(f"wrote {args.out} ({len(page.encode()) / 1024:.0f} KiB) in {time.perf_counter() - started:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["eval"]:
        return eval_main(argv[1:])
    if argv[:1] == ["enroll"]:
        return enroll_main(argv[1:])
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    args = parse_args(argv)
    try:
        output_dir(args.out, "--out")
        artifacts_folder(args.out, reads=source_reads(args.data_source, args.cache_dir))
    except UsageError as exc:
        return fail("python -m training", exc, EXIT_USAGE)
    from .build import build_artifacts
    from .data import DataError
    from .export import ExportError

    config = train_config(vars(args))
    before = path_identity(args.out)
    try:
        metadata = build_artifacts(args.data_source, args.out, config, args.index_type, args.k, args.cache_dir,
                                   args.threads, not args.no_plots, log=lambda line: print(line, flush=True),
                                   score=args.open_set_score, kth=args.kth, profile=args.preprocessing)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # published: too late to interrupt, finish and report
    except UsageError as exc:  # --out changed hands during the build
        return fail("python -m training", exc, EXIT_USAGE)
    except (DataError, ExportError, ValueError, OSError) as exc:
        return fail("training", exc)
    except KeyboardInterrupt:
        if path_identity(args.out) != before:  # Ctrl-C came after the atomic swap: the new build is whole and in place
            print(f"training: interrupted after the new artifacts were published to {args.out}/", file=sys.stderr)
        else:
            print("training: interrupted; previous artifacts left untouched", file=sys.stderr)
        return EXIT_INTERRUPTED
    m = metadata.metrics
    model = "int8" if quantization(metadata) == "int8" else "float"
    print(f"wrote {args.out}/ ({model} model): accuracy {m.accuracy:.4f}, open-set rejection "
          f"{m.open_set_rejection:.3f}, threshold {metadata.threshold:.4f}, trained in "
          f"{metadata.training['train_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
