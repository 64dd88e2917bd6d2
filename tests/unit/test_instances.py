"""torchserve_api.instances: the record of each running TorchServe, and what the client finds with it."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from client import tokens
from settings import servers_dir
from torchserve_api import instances
from torchserve_api.transport import auth_error


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def write_key_file(path: Path, key: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({kind: {"key": f"{key}-{kind}", "expiration time": "2099-01-01T00:00:00Z"}
                                for kind in ("inference", "management", "API")}))
    return path


def record_for_this_process(tmp_path: Path, port: int = 18080, key_file: Path | None = None) -> instances.Record:
    """A record of a live process (this one), as serving.server.start writes for TorchServe's frontend."""
    return instances.record_of(os.getpid(), tmp_path / "workdir", tmp_path / "workdir" / "config.properties",
                               "embedding", tmp_path / "store", key_file,
                               {"inference": port, "management": port + 1, "gRPC inference": port + 2})


def test_servers_dir_follows_xdg_state_home(state_home):
    assert servers_dir() == state_home / "mnist-embedding" / "servers"


def test_a_saved_record_is_read_back_private_and_whole(tmp_path):
    record = record_for_this_process(tmp_path, key_file=tmp_path / "workdir" / "key_file.json")
    path = instances.save(record)
    assert instances.running() == [record]
    assert stat.S_IMODE(servers_dir().stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in servers_dir().iterdir()] == [f"{os.getpid()}.json"]  # no partial file left
    instances.forget(os.getpid())
    assert instances.running() == [] and not path.exists()


def test_a_record_names_its_runtime_and_one_written_before_runtimes_is_torchserves(tmp_path):
    python = instances.Record(**{**record_for_this_process(tmp_path).__dict__, "runtime": "python"})
    instances.save(python)
    assert instances.running()[0].describe() == f"python runtime pid {os.getpid()} of {tmp_path / 'workdir'}"
    older = {k: v for k, v in record_for_this_process(tmp_path).__dict__.items() if k != "runtime"}
    (servers_dir() / f"{os.getpid()}.json").write_text(json.dumps(older))
    [record] = instances.running()
    assert (record.runtime, record.server) == ("torchserve", "TorchServe")
    assert record.describe().startswith("TorchServe pid ")


def test_a_record_whose_process_is_gone_is_dropped_and_deleted(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    record = instances.record_of(gone.pid, tmp_path, tmp_path / "c", "embedding", tmp_path, None, {"inference": 1})
    gone.wait()
    path = instances.save(record)
    assert instances.running() == [] and not path.exists()


def test_a_record_of_a_reused_pid_is_stale(tmp_path):
    """The pid now names a process started at another time than the recorded one."""
    record = record_for_this_process(tmp_path)
    reused = instances.Record(**{**record.__dict__, "started": record.started - 3600})
    path = instances.save(reused)
    assert instances.running() == [] and not path.exists()


@pytest.mark.parametrize("address,found", [
    ("http://127.0.0.1:18080", True),
    ("http://localhost:18081/", True),
    ("127.0.0.1:18082", True),  # a gRPC target
    ("http://10.1.2.3:18080", False),  # another machine's server on the same port never gets this one's keys
    ("http://127.0.0.1:18099", False),
    ("http://127.0.0.1:99999", False),
])
def test_for_address_finds_the_server_on_the_port_of_this_machine(tmp_path, address, found):
    record = record_for_this_process(tmp_path)
    instances.save(record)
    assert instances.for_address(address) == (record if found else None)


def test_listeners_name_the_process_on_a_port_and_nothing_on_a_free_one():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert instances.listeners(port) == [f"{psutil.Process().name()} pid {os.getpid()}"]
    assert instances.listeners(port) == []


def test_the_client_reads_the_recorded_key_file_before_the_one_in_its_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(write_key_file(tmp_path / "here" / "key_file.json", "local").parent)
    recorded = write_key_file(tmp_path / "workdir" / "key_file.json", "served")
    instances.save(record_for_this_process(tmp_path, key_file=recorded))
    assert tokens.key_file_for("http://127.0.0.1:18080") == recorded
    token = tokens.resolve("management", url="http://127.0.0.1:18081", env={})
    assert (token.value, token.source) == ("served-management", str(recorded))
    unrecorded = tokens.resolve("inference", url="http://127.0.0.1:28080", env={})
    assert (unrecorded.value, unrecorded.source) == ("local-inference", "key_file.json")
    assert tokens.resolve("inference", url="http://127.0.0.1:18080", env={}, default_key_file=False).value is None


def test_a_recorded_server_without_tokens_gets_no_key_from_the_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(write_key_file(tmp_path / "here" / "key_file.json", "local").parent)
    instances.save(record_for_this_process(tmp_path, key_file=None))
    assert tokens.resolve("inference", url="http://127.0.0.1:18080", env={}).value is None


def test_a_refusal_names_the_key_file_of_the_server_that_refused(tmp_path):
    recorded = write_key_file(tmp_path / "workdir" / "key_file.json", "served")
    instances.save(record_for_this_process(tmp_path, key_file=recorded))
    missing = auth_error(tokens.Token(None), "127.0.0.1:18080")
    assert f"its keys are in {recorded}: pass --key-file {recorded}" in str(missing)
    refused = auth_error(tokens.Token("old", source="key_file.json"), "127.0.0.1:18080")
    assert refused.reason == "refused" and f"its keys are in {recorded}" in str(refused)
    elsewhere = auth_error(tokens.Token(None), "127.0.0.1:28080")
    assert "directory it was started from" in str(elsewhere) and str(recorded) not in str(elsewhere)
