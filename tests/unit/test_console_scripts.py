"""The console scripts of pyproject.toml ([project.scripts], beside `python -m`): an editable install of the project,
without its dependencies, into a throwaway environment puts each on PATH, and each runs its CLI's `main` and answers
--help."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from settings import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
EXPECTED = {"embedding-train": "training", "embedding-serve": "serving", "embedding-client": "client",
            "embedding-pipeline": "pipeline", "embedding-queue": "queue_bridge"}


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory) -> Path:
    """A throwaway environment with the project installed editable (`pip install -e . --no-deps`, the install the
    project supports: settings.py reads config.properties and the other files beside it); it sees .venv's
    packages through a .pth file."""
    env = tmp_path_factory.mktemp("console-scripts") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = Path(subprocess.run([str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip())
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_dependencies_from_venv.pth").write_text("\n".join(paths) + "\n")
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install",
                             "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(REPO)],
                            capture_output=True, text=True, cwd=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return env / "bin"


def test_each_cli_with_a_main_has_a_script_named_alike():
    assert {name: target.split(".")[0] for name, target in SCRIPTS.items()} == EXPECTED
    for name, target in SCRIPTS.items():
        module, func = target.split(":")
        assert f"def {func}(argv" in (REPO / (module.replace(".", "/") + ".py")).read_text(), name


def test_each_script_answers_help_from_the_installed_project(bin_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["OMP_NUM_THREADS"] = "1"
    procs = {name: subprocess.Popen([str(bin_dir / name), "--help"], cwd=tmp_path, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name in SCRIPTS}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{name} --help: {err[-2000:]}"
        assert out.startswith("usage: "), f"{name} --help printed {out[:200]!r}"
    where = subprocess.run([str(bin_dir / "python"), "-c", "import training, settings; print(training.__file__); "
                            "print(settings.__file__)"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert where == [str(REPO / "training" / "__init__.py"), str(REPO / "settings.py")]


def test_a_bad_option_is_a_usage_error_not_a_traceback(bin_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run([str(bin_dir / "embedding-queue"), "--no-such-option"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "error:" in result.stderr.strip().splitlines()[-1], result.stderr
