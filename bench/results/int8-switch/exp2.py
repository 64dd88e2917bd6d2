"""The seed-0 network quantized with its first convolution float (the shipped FLOAT_MODULES) and int8: the largest
embedding difference from the float network, at every batch size the build checks (the build's own limits off)."""
import json, os, sys
from pathlib import Path
WORK = Path(os.environ.get("AB_WORK", "/tmp/quant"))
sys.path.insert(0, os.environ.get("AB_REPO", "."))
import numpy as np, torch
torch.set_num_threads(1)
from training.model import EmbeddingNet
from training import quantize as q
from training.steps import prepare_data
cfg = json.loads((WORK / "F0" / "train.json").read_text())["config"]
net = EmbeddingNet(cfg["embedding_dim"], cfg["width"], cfg["pool"])
with np.load(WORK / "NET0.npz") as w:
    net.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
net.eval()
d = prepare_data("mnist-sample")
cal = d.inputs("train")[np.sort(np.random.default_rng(0).permutation(4000)[:2048])]
for fl in [("features.0.0",), ()]:
    q.FLOAT_MODULES = fl
    q.MAX_EMBEDDING_DIFF = q.MAX_BATCH_DIFF = 10
    info = q.quantize_int8(net, cal, d.inputs("test"), WORK / f"exp-{len(fl)}.pt2")
    print(fl or "all int8", {k: info[k] for k in ("max_abs_diff_vs_float", "min_cosine_vs_float", "batch_max_abs_diff")})
