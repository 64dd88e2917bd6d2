"""`pip wheel ./bench` builds the optional package: every bench module and the `python -m bench` entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from settings import REPO


def test_the_bench_package_builds_a_wheel_with_every_module(tmp_path):
    source = tmp_path / "bench"
    shutil.copytree(REPO / "bench", source, ignore=shutil.ignore_patterns("tests", "results", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "--disable-pip-version-check", str(source), "-w", str(tmp_path / "wheel")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("mnist_embedding_bench-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    modules = {f"bench/{p.name}" for p in (REPO / "bench").glob("*.py")}
    assert modules <= names
    assert not any(n.startswith(("bench/tests", "bench/results")) for n in names)
    assert "mnist-bench = bench.__main__:main" in entry_points
