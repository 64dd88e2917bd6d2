"""``python -m training`` with the trained float network kept in CACHE: the first build trains and saves it, a later
build with ``--quantize int8`` quantizes that very network instead of training it again (half the CPU time of two
full builds). Everything after training (quantization, gallery, prototypes, threshold) is the CLI's own code. Used
for seed 1 in ab-int8.md's notes:

    OMP_NUM_THREADS=1 .venv/bin/python bench/results/ab-int8.train_once.py NET.npz --seed 1 --threads 1 \\
        --no-plots --quantize none --out F
    OMP_NUM_THREADS=1 .venv/bin/python bench/results/ab-int8.train_once.py NET.npz --seed 1 --threads 1 --no-plots \\
        --quantize int8 --out Q

Training is deterministic for a given seed and thread count (seed 0's two separate CLI builds printed the same loss
and accuracy in every epoch), so this is the same float network a second full build would have trained.
"""
import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = _Path(_os.environ.get("AB_REPO", "/tmp/quant/old"))
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results


import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(REPO))
import training.steps as steps  # noqa: E402
from training.__main__ import main  # noqa: E402
from training.model import EmbeddingNet  # noqa: E402
from training.train import History  # noqa: E402

CACHE = Path(sys.argv[1])
_train_model = steps.train_model


def cached_train_model(*args, **kwargs):
    """train_model's result, trained once. The cache holds arrays and JSON only (nothing that can run code when
    read): the weights as .npz, the history as JSON; the network is rebuilt from the run's TrainConfig
    (train_model's sixth argument)."""
    config = args[5]
    history_file = CACHE.with_suffix(".history.json")
    if CACHE.is_file() and history_file.is_file():
        with np.load(CACHE) as weights:
            state = {name: torch.from_numpy(weights[name]) for name in weights.files}
        model = EmbeddingNet(config.embedding_dim, config.width, config.pool)
        model.load_state_dict(state)
        print(f"reusing the float network trained earlier ({CACHE})", flush=True)
        return model.eval(), History(**json.loads(history_file.read_text()))
    model, history = _train_model(*args, **kwargs)
    with CACHE.open("wb") as out:
        np.savez(out, **{name: t.detach().cpu().numpy() for name, t in model.state_dict().items()})
    history_file.write_text(json.dumps(dataclasses.asdict(history)))
    return model, history


if __name__ == "__main__":
    steps.train_model = cached_train_model
    sys.exit(main(sys.argv[2:]))
