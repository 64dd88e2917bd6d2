"""The served photo and phone exams' uploads, made ahead in a background process while the suite's first tests run.

Making them is pure CPU in the test process (about a minute each on the 2-core CI machine) while the suite's early
tests mostly wait on containers and servers, so conftest.py starts this module, niced, when the session will run
tests/integration/test_product_quality.py. The exam functions and their arguments are the test's own, so the items
are the same bytes either way; `items` makes them in process when the background run is missing, failed, or was made
for other arguments. Files, not pickle: each body as <exam>/<i>.bin, then <exam>.json with the other fields (written
last: the exam is whole once it is there).

    python -m support.exam_prefetch OUT_DIR
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: exam name -> (the environment variable the test reads the item count from, its default).
EXAMS = {"photo_exam": ("PHOTO_EXAM_N", 300), "phone_exam": ("PHONE_EXAM_N", 200)}


def _inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n held-out digits spread over the bundled sample's test split, and their labels."""
    from training.data import load_dataset

    held_out = load_dataset("mnist-sample")
    pick = np.linspace(0, len(held_out.test_images) - 1, n).astype(int)
    return held_out.test_images[pick], held_out.test_labels[pick]


def count(name: str) -> int:
    variable, default = EXAMS[name]
    return int(os.environ.get(variable, str(default)))


def make(name: str, n: int) -> list:
    from support import photo_set

    return getattr(photo_set, name)(*_inputs(n), seed=0)


def write(out: Path) -> None:
    for name in EXAMS:
        n = count(name)
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        fields = []
        for i, item in enumerate(make(name, n)):
            (folder / f"{i}.bin").write_bytes(item.body)
            fields.append({k: v for k, v in dataclasses.asdict(item).items() if k != "body"})
        partial = out / f"{name}.json.partial"
        partial.write_text(json.dumps({"n": n, "items": fields}))
        partial.rename(out / f"{name}.json")  # the exam is whole once its JSON is there


def start(out: Path) -> subprocess.Popen:
    """The background run writing into `out`, at a lower priority than the tests."""
    tests = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (tests, str(Path(tests).parent), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen([sys.executable, "-m", "support.exam_prefetch", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(10))


def items(name: str, n: int, out: Path | None, process: subprocess.Popen | None, wait_s: float = 600.0) -> list:
    """The exam's items: the background run's when it made them for `n`, else made here."""
    from support.photo_set import ExamItem

    if out is not None and process is not None:
        made = out / f"{name}.json"
        deadline = time.monotonic() + wait_s
        while not made.is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if made.is_file():
            saved = json.loads(made.read_text())
            if saved["n"] == n:
                return [ExamItem(body=(out / name / f"{i}.bin").read_bytes(), **fields)
                        for i, fields in enumerate(saved["items"])]
    return make(name, n)


def main(argv: list[str]) -> int:
    write(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

