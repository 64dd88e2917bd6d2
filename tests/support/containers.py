"""Build the project's images with scripts/build-images.sh and run containers as a cluster would.

The engine and its settings (podman with runc and a containers.conf here) are the ones the build script
chose, read from build/images.json. The build options this kind of machine needs (a local Debian base,
runc, the local torch wheel directory, the proxy's CA bundle) are found here, or taken verbatim from
BUILD_IMAGES_ARGS.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from support.kserve_compose import compose

from pipeline.kserve_deploy import API_KEY_ENV, cluster_runtime
from pipeline.manifests import engine_limit_args
from settings import REPO
from serving.runtimes import DEFAULT_SERVING_RUNTIME, SERVING_RUNTIMES
from serving.server import free_ports

IMAGES_JSON = REPO / "build" / "images.json"
SERVING_RUNTIME = SERVING_RUNTIMES[DEFAULT_SERVING_RUNTIME].manifest
BUILD_TIMEOUT_S = 1500


def engine_or_reason() -> tuple[str | None, str]:
    """(docker|podman, '') when one can run containers here, else (None, why not)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0:
        return "docker", ""
    if shutil.which("podman"):
        return "podman", ""
    return None, "neither a docker daemon nor podman is available to run containers"


def _pip_setting(name: str) -> str:
    out = subprocess.run(["pip", "config", "get", f"global.{name}"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def machine_build_args(engine: str) -> list[str]:
    """build-images.sh options for a machine like this one (no registry, local torch wheel, TLS proxy)."""
    if "BUILD_IMAGES_ARGS" in os.environ:
        return shlex.split(os.environ["BUILD_IMAGES_ARGS"])
    args = ["--engine", engine]
    if engine == "podman":
        if shutil.which("mmdebstrap"):
            args.append("--local-base")
        if shutil.which("runc"):
            args += ["--runtime", "runc"]
        links = _pip_setting("find-links")
        if links and Path(links).is_dir() and any(Path(links).glob("torch-*.whl")):
            args += ["--find-links", links]
        cert = os.environ.get("PIP_CERT") or _pip_setting("cert")
        if cert and Path(cert).is_file():
            args += ["--ca-bundle", cert]
    return args


def build_images(engine: str, only: str | None = None) -> dict:
    """Run scripts/build-images.sh (cached by content hash) and return build/images.json."""
    args = [str(REPO / "scripts" / "build-images.sh"), *machine_build_args(engine), "--quiet"]
    if only:
        args += ["--only", only]
    started = time.monotonic()
    result = subprocess.run(args, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if result.returncode != 0:
        raise AssertionError(f"build-images.sh failed ({result.returncode}):\n{result.stdout}\n{result.stderr[-3000:]}")
    print(f"build-images.sh {' '.join(args[1:])}: {time.monotonic() - started:.1f} s\n{result.stdout}")
    return json.loads(IMAGES_JSON.read_text())


def runtime_container(path: Path = SERVING_RUNTIME) -> dict:
    """The predictor container of the shipped ServingRuntime: command, args, env, resources (no ports, no probes:
    the InferenceService brings those, see predictor_container)."""
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (container,) = doc["spec"]["containers"]
    return container


def predictor_container(manifest: dict, path: Path = SERVING_RUNTIME) -> dict:
    """The predictor's container as KServe makes it from the shipped ServingRuntime and the InferenceService
    `manifest` (support.kserve_compose.compose): command, args, env, its one port, probes, resources."""
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return compose(doc, manifest)


@dataclass
class Container:
    """One running container, driven through the engine's CLI."""

    engine: str
    name: str
    conf: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def _env(self) -> dict[str, str]:
        return {**os.environ, **({"CONTAINERS_CONF": self.conf} if self.conf else {})}

    def _cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([self.engine, *args], capture_output=True, text=True, timeout=timeout,
                                env=self._env())
        if check and result.returncode != 0:
            raise AssertionError(f"{self.engine} {' '.join(args[:3])}... failed: {result.stderr[-2000:]}")
        return result

    @classmethod
    def run(cls, images: dict, image: str, name: str, command: list[str], env: dict[str, str],
            mounts: dict[Path, str], ports: dict[int, int], user: int | None = None,
            limits: dict[str, str] | None = None) -> "Container":
        """`engine run -d` with read-only mounts {host: container path} and ports {host port: container port}.

        `limits` are a Kubernetes container's `resources.limits` (cpu, memory), enforced as the kubelet does.
        """
        self = cls(images["engine"], name, images.get("containers_conf"))
        self._cli("rm", "-f", name, check=False)
        args = ["run", "-d", "--name", name, *engine_limit_args(limits or {})]
        for host, inside in mounts.items():
            args += ["-v", f"{host}:{inside}:ro"]
        for host_port, port in ports.items():
            args += ["-p", f"127.0.0.1:{host_port}:{port}"]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        if user is not None:
            args += ["--user", str(user)]
        args += ["--entrypoint", command[0], image, *command[1:]]
        self._cli(*args)
        return self

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended a process of the container (as Kubernetes reports OOMKilled)."""
        out = self._cli("inspect", "-f", "{{.State.OOMKilled}}", self.name).stdout.strip()
        return out == "true"

    def limits(self) -> dict[str, float]:
        """The limits the engine applied: {"cpus": cores, "memory": bytes} (0 = none)."""
        out = self._cli("inspect", "-f", "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}", self.name).stdout.split()
        return {"cpus": int(out[0]) / 1e9, "memory": float(out[1])}

    def state(self) -> tuple[str, int]:
        out = self._cli("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", self.name).stdout.split()
        return out[0], int(out[1])

    def logs(self, since: str | None = None) -> str:
        """Its log, stdout and stderr in the order written (as the kubelet keeps it), or the part written from
        `since` (an RFC 3339 time) on."""
        result = subprocess.run([self.engine, "logs", *(["--since", since] if since else []), self.name],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                                env=self._env())
        return result.stdout

    def inspect(self) -> dict:
        return json.loads(self._cli("inspect", "--format", "json", self.name).stdout)[0]

    def start(self) -> None:
        self._cli("start", self.name)

    def kill(self, signal: str = "KILL") -> None:
        self._cli("kill", "--signal", signal, self.name)

    def usage(self) -> tuple[float, float]:
        """(CPU cores in use, memory bytes in use), as the engine's stats report them now."""
        (stats,) = json.loads(self._cli("stats", "--no-stream", "--format", "json", self.name).stdout)
        used = stats["mem_usage"].split("/")[0].strip()
        number, unit = re.match(r"^([\d.]+)\s*([kKMGT]?i?B)$", used).groups()
        scale = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 1024, "MiB": 1024 ** 2,
                 "GiB": 1024 ** 3}[unit]
        return float(stats["cpu_percent"].rstrip("%")) / 100, float(number) * scale

    def exec_python(self, code: str) -> str:
        return self._cli("exec", self.name, "python", "-c", code).stdout

    def stop(self, timeout_s: int = 30) -> float:
        started = time.monotonic()
        self._cli("stop", "-t", str(timeout_s), self.name, timeout=timeout_s + 30)
        return time.monotonic() - started

    def wait_exit(self, timeout_s: float) -> tuple[str, int, float]:
        """Wait for "exited": podman passes through "stopped" (process gone, exit code not yet recorded) first."""
        started = time.monotonic()
        while True:
            status, code = self.state()
            elapsed = time.monotonic() - started
            if status == "exited" or elapsed > timeout_s:
                return status, code, elapsed
            time.sleep(0.25)

    def remove(self) -> None:
        self._cli("rm", "-f", self.name, check=False)


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 5) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for_probe(base_url: str, probe: dict, timeout_s: float, container: Container | None = None) -> float:
    """Poll the probe's httpGet path as the kubelet would, until it answers 200; returns the seconds taken."""
    path = probe["httpGet"]["path"]
    period = float(probe.get("periodSeconds", 10))
    started = time.monotonic()
    time.sleep(float(probe.get("initialDelaySeconds", 0)))
    while True:
        try:
            status, _ = http_get(base_url + path, timeout=float(probe.get("timeoutSeconds", 1)))
        except OSError:
            status = 0
        if status == 200:
            return time.monotonic() - started
        if container is not None and container.state()[0] == "exited":
            raise AssertionError(f"container exited before {path} answered:\n{container.logs()[-3000:]}")
        if time.monotonic() - started > timeout_s:
            logs = container.logs()[-3000:] if container else ""
            raise AssertionError(f"{path} not 200 after {timeout_s:.0f} s (last {status}):\n{logs}")
        time.sleep(min(period, 1.0))


def predictor_limits(manifest: dict, spec: dict) -> dict[str, str]:
    """The limits a cluster puts on the predictor: the InferenceService's model resources over the runtime's."""
    runtime = spec.get("resources", {}).get("limits", {})
    model = manifest["spec"]["predictor"]["model"].get("resources", {}).get("limits", {})
    return {**runtime, **model}


def for_runtime(manifest: dict, runtime: str) -> dict:
    """The InferenceService `manifest` naming the project's ClusterServingRuntime of serving runtime `runtime`."""
    out = json.loads(json.dumps(manifest))
    out["spec"]["predictor"]["model"]["runtime"] = cluster_runtime(runtime)
    return out


def start_predictor(images: dict, mnt_models, name: str,
                    runtime: str = DEFAULT_SERVING_RUNTIME) -> tuple[Container, str, str, dict]:
    """Run the serving image of `runtime` (serving.runtimes.SERVING_RUNTIMES) as KServe composes its
    ClusterServingRuntime and the InferenceService; returns (container, url, key, spec).

    `spec` is the composed container (predictor_container). Published, each on a free host port: its declared port
    (REST 8080, or h2c 8081 for grpc-v2), which the returned spec's `ports` give as `hostPort`, and the port its
    readiness probe calls (the REST port), which the kubelet or Knative's queue-proxy reach inside the pod; `url`
    is that REST one.
    """
    models_dir, manifest = mnt_models
    served = SERVING_RUNTIMES[runtime]
    manifest = for_runtime(manifest, runtime)
    spec = predictor_container(manifest, served.manifest)
    key = secrets.token_hex(16)
    env = {}
    for entry in spec.get("env", []):  # the runtime's and the InferenceService's, the Secret's value filled in
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif entry.get("valueFrom", {}).get("secretKeyRef"):
            env[entry["name"]] = key
    assert env[API_KEY_ENV] == key
    rest = spec["readinessProbe"]["httpGet"]["port"]
    declared = {p["containerPort"]: p for p in spec.get("ports", [])}
    wanted = [*declared, *([rest] if rest not in declared else [])]
    published = dict(zip(wanted, free_ports(len(wanted))))
    spec = {**spec, "ports": [{**p, "hostPort": published[port]} for port, p in declared.items()]}
    container = Container.run(images, images[served.image]["ref"], name, spec["command"] + spec["args"], env,
                              {models_dir: "/mnt/models"}, {host: port for port, host in published.items()},
                              user=spec.get("securityContext", {}).get("runAsUser"),
                              limits=predictor_limits(manifest, spec))
    return container, f"http://127.0.0.1:{published[rest]}", key, spec


def post(url: str, body: dict | bytes, key: str | None, content_type: str = "application/json") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def client_pythons(*names: str) -> dict[str, str]:
    """{client name: the python of its venv} for requirements/clients/NAME.txt (all without names), made or found
    cached by scripts/client-venvs.sh."""
    result = subprocess.run([str(REPO / "scripts" / "client-venvs.sh"), *names], capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())
