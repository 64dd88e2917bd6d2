"""Forward-only time per batch of the served networks: Q0 (torch.ao, as served), C0 (the shipped build) and C0's
network rebuilt with other compile settings. One thread, interleaved, median of REPS."""
import json, os, statistics, sys, time
from pathlib import Path
WORK = Path(os.environ.get("AB_WORK", "/tmp/quant"))
sys.path.insert(0, os.environ.get("AB_REPO", "/work/main"))
import numpy as np, torch
torch.set_num_threads(1)
from handler.metadata import ModelMetadata
from handler.network import load_model, load_package
from training.model import EmbeddingNet
from training import quantize as q
from training.steps import prepare_data
d = prepare_data("mnist-sample")
x = torch.from_numpy(np.ascontiguousarray(d.inputs("test")))
cfg = json.loads((WORK / "F0" / "train.json").read_text())["config"]
net = EmbeddingNet(cfg["embedding_dim"], cfg["width"], cfg["pool"])
with np.load(WORK / "NET0.npz") as w:
    net.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files})
net.eval()
cal = d.inputs("train")[np.sort(np.random.default_rng(0).permutation(4000)[:2048])]
models = {}
for n in ("F0", "Q0", "C0"):
    models[n] = load_model(WORK / n, ModelMetadata.read(WORK / n))
orig = q.compile_package
def variant(name, **cfgs):
    def compile_package(converted, example, path):
        from torch._inductor import aoti_compile_and_package
        batch = torch.export.Dim("batch", min=1, max=q.MAX_BATCH)
        with torch.no_grad():
            program = torch.export.export(converted, (example,), dynamic_shapes=({0: batch},))
            aoti_compile_and_package(program, package_path=str(path), inductor_configs={"freezing": True, **cfgs})
    q.compile_package = compile_package
    path = WORK / f"var-{name}.pt2"
    if not path.exists():
        q.quantize_int8(net, cal, d.inputs("test")[:256], path)
    models[name] = load_package(path, "AVX2")
variant("avx2-static", **{"cpp.march": "x86-64-v3", "cpp.simdlen": 256, "cpp.dynamic_threads": False})
variant("native-avx512", **{"cpp.dynamic_threads": True})
q.compile_package = orig
REPS = int(os.environ.get("REPS", "150"))
res = {}
with torch.inference_mode():
    for b in (1, 8, 32):
        per = {n: [] for n in models}
        for m in models.values():
            for _ in range(20): m(x[:b])
        names = list(models)
        for rep in range(REPS):
            xb = x[(rep * b) % 900:][:b].contiguous()
            for n in names[rep % len(names):] + names[:rep % len(names)]:
                t0 = time.perf_counter(); models[n](xb); per[n].append((time.perf_counter() - t0) * 1e3)
        res[b] = {n: round(statistics.median(v), 3) for n, v in per.items()}
        print(b, res[b], flush=True)
print(os.popen("uptime").read().strip())
