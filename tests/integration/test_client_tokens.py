"""``python -m client rotate-token`` against a real TorchServe of its own (rotation changes the server's keys):
the key file gets a new key with a new expiry, the old key is refused and the new one accepted, and mistakes end
on one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.torchserve import running_instance

from settings import REPO

pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_store):
    with running_instance(tmp_path_factory.mktemp("ts-tokens"), model_store) as instance:
        yield instance


def client(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "client", *args], capture_output=True, text=True, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, timeout=120)


def entries(key_file: Path) -> dict[str, dict]:
    return json.loads(key_file.read_text())


@pytest.mark.parametrize("kind,check", [("inference", "ping"), ("management", "status")])
def test_rotation_replaces_one_key_and_the_old_one_is_refused(server, tmp_path, kind, check):
    before = entries(server.key_file)
    result = client("rotate-token", kind, "--config", str(server.config), "--key-file", str(server.key_file),
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    after = entries(server.key_file)
    assert after[kind]["key"] != before[kind]["key"]
    assert after[kind]["expiration time"] > before[kind]["expiration time"]
    others = [k for k in ("inference", "management", "API") if k != kind]
    assert [after[k] for k in others] == [before[k] for k in others]
    assert result.stdout.startswith(f"rotated the {kind} key of {server.endpoints.management.split('//')[1]}: "
                                    f"the new key is in {server.key_file}, expires ")
    config = ["--config", str(server.config)]
    old = client(check, *config, "--token", before[kind]["key"], cwd=tmp_path)
    assert old.returncode == 3 and "refused the token from --token" in old.stderr
    new = client(check, *config, "--key-file", str(server.key_file), cwd=tmp_path)
    assert new.returncode == 0, new.stderr


def test_a_stale_copy_of_the_key_file_is_named(server, tmp_path):
    copy = shutil.copy(server.key_file, tmp_path / "copy.json")
    result = client("rotate-token", "inference", "--config", str(server.config), "--key-file", str(copy),
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"({copy} still holds the old one: it is not that server's key file)" in result.stdout
    assert entries(server.key_file)["inference"] != entries(Path(copy))["inference"]


@pytest.mark.parametrize("case,code,message", [
    ("wrong API key", 3, "refused the API key from --token: rotating needs the API entry of the server's "
                         "key_file.json"),
    ("the management key", 3, "refused the API key from --token"),
    ("the inference port", 2, "is TorchServe's inference port, not TorchServe's management port: use --url {mgmt}"),
    ("no key file", 2, "nope.json: cannot read the key file"),
    ("the API key itself", 2, "argument KIND: invalid choice: 'API'"),
])
def test_rotation_mistakes_are_one_line(server, tmp_path, case, code, message):
    keys = entries(server.key_file)
    config = ["--config", str(server.config)]
    args = {
        "wrong API key": ["inference", *config, "--token", "not-the-key"],
        "the management key": ["inference", *config, "--token", keys["management"]["key"]],
        "the inference port": ["inference", *config, "--url", server.endpoints.inference, "--key-file",
                               str(server.key_file)],
        "no key file": ["inference", *config, "--key-file", str(tmp_path / "nope.json")],
        "the API key itself": ["API", *config, "--key-file", str(server.key_file)],
    }[case]
    result = client("rotate-token", *args, cwd=tmp_path)
    assert result.returncode == code and result.stdout == "", result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert message.format(mgmt=server.endpoints.management) in line
    assert entries(server.key_file) == keys  # nothing was rotated
