"""`python -m bench gpu-check --artifacts DIR [--out bench/results/gpu.md]`: the service on CUDA, checked and timed.

Loads the artifacts twice in the project's service (handler.service.EmbeddingService), on the CPU and on
`--device` (default cuda), sends both the same few hundred request bodies (PNG digits as the bench sends them
and 640x480 JPEG photos of digits) and checks that the answers are the CPU's: the same label, unknown flag and
neighbour labels, and distances within DISTANCE_TOLERANCE. Then it measures images/s at batch 1, 8, 64 and 256
with preprocessing in (`answer()` on request bytes) and out (embed + k-NN search of ready tensors) on both
devices, prints a table and writes the markdown to --out, NAME.summary.json beside it and the
full record to raw/NAME.json there, with the card, torch, CUDA and
cuDNN versions.

It imports nothing but torch, faiss-cpu, numpy, Pillow, scipy (the handler's photo path), the standard library
and the project's handler/ (plus bench/data.py's image drawing), so it runs on a bare GPU machine; the digits
are drawn with Pillow's built-in font, not read from a dataset. `--device cpu` runs the same check CPU against CPU, to try it without a GPU.

Exit status: 0 answers equal, figures written; 3 answers differ (figures still written, the differences listed);
77 no CUDA device: one line on stderr, nothing measured or written (77 is the "skipped" status of automake and
CTest, so a script can tell "no GPU here" from a failure); 1 the artifacts could not be loaded; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from handler.artifacts import ArtifactError
from handler.service import EmbeddingService

from serving.samples import user_digit_png

from . import output
from .data import REQUEST_SCALE, photo_jpeg

NO_GPU_EXIT = 77
MISMATCH_EXIT = 3
BATCHES = (1, 8, 64, 256)
#: Largest |distance difference| accepted between CPU and GPU answers. Embeddings are L2-normalised float32
#: vectors; oneDNN and cuDNN sum the same products in different orders, which should move a distance (0..2) by
#: about 1e-6 in float32 (answers are rounded to 1e-6; the check reports the largest embedding difference it saw).
#: 1e-4 leaves 100x room and is still far below TF32's ~1e-3 errors, which it would catch (TF32 is off on CUDA,
#: see EmbeddingService). Labels, unknown flags and neighbour labels must be identical regardless.
DISTANCE_TOLERANCE = 1e-4
Log = Callable[[str], None]


def no_gpu_reason(device: str) -> str | None:
    """Why `device` cannot run here (None when it can)."""
    if not device.startswith("cuda"):
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
        return f"bench.gpu_check: no CUDA device (torch {torch.__version__}, {build}); nothing measured"
    index = torch.device(device).index or 0
    if index >= torch.cuda.device_count():
        return f"bench.gpu_check: {device} does not exist ({torch.cuda.device_count()} CUDA devices); nothing measured"
    return None


def glyph_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` 28x28 light-on-black digits drawn with Pillow's built-in font at random sizes, offsets and slants,
    and their labels: stand-ins for MNIST digits that need no dataset."""
    rng = np.random.default_rng(seed)
    images, labels = np.zeros((n, 28, 28), np.uint8), rng.permutation(np.arange(n) % 10)  # balanced classes
    for i, digit in enumerate(labels):
        big = Image.new("L", (112, 112), 0)
        font = ImageFont.load_default(size=int(rng.integers(60, 90)))
        ImageDraw.Draw(big).text((56 + rng.integers(-8, 9), 56 + rng.integers(-8, 9)), str(digit), fill=255,
                                 font=font, anchor="mm", stroke_width=int(rng.integers(2, 6)), stroke_fill=255)
        big = big.rotate(float(rng.uniform(-15, 15)), resample=Image.Resampling.BILINEAR)
        images[i] = np.asarray(big.resize((28, 28), Image.Resampling.BOX))
    return images, labels


def request_bodies(n_png: int = 256, n_jpeg: int = 64, seed: int = 0) -> list[bytes]:
    """PNG bodies as the bench sends them, then JPEG photos of other digits."""
    images, _ = glyph_digits(n_png + n_jpeg, seed)
    rng = np.random.default_rng(seed)
    return [user_digit_png(img, REQUEST_SCALE) for img in images[:n_png]] + [photo_jpeg(img, rng) for img in images[n_png:]]


def write_digit_folder(root: Path, per_class: int = 300, seed: int = 1) -> int:
    """Glyph digits as a `python -m training --data-source folder:ROOT` dataset (ROOT/<digit>/<n>.png), for training
    tiny artifacts where no dataset is installed. Returns the number of images written."""
    images, labels = glyph_digits(per_class * 10, seed)
    for i, (image, label) in enumerate(zip(images, labels)):
        folder = root / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:05d}.png")
    return len(images)


def load(artifacts: Path, device: str) -> EmbeddingService:
    return EmbeddingService.from_dir(artifacts, device=device)


def answer_all(service: EmbeddingService, bodies: Sequence[bytes], batch: int = 64) -> list[dict[str, Any]]:
    return [a for i in range(0, len(bodies), batch) for a in service.answer(list(bodies[i:i + batch]))[0]]


def compare(reference: Sequence[dict], answers: Sequence[dict], threshold: float | None,
            tolerance: float = DISTANCE_TOLERANCE) -> list[str]:
    """One line per answer that is not the reference's (same label, unknown flag, neighbour labels; distances
    within `tolerance`). A line says how far the reference's top-1 distance was from the threshold."""
    problems = []
    for i, (ref, got) in enumerate(zip(reference, answers, strict=True)):
        why = []
        if ("error" in ref) != ("error" in got):
            why.append(f"error {ref.get('error')!r} vs {got.get('error')!r}")
        elif "error" not in ref:
            if ref["pred"] != got["pred"]:
                why.append(f"label {ref['pred']} vs {got['pred']}")
            if ref["unknown"] != got["unknown"]:
                why.append(f"unknown {ref['unknown']} vs {got['unknown']}")
            if [n["label"] for n in ref["neighbours"]] != [n["label"] for n in got["neighbours"]]:
                why.append("neighbour labels differ")
            ref_d = np.array([n["dist"] for n in ref["neighbours"]], float)
            got_d = np.array([n["dist"] for n in got["neighbours"]], float)
            if ref_d.shape != got_d.shape or (ref_d.size and np.abs(ref_d - got_d).max() > tolerance):
                why.append(f"distances differ by more than {tolerance:g}")
        if why:
            margin = "" if threshold is None or ref.get("dist") is None else \
                f" (reference top-1 {ref['dist']:.6f}, threshold {threshold:.6f})"
            problems.append(f"image {i}: " + "; ".join(why) + margin)
    return problems


def parity(artifacts: Path, bodies: Sequence[bytes], device: str, reference_device: str = "cpu",
           tolerance: float = DISTANCE_TOLERANCE) -> dict[str, Any]:
    """Answers and embeddings of `device` against `reference_device` for the same bodies."""
    reference, service = load(artifacts, reference_device), load(artifacts, device)
    ref_answers, answers = answer_all(reference, bodies), answer_all(service, bodies)
    tensors = np.stack([reference.profile.preprocess(b) for b in bodies])
    ref_emb, emb = reference.embed(tensors), service.embed(tensors)
    ref_top = np.array([a["dist"] for a in ref_answers if a.get("dist") is not None], float)
    top = np.array([a["dist"] for a in answers if a.get("dist") is not None], float)
    problems = compare(ref_answers, answers, reference.searcher.threshold, tolerance)
    return {"device": device, "reference_device": reference_device, "images": len(bodies),
            "equal": not problems, "mismatches": problems, "tolerance": tolerance,
            "max_embedding_diff": float(np.abs(ref_emb - emb).max()),
            "max_top1_distance_diff": float(np.abs(ref_top - top).max()) if ref_top.shape == top.shape and top.size
            else None,
            "labels_equal": sum(a.get("pred") == b.get("pred") for a, b in zip(ref_answers, answers)),
            "unknown_flags_equal": sum(a.get("unknown") == b.get("unknown") for a, b in zip(ref_answers, answers))}


def throughput(service: EmbeddingService, bodies: Sequence[bytes], batch: int, duration_s: float,
               with_preprocessing: bool) -> dict[str, Any]:
    """Images/s and batch p50 latency of consecutive batches for `duration_s` (after one warm-up batch).

    With preprocessing: `answer()` on request bytes, as a worker does. Without: embed + k-NN search of tensors
    preprocessed beforehand (the device's share of the work)."""
    batches = [list(bodies[(i * batch + j) % len(bodies)] for j in range(batch)) for i in range(8)]
    if with_preprocessing:
        work: list[Any] = batches
        step = service.answer
    else:
        work = [np.stack([service.profile.preprocess(b) for b in items]) for items in batches]

        def step(x: np.ndarray) -> Any:
            return service.searcher.classify(service.embed(x))

    step(work[0])
    seconds, done, started = [], 0, time.perf_counter()
    while time.perf_counter() - started < duration_s or not seconds:
        t = time.perf_counter()
        step(work[len(seconds) % len(work)])
        seconds.append(time.perf_counter() - t)
        done += batch
    elapsed = time.perf_counter() - started
    return {"batch": batch, "preprocessing": with_preprocessing, "images_per_s": done / elapsed,
            "batch_ms_p50": 1e3 * float(np.median(seconds)), "batches": len(seconds)}


def measure(artifacts: Path, bodies: Sequence[bytes], devices: Sequence[str], batches: Sequence[int] = BATCHES,
            duration_s: float = 2.0, log: Log = print) -> list[dict[str, Any]]:
    rows = []
    for device in devices:
        service = load(artifacts, device)
        for with_pre in (True, False):
            for batch in batches:
                row = {"device": device, **throughput(service, bodies, batch, duration_s, with_pre)}
                rows.append(row)
                log(f"  {device:<7} batch {batch:<4d} preprocessing {'in ' if with_pre else 'out'}  "
                    f"{row['images_per_s']:9.1f} images/s  batch p50 {row['batch_ms_p50']:8.2f} ms")
    return rows


def _tf32_settings() -> dict[str, Any]:
    """TF32 switches as the service left them (EmbeddingService turns them off on CUDA)."""
    try:
        return {"cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32}
    except RuntimeError as exc:  # torch refuses to read them once its newer fp32_precision API was used
        return {"error": str(exc).splitlines()[0][:200]}


def environment(device: str) -> dict[str, Any]:
    import faiss
    import PIL

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                           "faiss": faiss.__version__, "numpy": np.__version__, "pillow": PIL.__version__,
                           "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                           "platform": platform.platform(terse=True)}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(card=props.name, capability=f"{props.major}.{props.minor}",
                   card_memory_gib=round(props.total_memory / 2**30, 1),
                   tf32=_tf32_settings())
    else:
        env["card"] = None
    return env


def markdown(result: dict[str, Any]) -> str:
    env, par = result["environment"], result["parity"]
    card = env["card"] or "no GPU (CPU against CPU)"
    lines = [f"# GPU check ({result['started']})", "",
             f"`{result['command']}`: {card}"
             + (f" (compute capability {env['capability']}, {env['card_memory_gib']} GiB)" if env["card"] else "")
             + f"; torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, faiss {env['faiss']}; "
             f"{env['cpu_count']} CPUs, torch threads {env['torch_threads']}; artifacts `{result['artifacts']}`.", "",
             f"Parity with the CPU on {par['images']} request bodies: "
             + ("**equal**" if par["equal"] else f"**{len(par['mismatches'])} answers differ**")
             + f" (labels equal {par['labels_equal']}/{par['images']}, unknown flags equal "
             f"{par['unknown_flags_equal']}/{par['images']}, largest embedding difference "
             f"{par['max_embedding_diff']:.2e}, distance tolerance {par['tolerance']:g}).", ""]
    lines += [f"- {m}" for m in par["mismatches"][:20]]
    lines += ["", "Images/s (batch p50 ms), consecutive batches for "
              f"{result['duration_s']} s each, one Python thread sending:", "",
              "| device | preprocessing | " + " | ".join(f"batch {b}" for b in result["batches"]) + " |",
              "|---|---|" + "---|" * len(result["batches"])]
    for device in result["devices"]:
        for with_pre in (True, False):
            cells = [f"{r['images_per_s']:.0f} ({r['batch_ms_p50']:.2f})" for r in result["throughput"]
                     if r["device"] == device and r["preprocessing"] == with_pre]
            lines.append(f"| {device} | {'in' if with_pre else 'out'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench gpu-check", description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", type=Path, help="trained artifacts (python -m training --out)")
    p.add_argument("--write-digits", type=Path, metavar="DIR",
                   help="only write glyph digits as a training folder DIR/<digit>/*.png (no GPU needed) and exit")
    p.add_argument("--out", type=Path, default=Path("bench/results/gpu.md"), help="markdown; JSON beside it")
    p.add_argument("--device", default="cuda", help="device checked against the CPU (default cuda)")
    p.add_argument("--png", type=int, default=256, help="PNG bodies in the parity check (default 256)")
    p.add_argument("--jpeg", type=int, default=64, help="JPEG photos in the parity check (default 64)")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes (default 1,8,64,256)")
    p.add_argument("--duration", type=float, default=2.0, help="seconds per throughput figure (default 2)")
    args = p.parse_args(argv)
    if args.write_digits is not None:
        print(f"wrote {write_digit_folder(args.write_digits)} digits under {args.write_digits}")
        return 0
    if args.artifacts is None:
        p.error("--artifacts is required")
    reason = no_gpu_reason(args.device)
    if reason:
        print(reason, file=sys.stderr)
        return NO_GPU_EXIT
    bodies = request_bodies(args.png, args.jpeg)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    devices = [args.device] if args.device == "cpu" else [args.device, "cpu"]
    started = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        par = parity(args.artifacts, bodies, args.device)
        print(f"parity {args.device} vs cpu on {len(bodies)} images: "
              + ("equal" if par["equal"] else f"{len(par['mismatches'])} answers differ")
              + f" (largest embedding difference {par['max_embedding_diff']:.2e})")
        for line in par["mismatches"][:20]:
            print(f"  {line}")
        rows = measure(args.artifacts, bodies, devices, batches, args.duration)
    except ArtifactError as exc:
        print(f"bench.gpu_check: {exc}", file=sys.stderr)
        return 1
    result = {"command": "python -m bench gpu-check " + " ".join(argv if argv is not None else sys.argv[1:]),
              "started": started, "artifacts": str(args.artifacts), "devices": devices, "batches": batches,
              "duration_s": args.duration, "environment": environment(args.device), "parity": par,
              "throughput": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out, name = args.out.parent, args.out.stem
    raw = output.write(out, name, result, markdown(result))
    print(f"wrote {out / (name + '.md')}, {output.summary_path(out, name)} and {raw}")
    return 0 if par["equal"] else MISMATCH_EXIT


if __name__ == "__main__":
    sys.exit(main())
