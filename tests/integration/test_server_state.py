"""The running server found from any directory (#36): every start records it (torchserve_api.instances), so
`serving stop` and the client find its workdir, key file and ports wherever they run; `serving stop` names what
it did not start; Ctrl-C during start leaves no server; model_store= in the config is honoured; --mar loads
several versions without editing a tracked file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from support.signals import ctrl_c_as_at_a_terminal
from support.torchserve import torchserve_processes

from client import EmbeddingClient, tokens
from client.errors import AuthError
from serving.archive import build_mar
from serving.ports import port_taken
from serving.samples import write_samples
from serving.server import Instance, model_status, private_instance, stop
from settings import MODEL_CONFIG_FILE, REPO
from torchserve_api import instances

#: A model name no repository model_store/ holds: a start that ignored model_store= could not find it.
NAME = "found-anywhere"
ONE_WORKER = MODEL_CONFIG_FILE.read_text().replace("minWorkers: 2", "minWorkers: 1").replace("maxWorkers: 2",
                                                                                             "maxWorkers: 1")
START_TIMEOUT = 240


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_artifacts) -> Path:
    """NAME.mar (1.0) and NAME-2.0.mar, one worker each."""
    root = tmp_path_factory.mktemp("state-store")
    config = root / "model-config.yaml"
    config.write_text(ONE_WORKER)
    build_mar(tiny_artifacts, root / "store", NAME, model_config=config)
    build_mar(tiny_artifacts, root / "v2", NAME, "2.0", model_config=config).replace(root / "store" / f"{NAME}-2.0.mar")
    return root / "store"


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    """This test's own record folder, here and in the commands it runs."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A directory that is neither the repository nor the server's workdir, with a key file of no server in it."""
    folder = tmp_path / "elsewhere"
    (folder / "empty").mkdir(parents=True)
    (folder / "key_file.json").write_text('{"inference": {"key": "stale"}, "management": {"key": "stale"}}')
    return folder


def serving(env: dict[str, str], cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def ports_free(instance: Instance) -> bool:
    """Whether a server could listen on every port of the config now (as servers bind: SO_REUSEADDR, so the
    TIME_WAIT of connections the stopped server closed does not count)."""
    return not any(port_taken("127.0.0.1", port) for port in instance.endpoints.ports().values())


@pytest.mark.serving
def test_a_server_started_anywhere_is_found_and_stopped_from_anywhere(store, tmp_path, env, elsewhere, monkeypatch):
    instance = private_instance(tmp_path / "ts", model_store=str(store))
    instance = Instance(instance.workdir, instance.config, NAME)
    config, workdir = str(instance.config), str(instance.workdir)
    try:
        started = serving(env, REPO, "--config", config, "--workdir", workdir, "--model-name", NAME, "start",
                          "--mar", f"{NAME}.mar", "--mar", f"{NAME}-2.0.mar", "--timeout", str(START_TIMEOUT),
                          timeout=START_TIMEOUT + 60)
        assert started.returncode == 0, started.stderr
        assert sorted(v["modelVersion"] for v in model_status(instance)) == ["1.0", "2.0"]
        [record] = instances.running()
        assert (record.workdir, record.config, record.model_store) == (workdir, config, str(store))

        refused = serving(env, elsewhere, "--config", config, "--workdir", str(elsewhere / "empty"), "start",
                          "--model-store", str(store), "--mar", f"{NAME}.mar")
        port = instance.endpoints.ports()["inference"]
        assert refused.returncode == 1 and f"port {port} (inference) is already in use by TorchServe pid " \
            f"{record.pid} of {workdir} (python -m serving --workdir {workdir} stop)" in refused.stderr

        monkeypatch.chdir(elsewhere)
        token = tokens.resolve("inference", url=instance.endpoints.inference, env={})
        assert token.source == str(instance.key_file)
        digit = write_samples(tmp_path / "samples")[7]
        with EmbeddingClient(instance.endpoints.inference, model=NAME, version="2.0", token=token) as client:
            assert client.predict(digit)["model_version"] == "2.0"
        stale = tokens.resolve("inference", key_file=elsewhere / "key_file.json", env={})
        with EmbeddingClient(instance.endpoints.inference, model=NAME, token=stale, retries=0) as client:
            with pytest.raises(AuthError, match=f"its keys are in {instance.key_file}"):
                client.predict(digit)

        stopped = serving(env, elsewhere, "--config", config, "--workdir", str(elsewhere / "empty"), "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == f"TorchServe stopped ({workdir}, on the ports of {config})"
        assert instances.running() == [] and torchserve_processes(instance.workdir) == []
        assert ports_free(instance)
    finally:
        stop(instance)


def test_stop_names_what_holds_the_ports_and_leaves_it_running(tmp_path, env):
    instance = private_instance(tmp_path / "ts")
    port = instance.endpoints.ports()["management"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        result = serving(env, tmp_path, "--config", str(instance.config), "--workdir", str(instance.workdir), "stop")
        assert result.returncode == 1 and result.stdout == ""
        [line] = result.stderr.splitlines()
        assert line == (f"serving: error: port {port} (management) is held by {psutil.Process().name()} pid "
                        f"{os.getpid()}: no project command recorded starting it, so it is left running; stop it "
                        "yourself or pass --config with other ports")
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.serving
def test_ctrl_c_during_start_leaves_no_server(store, tmp_path, env):
    instance = private_instance(tmp_path / "ts", model_store=str(store), load_models=f"{NAME}.mar")
    instance = Instance(instance.workdir, instance.config, NAME)
    pid_file = instance.tmpdir / ".model_server.pid"
    command = [sys.executable, "-m", "serving", "--config", str(instance.config), "--workdir", str(instance.workdir),
               "--model-name", NAME, "start", "--timeout", str(START_TIMEOUT)]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_as_at_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and instance.pid()) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert instance.pid() is not None, "TorchServe's frontend never started"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 130 and out == ""
        assert err.splitlines() == ["serving: error: interrupted"]
        assert torchserve_processes(instance.workdir) == [] and ports_free(instance)
        assert instances.running() == []
    finally:
        if proc.poll() is None:
            proc.kill()
        stop(instance)


@pytest.mark.serving
def test_the_python_runtime_is_started_found_and_stopped_as_torchserve_is(store, tmp_path, env, elsewhere):
    """`serving start --runtime python`: the same archives on the config's ports, its key where the client finds
    it, raw image bytes as `curl --data-binary` labels them answered, and `serving stop` from anywhere."""
    instance = private_instance(tmp_path / "py", model_store=str(store), load_models=f"{NAME}.mar")
    instance = Instance(instance.workdir, instance.config, NAME)
    config, workdir = str(instance.config), str(instance.workdir)
    try:
        started = serving(env, REPO, "--config", config, "--workdir", workdir, "--model-name", NAME, "start",
                          "--runtime", "python", "--mar", f"{NAME}.mar", "--mar", f"{NAME}-2.0.mar",
                          timeout=START_TIMEOUT)
        assert started.returncode == 0, started.stderr
        url = instance.endpoints.inference
        assert started.stdout.splitlines()[0].startswith("python runtime READY in ")
        assert started.stdout.splitlines()[0].endswith(f": {url}/predictions/{NAME}")
        [record] = instances.running()
        assert (record.runtime, record.workdir, record.key_file) == ("python", workdir, str(instance.key_file))
        assert oct(instance.key_file.stat().st_mode & 0o777) == "0o600"
        served = psutil.Process(record.pid)
        processes = [served, *served.children(recursive=True)]
        assert len(processes) == 2, "one supervisor and the archive's one worker"

        digit = write_samples(tmp_path / "samples")[7]
        predicted = subprocess.run([sys.executable, "-m", "client", "predict", str(digit), "--model-name", NAME,
                                    "--config", config], cwd=elsewhere, env=env, capture_output=True, text=True,
                                   timeout=60)
        assert predicted.returncode == 0, predicted.stderr
        assert json.loads(predicted.stdout.splitlines()[0])["pred"] == "7"
        token = tokens.resolve("inference", url=url, env={})
        assert token.source == str(instance.key_file)
        with EmbeddingClient(url, model=NAME, version="2.0", token=token) as client:
            assert client.predict(digit)["model_version"] == "2.0"
        request = urllib.request.Request(f"{url}/predictions/{NAME}", data=digit.read_bytes(), method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded",
                                                  **token.header()})
        with urllib.request.urlopen(request, timeout=30) as response:  # curl --data-binary @digit_7.png
            assert json.loads(response.read())["pred"] == "7"

        refused = serving(env, elsewhere, "--config", config, "--workdir", workdir, "start")
        assert refused.returncode == 1
        assert refused.stderr.strip() == f"serving: error: python runtime pid {record.pid} of {workdir} is running; " \
                                         "stop it first"
        status = subprocess.run([sys.executable, "-m", "client", "status", "--config", config], cwd=instance.workdir,
                                env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 2 and status.stdout == ""
        assert status.stderr.strip() == f"client: error: python runtime pid {record.pid} of {workdir} serves {url} " \
            "and has no management API: status, list, register, set-default, unregister and scale need TorchServe " \
            "(python -m serving stop, then python -m serving start)"

        stopped = serving(env, elsewhere, "--config", config, "--workdir", str(elsewhere / "empty"), "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == f"python runtime stopped ({workdir}, on the ports of {config})"
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)
        assert instances.running() == [] and not instance.key_file.exists() and ports_free(instance)
    finally:
        stop(instance)
