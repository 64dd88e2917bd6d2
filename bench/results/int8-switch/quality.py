"""The photo exam and the printed digits of tests/integration/test_product_quality.py, answered in process by
handler.service.EmbeddingService (the served code path without TorchServe, in batches of 8 as served), for one or
more artifact directories, each at the threshold its own metadata.json records. The figures of ab-int8.md's notes:

    OMP_NUM_THREADS=1 .venv/bin/python bench/results/ab-int8.quality.py 500 exam.json FLOAT_DIR INT8_DIR

The photo exam takes the same evenly spaced held-out digits and seed (0) as the integration test.
"""
import os as _os, sys as _sys
from pathlib import Path as _Path
HERE = _Path(__file__).resolve().parent
REPO = _Path(_os.environ.get("AB_REPO", "/tmp/quant/old"))
WORK = _Path(_os.environ.get("AB_WORK", "/tmp/quant"))  # where the A/B writes its models and results


import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


sys.path[:0] = [str(REPO), str(REPO / "tests")]
from handler.service import EmbeddingService  # noqa: E402
from integration.test_product_quality import printed_digits  # noqa: E402
from support.photo_set import photo_exam  # noqa: E402
from training.data import load_dataset  # noqa: E402


def answers(service: EmbeddingService, bodies: list[bytes]) -> list[dict]:
    got: list[dict] = []
    for start in range(0, len(bodies), 8):
        got += service.answer(bodies[start : start + 8])[0]
    return got


def main(n: int, out: Path, dirs: list[str]) -> dict:
    held_out = load_dataset("mnist-sample")
    pick = np.linspace(0, len(held_out.test_images) - 1, n).astype(int)
    items = photo_exam(held_out.test_images[pick], held_out.test_labels[pick], seed=0)
    printed = printed_digits()
    result: dict = {"photo_n": n, "photo_seed": 0, "printed_n": len(printed), "models": {}}
    for directory in dirs:
        service = EmbeddingService.from_dir(Path(directory))
        photo = answers(service, [item.body for item in items])
        typed = answers(service, [body for body, _ in printed])
        result["models"][directory] = {
            "quantize": service.metadata.training["config"].get("quantize"),
            "threshold": service.searcher.threshold,
            "photo": {"correct": float(np.mean([a.get("pred") == str(i.label) for a, i in zip(photo, items)])),
                      "unknown": float(np.mean([bool(a.get("unknown")) for a in photo])),
                      "errors": int(sum("error" in a for a in photo))},
            "printed": {"correct": float(np.mean([a.get("pred") == label for a, (_, label) in zip(typed, printed)])),
                        "unknown": float(np.mean([bool(a.get("unknown")) for a in typed]))},
        }
    result["machine"] = {"load_average_1m": round(os.getloadavg()[0], 2),
                         "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]), indent=2))
