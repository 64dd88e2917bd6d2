"""In-process served path per batch of 8 encoded PNG digits (EmbeddingService.answer: preprocessing, model,
search), candidates interleaved (rotated order), median ms per batch.
    OMP_NUM_THREADS=1 python e2e.py OUT.json F Q C CA"""
import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results

import io, json, os, statistics, sys, time
sys.path[:0] = [str(REPO), str(HERE)]
import numpy as np, torch
torch.set_num_threads(1)
import with_pt2e  # noqa: F401  (patches handler.service.load_model for the AOTI artifacts)
from handler.service import EmbeddingService
from PIL import Image
from training.data import load_dataset
ds = load_dataset("mnist-sample")
bodies = []
for img in ds.test_images[:256]:
    buf = io.BytesIO(); Image.fromarray(np.asarray(img, dtype=np.uint8)).save(buf, format="PNG"); bodies.append(buf.getvalue())
names = sys.argv[2:]
services = {n: EmbeddingService.from_dir(f"{WORK}/{n}") for n in names}
for s in services.values():
    for i in range(20):
        s.answer(bodies[:8])
per = {n: [] for n in names}
up0 = os.popen("uptime").read().strip()
for rep in range(int(os.environ.get("REPS", "300"))):
    order = names[rep % len(names):] + names[:rep % len(names)]
    batch = bodies[(rep * 8) % 248:][:8]
    for n in order:
        t0 = time.perf_counter(); services[n].answer(batch); per[n].append((time.perf_counter() - t0) * 1e3)
res = {"batch": 8, "median_ms": {n: statistics.median(v) for n, v in per.items()}, "uptime_before": up0,
       "uptime_after": os.popen("uptime").read().strip()}
open(sys.argv[1], "w").write(json.dumps(res, indent=2))
print(json.dumps(res, indent=1))
