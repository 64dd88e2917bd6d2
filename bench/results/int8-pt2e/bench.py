"""In-process forward time per batch and embedding difference vs float, candidates interleaved.

    OMP_NUM_THREADS=1 nice -n 19 python bench.py OUT.json NAME=DIR_OR_PKG ...
DIR: artifacts loaded as served (handler.service.EmbeddingService.from_dir(...).model: jit.load +
optimize_for_inference); *.pt2: an AOTI package (pt2e_lib.load). The first candidate is the float reference.
"""
import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results

import json, os, statistics, sys, time, warnings
from datetime import datetime, timezone
from pathlib import Path
sys.path[:0] = [str(REPO), str(HERE)]
import numpy as np
import torch

torch.set_num_threads(1)
out_file, specs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
REPS = int(os.environ.get("REPS", "200"))
INNER = {1: 20, 8: 6, 32: 2}

from handler.service import EmbeddingService
import pt2e_lib
from training.steps import prepare_data

data = prepare_data("mnist-sample")
x_test = torch.from_numpy(np.ascontiguousarray(data.inputs("test")))
models, load_warnings = {}, {}
for name, src in specs:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.perf_counter()
        m = (pt2e_lib.load_lowered(src) if src.endswith(".ep.pt2") else pt2e_lib.load(src) if src.endswith(".pt2")
             else EmbeddingService.from_dir(Path(src)).model)
        with torch.inference_mode():
            m(x_test[:8])
        load_s = time.perf_counter() - started
    models[name] = m
    load_warnings[name] = {"load_and_first_call_s": load_s,
                           "warnings": sorted({str(w.message)[:160] for w in caught})}

result = {"reps": REPS, "inner": INNER, "threads": torch.get_num_threads(), "torch": torch.__version__,
          "load": load_warnings, "uptime_before": os.popen("uptime").read().strip(),
          "start": datetime.now(timezone.utc).isoformat(timespec="seconds"), "diff_vs_float": {}, "ms": {}}
ref_name = specs[0][0]
with torch.inference_mode():
    emb = {name: torch.cat([m(x_test[i:i + 250]) for i in range(0, len(x_test), 250)]) for name, m in models.items()}
    for b in (1, 8, 32):
        per = {name: [] for name in models}
        for name, m in models.items():  # warm-up
            for _ in range(30):
                m(x_test[:b])
        names = list(models)
        for rep in range(REPS):
            order = names[rep % len(names):] + names[:rep % len(names)]  # rotate: ABCD BCDA ...
            xb = x_test[(rep * b) % (len(x_test) - b):][:b].contiguous()
            for name in order:
                m = models[name]
                t0 = time.perf_counter()
                for _ in range(INNER[b]):
                    m(xb)
                per[name].append((time.perf_counter() - t0) / INNER[b] * 1e3)
        result["ms"][b] = {name: {"median": statistics.median(v), "p10": float(np.percentile(v, 10)),
                                  "p90": float(np.percentile(v, 90))} for name, v in per.items()}
        print(b, {n: round(v["median"], 4) for n, v in result["ms"][b].items()}, flush=True)
ref = emb[ref_name]
for name, e in emb.items():
    result["diff_vs_float"][name] = {"max_abs": float((e - ref).abs().max()), "min_cosine": float((e * ref).sum(1).min()),
                                     "mean_cosine": float((e * ref).sum(1).mean())}
    np.save(f"{WORK}/emb-{name}.npy", e.numpy())
result["uptime_after"] = os.popen("uptime").read().strip()
result["end"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
out_file.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps({k: result[k] for k in ("diff_vs_float", "load", "uptime_before", "uptime_after")}, indent=1))
