"""``python -m training`` with the trained float network kept in CACHE: the first build trains and saves it, a later
build with ``--quantize int8`` quantizes that very network instead of training it again (half the CPU time of two
full builds). Everything after training (quantization, gallery, prototypes, threshold) is the CLI's own code. Used
for seed 1 in ab-int8.md's notes:

    OMP_NUM_THREADS=1 .venv/bin/python bench/results/ab-int8.train_once.py NET.pt --seed 1 --threads 1 \\
        --no-plots --out F
    OMP_NUM_THREADS=1 .venv/bin/python bench/results/ab-int8.train_once.py NET.pt --seed 1 --threads 1 --no-plots \\
        --quantize int8 --out Q

Training is deterministic for a given seed and thread count (seed 0's two separate CLI builds printed the same loss
and accuracy in every epoch), so this is the same float network a second full build would have trained.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import training.steps as steps  # noqa: E402
from training.__main__ import main  # noqa: E402

CACHE = Path(sys.argv[1])
_train_model = steps.train_model


def cached_train_model(*args, **kwargs):
    if CACHE.is_file():
        model, history = torch.load(CACHE, weights_only=False)
        print(f"reusing the float network trained earlier ({CACHE})", flush=True)
        return model.eval(), history
    model, history = _train_model(*args, **kwargs)
    torch.save((model, history), CACHE)
    return model, history


if __name__ == "__main__":
    steps.train_model = cached_train_model
    sys.exit(main(sys.argv[2:]))
