"""`python -m training`: train the embedding model and build its FAISS gallery into --out.

`python -m training eval --artifacts DIR [--ood fashion,synthetic,noise] [--json FILE]`: open-set figures of
built artifacts (AUROC, share of unknowns flagged, digits accepted, accuracy) as JSON.

`python -m training enroll --artifacts DIR --data folder:NEW --out DIR2 [--new-only]`: add NEW/<label>/*.png to a
copy of DIR's gallery without retraining and recalibrate its open-set threshold (training/enroll.py).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from handler.artifacts import path_identity
from handler.search import DEFAULT_K, OPEN_SET_SCORES
from settings import DEFAULT_DATA_SOURCE, DEFAULT_THREADS, cache_root, env_threads

from .data import SOURCE_FORMS
from .evaluate import DEFAULT_KTH, DEFAULT_OPEN_SET_SCORE
from .index import INDEX_TYPES
from .quantize import QUANTIZATION
from .steps import PROFILE_CHOICES
from .train import PRECISION, PRECISION_HELP, TrainConfig

DEFAULT_OUT = Path("artifacts")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = TrainConfig()
    p = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    p.add_argument("--data", default=DEFAULT_DATA_SOURCE, help=SOURCE_FORMS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (replaced atomically)")
    p.add_argument("--preprocessing", choices=PROFILE_CHOICES, default="auto",
                   help="preprocessing profile: digits (crop to the strokes, 20x20 box, as MNIST), full-frame (whole "
                        "28x28 frame, for centred pictures such as Fashion-MNIST) or auto (default: full-frame for "
                        "Fashion-MNIST, else digits); recorded in metadata.json and applied by the handler")
    p.add_argument("--epochs", type=_positive_int, default=defaults.epochs)
    p.add_argument("--embedding-dim", type=_positive_int, default=defaults.embedding_dim)
    p.add_argument("--width", type=_positive_int, default=defaults.width, help="channels of the first conv block")
    p.add_argument("--batch-size", type=_positive_int, default=defaults.batch_size)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--index", choices=("auto", *INDEX_TYPES), default="auto",
                   help="gallery index: auto (exact below 30k images, IVF above), flat, hnsw or ivf")
    p.add_argument("-k", type=_positive_int, default=DEFAULT_K, help="neighbours in the k-NN vote")
    p.add_argument("--open-set-score", choices=OPEN_SET_SCORES, default=DEFAULT_OPEN_SET_SCORE,
                   help="what the unknown threshold is calibrated on and served with")
    p.add_argument("--kth", type=_positive_int, default=DEFAULT_KTH,
                   help="neighbour rank of kth_distance (Sun et al. 2022)")
    p.add_argument("--negatives", type=_non_negative_int, default=None,
                   help="synthetic non-digits for outlier exposure (0: off; default 4000 when the classes are the "
                        "ten digits, else 0)")
    p.add_argument("--printed", type=_non_negative_int, default=None,
                   help="printed digits (DejaVu fonts) mixed into training with their labels (0: off; default 2000 "
                        "when the classes are the ten digits, else 0)")
    p.add_argument("--oe-weight", type=float, default=defaults.oe_weight, help="weight of the outlier-exposure loss")
    p.add_argument("--oe-loss", choices=("hinge", "uniform"), default=defaults.oe_loss,
                   help="outlier-exposure loss (training/model.py ArcFaceHead.outlier_loss)")
    p.add_argument("--oe-margin", type=float, default=defaults.oe_margin,
                   help="hinge: largest cosine a non-digit may keep to any class centre")
    p.add_argument("--quantize", choices=QUANTIZATION, default=defaults.quantize,
                   help="int8: quantize the convolutions after training (faster on CPU, CPU only; the gallery and "
                        "threshold are built with the int8 model)")
    p.add_argument("--precision", choices=PRECISION, default=defaults.precision, help=PRECISION_HELP)
    p.add_argument("--threads", type=_positive_int, default=env_threads(),
                   help=f"torch intra-op threads (default: $OMP_NUM_THREADS or {DEFAULT_THREADS})")
    p.add_argument("--cache-dir", type=Path, default=None, help=f"download cache (default {cache_root()})")
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

    p = argparse.ArgumentParser(prog="python -m training eval",
                                description="Open-set figures of built artifacts, as served (JSON on stdout).")
    p.add_argument("--artifacts", type=Path, default=DEFAULT_OUT, help="artifact directory (default artifacts)")
    p.add_argument("--ood", type=_ood_list, default=list(OOD_SETS),
                   help=f"unknown sets, comma-separated (default {','.join(OOD_SETS)})")
    p.add_argument("--data", default=DEFAULT_DATA_SOURCE, help="source of the held-out digits (as for training)")
    p.add_argument("--fashion-dir", type=Path, default=FASHION_DIR, help="Fashion-MNIST IDX directory")
    p.add_argument("--n-synthetic", type=_positive_int, default=1000, help="images per synthetic unknown set")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON to this file")
    p.add_argument("--threads", type=_positive_int, default=env_threads())
    return p.parse_args(argv)


def _error(prog: str, exc: BaseException) -> int:
    """The subcommands' failure: the reason on one line on stderr, exit status 1."""
    print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
    return 1


def eval_main(argv: list[str]) -> int:
    """`python -m training eval`: print (and optionally write) the open-set evaluation of --artifacts."""
    import json

    import torch

    from handler.artifacts import ArtifactError

    from .data import DataError
    from .evaluate import evaluate_open_set

    args = parse_eval_args(argv)
    torch.set_num_threads(args.threads)
    try:
        if not args.artifacts.is_dir():
            raise ValueError(f"{args.artifacts}: no such artifact directory")
        result = evaluate_open_set(args.artifacts, args.ood, args.data, args.fashion_dir, args.n_synthetic)
        text = json.dumps(result, indent=2)
        if args.json:
            args.json.write_text(text + "\n")
    except (ArtifactError, DataError, ValueError, OSError) as exc:
        return _error("training eval", exc)
    print(text)
    return 0


def parse_enroll_args(argv: list[str]) -> argparse.Namespace:
    from .enroll import DEFAULT_HOLDOUT

    p = argparse.ArgumentParser(prog="python -m training enroll",
                                description="Add labelled images to a copy of built artifacts without retraining.")
    p.add_argument("--artifacts", type=Path, required=True, help="artifact directory to enroll into (only read)")
    p.add_argument("--data", required=True, help="folder:DIR with DIR/<label>/*.png")
    p.add_argument("--out", type=Path, required=True, help="new artifact directory (published atomically)")
    p.add_argument("--new-only", action="store_true", help="refuse labels the gallery already holds")
    p.add_argument("--holdout", type=float, default=DEFAULT_HOLDOUT,
                   help=f"share of each new class held out for threshold calibration (default {DEFAULT_HOLDOUT}; "
                        "0 enrolls every image)")
    p.add_argument("--calibration-data", default=None,
                   help="source DIR was trained on, whose held-out split recalibrates the threshold "
                        "(default: the recorded dataset when it is mnist-sample)")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--threads", type=_positive_int, default=env_threads())
    return p.parse_args(argv)


def enroll_main(argv: list[str]) -> int:
    """`python -m training enroll`: one summary line, or one error line and exit 1 with nothing written."""
    import torch

    from handler.artifacts import ArtifactError

    from .data import DataError
    from .enroll import EnrollError, enroll_artifacts

    args = parse_enroll_args(argv)
    torch.set_num_threads(args.threads)
    try:
        enroll_artifacts(args.artifacts, args.data, args.out, args.new_only, args.holdout, args.calibration_data,
                         args.cache_dir, log=lambda line: print(line, flush=True))
    except (EnrollError, ArtifactError, DataError, ValueError, OSError) as exc:
        return _error("training enroll", exc)
    except KeyboardInterrupt:
        print("training enroll: interrupted", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["eval"]:
        return eval_main(argv[1:])
    if argv[:1] == ["enroll"]:
        return enroll_main(argv[1:])
    args = parse_args(argv)
    from .build import build_artifacts
    from .data import DataError
    from .export import ExportError

    config = TrainConfig(epochs=args.epochs, embedding_dim=args.embedding_dim, width=args.width,
                         batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                         negatives=args.negatives, oe_weight=args.oe_weight, oe_loss=args.oe_loss,
                         oe_margin=args.oe_margin, printed=args.printed,
                         quantize=args.quantize, precision=args.precision)
    before = path_identity(args.out)
    try:
        metadata = build_artifacts(args.data, args.out, config, args.index, args.k, args.cache_dir,
                                   args.threads, not args.no_plots, log=lambda line: print(line, flush=True),
                                   score=args.open_set_score, kth=args.kth, profile=args.preprocessing)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # published: too late to interrupt, finish and report
    except (DataError, ExportError, ValueError, OSError) as exc:
        print(f"training: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if path_identity(args.out) != before:  # Ctrl-C came after the atomic swap: the new build is whole and in place
            print(f"training: interrupted after the new artifacts were published to {args.out}/", file=sys.stderr)
        else:
            print("training: interrupted; previous artifacts left untouched", file=sys.stderr)
        return 130
    m = metadata["metrics"]
    print(f"wrote {args.out}/: accuracy {m['accuracy']:.4f}, open-set rejection {m['open_set_rejection']:.3f}, "
          f"threshold {metadata['threshold']:.4f}, trained in {metadata['training']['train_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
