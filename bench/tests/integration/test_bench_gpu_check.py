"""`python -m bench gpu-check`: the no-GPU exit, its import closure, and the parity/throughput logic on any device."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bench import gpu_check
from settings import REPO

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
#: Modules a bare GPU machine does not have: none may be imported on the check's path (scipy is the handler's own,
#: for photos; serving.samples, the project's digit generator, needs only numpy and Pillow).
ALLOWED = ("serving", "serving.samples")
FORBIDDEN = ("psutil", "matplotlib", "requests", "mlxtend", "pandas", "sklearn", "training", "serving",
             "client", "ts", "kfp", "grpc", "hypothesis")


def run_check(*args: str, block: bool = False) -> subprocess.CompletedProcess:
    """`python -m bench gpu-check ARGS` in a subprocess; with block, importing a FORBIDDEN module fails it."""
    prelude = ""
    if block:
        prelude = (
            "import sys, importlib.abc\n"
            f"FORBIDDEN, ALLOWED = {FORBIDDEN!r}, {ALLOWED!r}\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in FORBIDDEN and name not in ALLOWED:\n"
            "            raise ImportError(f'bench.gpu_check must not import {name}')\n"
            "sys.meta_path.insert(0, Block())\n"
        )
    code = prelude + f"import sys\nfrom bench.__main__ import main\nsys.exit(main({['gpu-check', *args]!r}))\n"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_77(tiny_artifacts, tmp_path):
    out = tmp_path / "gpu.md"
    done = subprocess.run([sys.executable, "-m", "bench", "gpu-check", "--artifacts", str(tiny_artifacts), "--out",
                           str(out)], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == gpu_check.NO_GPU_EXIT == 77
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], lines
    assert not out.exists() and not out.with_name("raw").exists() and not out.with_suffix(".summary.json").exists()


def test_cpu_run_imports_only_torch_faiss_numpy_pillow_scipy_and_handler(tiny_artifacts, tmp_path, written):
    out = tmp_path / "results" / "gpu.md"
    done = run_check("--artifacts", str(tiny_artifacts), "--out", str(out), "--device", "cpu", "--png", "24",
                     "--jpeg", "8", "--batches", "1,8", "--duration", "0.05", block=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = written(out.parent, "gpu", gpu_check.markdown)
    assert result["parity"]["equal"] and result["parity"]["images"] == 32
    assert {(r["batch"], r["preprocessing"]) for r in result["throughput"]} == {(1, True), (8, True), (1, False),
                                                                                 (8, False)}
    assert all(r["images_per_s"] > 0 for r in result["throughput"])
    assert result["environment"]["torch"] == torch.__version__
    text = out.read_text()
    assert "**equal**" in text and "| cpu | in |" in text and "| cpu | out |" in text


def test_write_digits_makes_a_training_folder(tmp_path):
    assert gpu_check.write_digit_folder(tmp_path, per_class=3) == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(d) for d in range(10)]
    assert all(len(list((tmp_path / str(d)).glob("*.png"))) == 3 for d in range(10))


@pytest.fixture(scope="module")
def bodies() -> list[bytes]:
    return gpu_check.request_bodies(40, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_parity_against_the_cpu(tiny_artifacts, bodies, device):
    result = gpu_check.parity(tiny_artifacts, bodies, device)
    assert result["equal"], result["mismatches"]
    assert result["labels_equal"] == result["unknown_flags_equal"] == len(bodies)
    assert result["max_embedding_diff"] <= (0.0 if device == "cpu" else 1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_preprocessing", [True, False])
def test_throughput_counts_whole_batches(tiny_artifacts, bodies, device, with_preprocessing):
    service = gpu_check.load(tiny_artifacts, device)
    row = gpu_check.throughput(service, bodies, 8, 0.05, with_preprocessing)
    assert row["batches"] >= 1 and row["images_per_s"] > 0 and row["batch_ms_p50"] > 0
    assert row["batch"] == 8 and row["preprocessing"] is with_preprocessing


def test_compare_reports_every_kind_of_difference(tiny_artifacts, bodies):
    service = gpu_check.load(tiny_artifacts, "cpu")
    answers = gpu_check.answer_all(service, bodies[:4])
    assert gpu_check.compare(answers, answers, 0.5) == []
    changed = [dict(a) for a in answers]
    changed[0]["pred"] = "not-a-label"
    changed[1]["unknown"] = not changed[1]["unknown"]
    changed[2]["neighbours"] = [dict(n, dist=n["dist"] + 1e-3) for n in changed[2]["neighbours"]]
    changed[3]["neighbours"] = [dict(n, dist=n["dist"] + 1e-5) for n in changed[3]["neighbours"]]  # within 1e-4
    problems = gpu_check.compare(answers, changed, 0.5)
    assert len(problems) == 3
    assert "label" in problems[0] and "unknown" in problems[1] and "distances" in problems[2]
    assert all("threshold 0.500000" in p for p in problems)
