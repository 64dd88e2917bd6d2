"""`python -m training`: train the embedding model and build its FAISS gallery into --out."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from handler.search import DEFAULT_K
from settings import DEFAULT_DATA_SOURCE, DEFAULT_THREADS, cache_root, env_threads

from .index import INDEX_TYPES
from .train import TrainConfig

DEFAULT_OUT = Path("artifacts")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = TrainConfig()
    p = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    p.add_argument("--data", default=DEFAULT_DATA_SOURCE,
                   help=f"{DEFAULT_DATA_SOURCE} (default, offline), idx:DIR, download:mnist or folder:DIR")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (replaced atomically)")
    p.add_argument("--epochs", type=_positive_int, default=defaults.epochs)
    p.add_argument("--embedding-dim", type=_positive_int, default=defaults.embedding_dim)
    p.add_argument("--width", type=_positive_int, default=defaults.width, help="channels of the first conv block")
    p.add_argument("--batch-size", type=_positive_int, default=defaults.batch_size)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--index", choices=("auto", *INDEX_TYPES), default="auto",
                   help="gallery index: auto (exact below 30k images, IVF above), flat, hnsw or ivf")
    p.add_argument("-k", type=_positive_int, default=DEFAULT_K, help="neighbours in the k-NN vote")
    p.add_argument("--threads", type=_positive_int, default=env_threads(),
                   help=f"torch intra-op threads (default: $OMP_NUM_THREADS or {DEFAULT_THREADS})")
    p.add_argument("--cache-dir", type=Path, default=None, help=f"download cache (default {cache_root()})")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    return p.parse_args(argv)


def _identity(out: Path) -> tuple[int, int] | None:
    """The output directory's (device, inode): publishing swaps in a new directory, so this changes."""
    try:
        st = os.stat(out)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from .build import build_artifacts
    from .data import DataError
    from .export import ExportError

    config = TrainConfig(epochs=args.epochs, embedding_dim=args.embedding_dim, width=args.width,
                         batch_size=args.batch_size,
                         lr=args.lr, seed=args.seed)
    before = _identity(args.out)
    try:
        metadata = build_artifacts(args.data, args.out, config, args.index, args.k, args.cache_dir,
                                   args.threads, not args.no_plots, log=lambda line: print(line, flush=True))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # published: too late to interrupt, finish and report
    except (DataError, ExportError, ValueError, OSError) as exc:
        print(f"training: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if _identity(args.out) != before:  # Ctrl-C came after the atomic swap: the new build is whole and in place
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
