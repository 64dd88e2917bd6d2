"""Fresh process, no torchao on the path, no C compiler on PATH: load an AOTI package and run it.
    env -i PATH=$PWD/.venv/bin HOME=/tmp OMP_NUM_THREADS=1 python fresh_load.py PKG EMB.npy"""
import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results

import importlib.util, shutil, sys, time, warnings
t0 = time.perf_counter()
import numpy as np
import torch
torch.set_num_threads(1)
print("torchao importable:", importlib.util.find_spec("torchao") is not None,
      "| gcc/g++/cc on PATH:", [c for c in ("gcc", "g++", "cc", "c++", "clang") if shutil.which(c)])
sys.path.insert(0, str(REPO))
from training.steps import prepare_data
x = torch.from_numpy(np.ascontiguousarray(prepare_data("mnist-sample").inputs("test")))
warnings.simplefilter("always")
t1 = time.perf_counter()
m = torch._inductor.aoti_load_package(sys.argv[1])
with torch.inference_mode():
    out = torch.cat([m(x[i:i + 250]) for i in range(0, len(x), 250)])
t2 = time.perf_counter()
ref = torch.from_numpy(np.load(sys.argv[2]))
print(f"loaded and ran 1000 inputs in {t2 - t1:.2f}s (process {t2 - t0:.2f}s); max abs diff vs in-process run "
      f"{float((out - ref).abs().max()):.2e}; batch sizes 1 and 37 ok: {tuple(m(x[:1]).shape)}, {tuple(m(x[:37]).shape)}")
print("torchao loaded:", "torchao" in sys.modules)
