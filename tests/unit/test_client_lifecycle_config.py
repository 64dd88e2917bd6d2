"""``client lifecycle-config --out`` never replaces a file it did not write, nor the config it copies; a rerun
replaces its own config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from settings import CONFIG_FILE, REPO, read_properties


def lifecycle_config(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "client", "lifecycle-config", *args], capture_output=True, text=True,
                          cwd=cwd, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, timeout=60)


def test_a_users_file_and_the_base_config_are_never_replaced(tmp_path):
    mine = tmp_path / "server.properties"
    mine.write_text("inference_address=http://127.0.0.1:9999\n")
    base = tmp_path / "base.properties"
    base.write_bytes(CONFIG_FILE.read_bytes())
    for out, why in ((mine, "exists and was not written by this command"),
                     (base, f"the command reads from {base}")):
        before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        result = lifecycle_config("--out", str(out), "--base", str(base), cwd=tmp_path)
        assert result.returncode == 2 and result.stdout == "", result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"client: error: --out {out}: ") and why in line
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_rerun_replaces_its_own_config(tmp_path):
    out = tmp_path / "run" / "lifecycle.properties"
    assert lifecycle_config("--out", str(out), cwd=tmp_path).returncode == 0
    written = out.read_text()
    out.write_text(written.replace("enable_model_api=true", "enable_model_api=false"))
    result = lifecycle_config("--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == written and read_properties(out)["enable_model_api"] == "true"
    assert [p.name for p in out.parent.iterdir()] == ["lifecycle.properties"]
