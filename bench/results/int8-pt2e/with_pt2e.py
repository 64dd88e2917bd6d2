"""Run a command of the project with handler.service.load_model loading a model.pt that holds an AOTI .pt2 package
(artifacts whose training.quantization.method starts with torchao-pt2e), and the usual loader otherwise.

    python with_pt2e.py training eval --artifacts C --threads 1
    python with_pt2e.py quality 500 exam.json F Q C
"""
import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = HERE.parents[2]
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results

import runpy, sys
from pathlib import Path
sys.path[:0] = [str(REPO), str(HERE)]
import handler.service as service
import pt2e_lib
from handler.artifacts import MODEL_FILE

_load = service.load_model


def load_model(model_dir, metadata, device="cpu", runtime="torchscript", threads=None):
    if str(metadata.quantization.get("method", "")).startswith("torchao-pt2e"):
        return pt2e_lib.load(Path(model_dir) / MODEL_FILE, metadata.embedding_dim)
    return _load(model_dir, metadata, device, runtime, threads)


service.load_model = load_model
if __name__ == "__main__":
    what, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    if what == "training":
        from training.__main__ import main
        sys.exit(main(sys.argv[1:]))
    runpy.run_path(str(HERE / "quality.py"), run_name="__main__")
