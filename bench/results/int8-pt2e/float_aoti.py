"""The float network compiled by AOTInductor (dynamic batch, freezing): is the speed-up int8's or Inductor's?"""
import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results

import json, sys, time, os
sys.path[:0] = [str(REPO), str(HERE)]
import numpy as np, torch
torch.set_num_threads(1)
from training.model import EmbeddingNet
cfg = json.load(open(WORK / "F" / "train.json"))["config"]
net = EmbeddingNet(cfg["embedding_dim"], cfg["width"], cfg["pool"])
with np.load(WORK / "NET.npz") as w:
    net.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
net.eval()
t = time.perf_counter()
with torch.no_grad():
    ep = torch.export.export(net, (torch.randn(8, 1, 28, 28),), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    p = torch._inductor.aoti_compile_and_package(ep, package_path=str(WORK / "F-aoti.pt2"), inductor_configs={"freezing": True})
print(f"float AOTI compile {time.perf_counter() - t:.1f}s, {os.path.getsize(p)} bytes")
