"""Build artifacts C: the same CLI build as Q (python -m training ... --quantize int8, the float network from
NET.npz, trained once), except that the int8 model is made by torchao PT2E (X86InductorQuantizer) and compiled by
AOTInductor; model.pt holds the .pt2 package bytes. Gallery, prototypes, threshold: embedded with that model.

    OMP_NUM_THREADS=1 PYTHONPATH=$AB_WORK/ao python build_c.py NET.npz VARIANT --seed 0 --threads 1 --no-plots \
        --quantize int8 --out C       (VARIANT: linfloat | all)
"""
import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results

import json, shutil, sys, time
from pathlib import Path
sys.path[:0] = [str(REPO), str(HERE)]
import numpy as np
import torch
import train_once
import training.steps as steps
from training.__main__ import main
import pt2e_lib

VARIANT = sys.argv[2]
PKG = Path(f"{WORK}/C-{VARIANT}.pt2")


def quantize_pt2e(model, calibration, check, engine="x86"):
    x_cal = torch.as_tensor(np.ascontiguousarray(calibration))
    x_check = torch.as_tensor(np.ascontiguousarray(check))
    started = time.perf_counter()
    converted = pt2e_lib.quantize(model.eval(), x_cal, linear_float=(VARIANT == "linfloat"))
    quant_s = time.perf_counter() - started
    info = pt2e_lib.compile_package(converted, x_check[:8], PKG)
    runner = pt2e_lib.load(PKG, model.embedding_dim)
    with torch.inference_mode():
        ref, out = model(x_check), runner(x_check)
        ref_conv = converted(x_check)
    diff = float((out - ref).abs().max())
    print(f"pt2e: quantize+calibrate {quant_s:.1f}s, export {info['export_seconds']:.1f}s, "
          f"export+AOTI compile {info['compile_seconds']:.1f}s, package {info['package_bytes']} bytes; "
          f"max diff vs float {diff:.4f}, vs converted (reference) graph {float((out - ref_conv).abs().max()):.2e}",
          flush=True)
    return runner, {"scheme": "int8", "engine": engine, "method": f"torchao-pt2e-x86inductor-aoti-{VARIANT}",
                    "calibration_images": int(len(x_cal)), "fused_conv_blocks": 4, "first_conv": "float", "reduce_range": False,
                    "max_abs_diff_vs_float": diff, "min_cosine_vs_float": float((out * ref).sum(1).min()),
                    "quantize_seconds": quant_s, **{k: v for k, v in info.items() if k != "package"}}


def save_checked(runner, reference, path, sample):
    shutil.copyfile(PKG, path)
    reloaded = pt2e_lib.load(path)
    x = torch.as_tensor(sample)
    with torch.no_grad():
        return float((reloaded(x) - reference(x)).abs().max())


if __name__ == "__main__":
    train_once.CACHE = Path(sys.argv[1])
    steps.train_model = train_once.cached_train_model
    steps.quantize_int8 = quantize_pt2e
    steps.save_checked = save_checked
    steps.load_model = lambda path: pt2e_lib.load(path)
    sys.exit(main(sys.argv[3:]))
