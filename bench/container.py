"""`python -m bench container`: the serving image against the same configuration outside a container.

For each gallery (5k = ``artifacts/`` from ``./archive.sh``; 60k = the bench's cached Fashion-MNIST
set, see :mod:`bench.data`) the .mar is staged as KServe's storage initializer leaves /mnt/models
(``pipeline.kserve_deploy.stage_layout``), then three servers run one after the other on that directory:

- ``container``: the serving image from ``scripts/build-images.sh``, run as deploy/kserve/servingruntime.yaml
  describes it (command, args, env, uid), /mnt/models mounted read-only, port 8080 published on loopback;
- ``host nginx`` / ``host aiohttp``: the same ``python -m serving.kserve_runtime`` command on the host, same
  directory, with ``--front nginx`` (the default: nginx sends inference straight to TorchServe) or
  ``--front aiohttp`` (every request through the Python gateway), the two candidates side by side;
- ``torchserve``: TorchServe alone on the host with the same config.properties, requests straight to
  127.0.0.1:8085 (no gateway, no key), to show what the front costs.

``--runtime python`` measures the JRE-free image instead (deploy/kserve/servingruntime-python.yaml) against
``host``, the same ``python -m serving.python_runtime`` command on the host (report container-python.md).

Start-to-ready is timed from the start command until the readiness check answers 200, polled every
0.1 s (container: ``podman run`` to ``/v2/health/ready``, 3 runs). Load is wrk (:mod:`bench.loadgen`)
with the same bodies everywhere: PNG digits POSTed raw to /predictions/embedding, and KServe v1 JSON to
/v1/models/embedding:predict; each server is warmed at c=16 until two consecutive 3 s windows agree
within 5%. Writes bench/results/container.md and container.summary.json (raw/container.json: the full
record). Build options for this kind of machine (no registry, local wheels, TLS proxy) come from --build-args or
$BUILD_IMAGES_ARGS.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from client import ClientError, ManagementClient
from handler.metadata import ModelMetadata
from pipeline.kserve_deploy import API_KEY_ENV, INFERENCE_PORT, METRICS_PORT, TORCHSERVE_METRICS_PORT, stage_layout
from serving.archive import build_mar
from settings import DEFAULT_ARTIFACTS, MODEL_NAME, MODEL_VERSION, REPO
from serving.runtimes import SERVING_RUNTIMES, ServingRuntime
from serving.server import free_ports

from . import env, output
from .run import DEFAULT_CACHE
from .data import FASHION_DIR, serving_data
from .loadgen import LoadError, WrkScript, run_wrk
from .procs import ProcessTree, stop_group
from .series import aggregate, sweep, warm_until_steady
from .stats import fmt, median, summarize

MODEL, VERSION = MODEL_NAME, MODEL_VERSION
IMAGES_JSON = REPO / "build" / "images.json"
#: Host ports the staged config.properties binds (TorchServe's gRPC ports are its defaults).
HOST_PORTS = (INFERENCE_PORT, INFERENCE_PORT + 1, METRICS_PORT, TORCHSERVE_METRICS_PORT, 7070, 7071)
READY_TIMEOUT_S = 180.0
POLL_S = 0.1
#: `podman rm -f -t`: seconds the container gets to stop on SIGTERM before it is killed.
STOP_TIMEOUT_S = 5
BODIES = {"png": f"/predictions/{MODEL}", "v1": f"/v1/models/{MODEL}:predict"}
N_IMAGES = 64
SERVERS = ("container", "host nginx", "host aiohttp", "torchserve")
#: The target: what the image serves, against TorchServe alone, at these concurrencies.
TARGET_CONCURRENCY = (16, 64)
TARGET_RPS_RATIO = 0.9
TARGET_P99_RATIO = 1.2


@dataclass(frozen=True)
class Lineup:
    """The servers one run compares: the image of one serving runtime and what it is measured against."""

    runtime: ServingRuntime  # its ClusterServingRuntime file and image (serving.runtimes)
    servers: tuple[str, ...]
    reference: str  # the `container` row's target is a ratio to this server
    rps_target: float
    p99_target: float | None
    report: str
    servers_text: str
    ready_text: str
    against: str
    target_text: str


LINEUPS = {
    "torchserve": Lineup(
        SERVING_RUNTIMES["torchserve"], SERVERS, "torchserve", TARGET_RPS_RATIO, TARGET_P99_RATIO, "container",
        "`container` = the image as the ServingRuntime runs it (nginx front), port 8080 published on 127.0.0.1; "
        "`host nginx` / `host aiohttp` = `python -m serving.kserve_runtime --front nginx|aiohttp` on the host with "
        "the same /mnt/models directory; `torchserve` = TorchServe alone on the host, same config.properties, "
        f"requests straight to 127.0.0.1:{INFERENCE_PORT} (no front, no key).",
        " (TorchServe alone: a worker READY in its management API)", "TorchServe alone",
        "the req/s of TorchServe alone at c={c}, with p99 no worse than {p99:g}x. Ratios of medians; `host aiohttp` "
        "is the Python gateway the image ran before."),
    "python": Lineup(
        SERVING_RUNTIMES["python"], ("container", "host"), "host",
        0.95, None, "container-python",
        "`container` = the JRE-free image as servingruntime-python.yaml runs it, port 8080 published on 127.0.0.1; "
        "`host` = the same `python -m serving.python_runtime` command on the host with the same /mnt/models "
        "directory (REST on a loopback port, gRPC on another).",
        "", "the python runtime on the host", "itself on the host at c={c} (#39). Ratios of medians."),
}


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def load() -> list[float]:
    return env.load_average()


# --- image and /mnt/models ----------------------------------------------------------------------------

def build_image(build_args: list[str], image: str = "serving") -> dict:
    """scripts/build-images.sh --only IMAGE (cached by content hash); returns build/images.json."""
    cmd = [str(REPO / "scripts" / "build-images.sh"), "--only", image, "--quiet", *build_args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"build-images.sh failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}")
    return json.loads(IMAGES_JSON.read_text())


def gallery_artifacts(name: str) -> Path:
    """Artifact directory of a gallery: 5k = artifacts/ (./archive.sh), 60k = the bench's cached Fashion-MNIST set."""
    if name == "5k":
        if not (DEFAULT_ARTIFACTS / "metadata.json").is_file():
            raise SystemExit(f"no {DEFAULT_ARTIFACTS}: run ./archive.sh first (trains on the bundled MNIST sample)")
        return DEFAULT_ARTIFACTS
    if name == "60k":
        if not FASHION_DIR.is_dir():
            raise SystemExit(f"no {FASHION_DIR}: apt-get install dataset-fashion-mnist")
        return serving_data(None, DEFAULT_CACHE, False, 1, 1, log).artifacts
    raise SystemExit(f"unknown gallery {name!r}: use 5k or 60k")


def stage(artifacts: Path, out: Path) -> Path:
    """/mnt/models as the storage initializer leaves it, readable by the image's uid 10001."""
    mar = build_mar(artifacts, out / "store")
    stage_layout(mar, MODEL, VERSION, out / "mnt-models")
    subprocess.run(["chmod", "-R", "a+rX", str(out)], check=True)
    return out / "mnt-models"


def request_bodies(artifacts: Path) -> dict[str, list[bytes]]:
    """Held-out PNGs of the gallery's dataset (as bench.data draws them), raw and as KServe v1 JSON."""
    pngs = serving_data(artifacts, DEFAULT_CACHE, True, N_IMAGES, 1, log).images
    v1 = [json.dumps({"instances": [{"data": base64.b64encode(p).decode()}]}).encode() for p in pngs]
    return {"png": pngs, "v1": v1}


# --- servers ------------------------------------------------------------------------------------------

def http_status(url: str, timeout: float = 1.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def wait_until(check: Callable[[], bool], alive: Callable[[], bool], started: float, what: str) -> float:
    """Poll `check` every 0.1 s; seconds from `started` until it holds."""
    while not check():
        if not alive():
            raise RuntimeError(f"{what} exited before it was ready")
        if time.perf_counter() - started > READY_TIMEOUT_S:
            raise RuntimeError(f"{what} not ready after {READY_TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
    return time.perf_counter() - started


def torchserve_ready(management_port: int = INFERENCE_PORT + 1) -> bool:
    """A worker of the model is READY (what the gateway's /v2/health/ready asks the management API)."""
    try:
        with ManagementClient(f"http://127.0.0.1:{management_port}", model=MODEL, timeout=1, retries=0) as mgmt:
            return any(w.get("status") == "READY" for m in mgmt.describe() for w in m.get("workers", []))
    except ClientError:
        return False


def ensure_ports_free() -> None:
    for port in HOST_PORTS:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError(f"127.0.0.1:{port} is in use: the staged config.properties needs it")


@dataclass
class Server:
    """One running server: where to send requests, its key, and its process tree on this host."""

    name: str
    base: str
    token: str | None
    start_to_ready_s: float
    tree: ProcessTree
    stop: Callable[[], None]
    extra: dict[str, Any] = field(default_factory=dict)


def runtime_spec(path: Path) -> tuple[list[str], dict[str, str], int | None]:
    """(command, env, uid) of a shipped ServingRuntime's predictor container."""
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (spec,) = doc["spec"]["containers"]
    environ = {e["name"]: e["value"] for e in spec.get("env", []) if "value" in e}
    return spec["command"] + spec["args"], environ, spec.get("securityContext", {}).get("runAsUser")


def start_container(images: dict, mnt: Path, name: str, lineup: Lineup = LINEUPS["torchserve"]) -> Server:
    """`podman run -d` as the ServingRuntime describes it; ready when /v2/health/ready answers 200. On failure its
    last log lines are shown and the container is removed."""
    command, environ, uid = runtime_spec(lineup.runtime.manifest)
    key = secrets.token_hex(16)
    port = free_ports(1)[0]
    base = f"http://127.0.0.1:{port}"
    options = ["-p", f"127.0.0.1:{port}:8080", "-v", f"{mnt}:/mnt/models:ro",
               *[a for k, v in {**environ, API_KEY_ENV: key}.items() for a in ("-e", f"{k}={v}")],
               *(["--user", str(uid)] if uid is not None else []), "--entrypoint", command[0]]
    engine = [images["engine"]]
    cli_env = {**os.environ, "CONTAINERS_CONF": images.get("containers_conf") or ""}
    subprocess.run([*engine, "rm", "-f", name], capture_output=True, env=cli_env)

    def stop() -> None:
        subprocess.run([*engine, "rm", "-f", "-t", str(STOP_TIMEOUT_S), name], capture_output=True, env=cli_env)

    started = time.perf_counter()
    done = subprocess.run([*engine, "run", "-d", "--name", name, *options, images[lineup.runtime.image]["ref"], *command[1:]],
                          capture_output=True, text=True, env=cli_env)
    if done.returncode != 0:
        raise RuntimeError(f"{images['engine']} run failed: {done.stderr.strip()[-300:]}")
    run_s = time.perf_counter() - started

    def alive() -> bool:
        state = subprocess.run([*engine, "inspect", "-f", "{{.State.Running}}", name], capture_output=True,
                               text=True, env=cli_env).stdout.strip()
        return state == "true"

    try:
        ready = wait_until(lambda: http_status(base + "/v2/health/ready") == 200, alive, started, "container")
        pid = int(subprocess.run([*engine, "inspect", "-f", "{{.State.Pid}}", name], capture_output=True,
                                 text=True, env=cli_env, check=True).stdout.strip())
    except BaseException:
        logs = subprocess.run([*engine, "logs", name], capture_output=True, text=True, env=cli_env)
        log("\n".join([ln for ln in (logs.stdout + logs.stderr).splitlines() if "ACCESS_LOG" not in ln][-40:]))
        stop()
        raise
    return Server("container", base, key, ready, ProcessTree(pid), stop, {"run_command_s": run_s})


def start_host(mnt: Path, workdir: Path, front: str | None) -> Server:
    """`python -m serving.kserve_runtime --front FRONT`, (None) `torchserve` alone, or ("python")
    `python -m serving.python_runtime` on the host, same staged directory."""
    gateway = front is not None
    ensure_ports_free()
    workdir.mkdir(parents=True, exist_ok=True)
    store, config = mnt / "model-store", mnt / "config" / "config.properties"
    key = secrets.token_hex(16)
    port = free_ports(1)[0] if gateway else INFERENCE_PORT
    venv_bin = Path(sys.executable).parent
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{venv_bin}:{os.environ['PATH']}",
               "PYTHONPATH": str(REPO), API_KEY_ENV: key}
    if front == "python":
        cmd = [sys.executable, "-m", "serving.python_runtime", f"--model-store={store}", f"--ts-config={config}",
               f"--http-port={port}", "--http-host=127.0.0.1", f"--grpc-port={free_ports(1)[0]}"]
    elif gateway:
        cmd = [sys.executable, "-m", "serving.kserve_runtime", f"--model-store={store}", f"--ts-config={config}",
               f"--http-port={port}", "--http-host=127.0.0.1", f"--front={front}"]
    else:
        cmd = [str(venv_bin / "torchserve"), "--foreground", "--ncs", "--model-store", str(store), "--ts-config",
               str(config)]
    base = f"http://127.0.0.1:{port}"
    check = (lambda: http_status(base + "/v2/health/ready") == 200) if gateway else torchserve_ready
    output = open(workdir / "server.log", "wb")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=workdir, env=environ, stdout=output, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)

    def stop() -> None:
        stop_group(proc, grace=25.0)
        output.close()

    try:
        ready = wait_until(check, lambda: proc.poll() is None, started, " ".join(cmd[:3]))
    except BaseException:
        log((workdir / "server.log").read_text(errors="replace")[-1500:])
        stop()
        raise
    name = "host" if front == "python" else f"host {front}" if gateway else "torchserve"
    return Server(name, base, key if gateway else None, ready,
                  ProcessTree(proc.pid), stop)


# --- load ---------------------------------------------------------------------------------------------

def scripts_for(server: Server, bodies: dict[str, list[bytes]]) -> dict[str, WrkScript]:
    """One wrk script per body kind; v1 bodies are sent as application/json."""
    out = {}
    for kind, path in BODIES.items():
        # The handler reads a v1 body as JSON only when it is labelled so.
        out[kind] = WrkScript.create(path, bodies[kind], server.token,
                                     content_type="application/json" if kind == "v1" else "application/octet-stream")
    return out


def check_answer(server: Server, kind: str, body: bytes) -> None:
    """One request of each kind must answer 200 with an answer in it before the load starts."""
    headers = {"Content-Type": "application/json" if kind == "v1" else "application/octet-stream"}
    if server.token:
        headers["Authorization"] = f"Bearer {server.token}"
    request = urllib.request.Request(server.base + BODIES[kind], data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    if kind == "v1" and "predictions" not in answer:
        raise RuntimeError(f"{server.name}: unexpected v1 answer {str(answer)[:200]}")


def warm_up(server: Server, script: WrkScript) -> list[float]:
    """c=16 windows until the throughput settles (series.warm_until_steady); their req/s."""
    return warm_until_steady(lambda seconds: run_wrk(server.base, script, 16, seconds)["throughput"])["rates"]


def measure(server: Server, bodies: dict[str, list[bytes]], concurrencies: list[int],
            duration_s: int) -> dict[str, Any]:
    """One round on a fresh server: per body kind, a check request, warm-up, then one trial per concurrency."""
    entry: dict[str, Any] = {"start_to_ready_s": server.start_to_ready_s, **server.extra, "load_start": load(),
                             "warmup_rps": {}, "runs": {}}
    scripts = scripts_for(server, bodies)
    try:
        for kind, script in scripts.items():
            check_answer(server, kind, bodies[kind][0])
            entry["warmup_rps"][kind] = warm_up(server, script)
            log(f"  {server.name} {kind}: warm-up windows {[round(r) for r in entry['warmup_rps'][kind]]} req/s")
            entry["runs"][kind] = sweep(lambda c: run_wrk(server.base, script, c, duration_s), concurrencies, 1,
                                        server.tree, None, label=f"{server.name} {kind}", log=log)
        entry["rss_mb"] = round(sum(row["rss_mb"] for row in server.tree.memory()), 1)
    finally:
        for script in scripts.values():
            script.remove()
    entry["load_end"] = load()
    return entry


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A server's rounds -> medians over them per body kind and concurrency (bench.series.aggregate)."""
    ok = [r for r in rounds if "runs" in r]
    out: dict[str, Any] = {"rounds": rounds, "runs": {}}
    if not ok:
        return {**out, "error": "; ".join(r.get("error", "?") for r in rounds)}
    for kind in ok[0]["runs"]:
        out["runs"][kind] = [aggregate(row["concurrency"], [t for r in ok for rr in r["runs"][kind]
                                                            if rr["concurrency"] == row["concurrency"]
                                                            for t in rr["trials"]])
                             for row in ok[0]["runs"][kind]]
    for key in ("start_to_ready_s", "stop_s", "rss_mb"):
        out[key] = summarize(r.get(key) for r in ok)
    return out


def run_gallery(name: str, images: dict, args: argparse.Namespace, root: Path,
                lineup: Lineup = LINEUPS["torchserve"]) -> dict[str, Any]:
    """Start-to-ready runs of the container, then `trials` rounds of the three servers, one at a time.

    Each round starts every server afresh and alternates their order, so that a drift in the machine's
    load (other work shares it) does not all land on one server.
    """
    artifacts = gallery_artifacts(name)
    meta = ModelMetadata.read(artifacts)
    mnt = stage(artifacts, root / name)
    bodies = request_bodies(artifacts)
    result: dict[str, Any] = {"artifacts": str(artifacts), "dataset": meta.dataset_name,
                              "gallery_size": meta.index["size"], "index": meta.index["type"],
                              "mar_mb": round(next((mnt / "model-store").glob("*.mar")).stat().st_size / 1e6, 2)}
    starts = []
    errors = []
    for i in range(args.starts):
        try:
            server = start_container(images, mnt, f"bench-container-{name}-{secrets.token_hex(3)}", lineup)
        except RuntimeError as exc:
            log(f"{name}: container start {i + 1} failed: {exc}")
            errors.append(str(exc))
            continue
        starts.append(server.start_to_ready_s)
        log(f"{name}: container start to ready {server.start_to_ready_s:.2f} s (run {i + 1}/{args.starts}), "
            f"load {load()}")
        server.stop()
    result["container_start_to_ready_s"] = summarize(starts)
    result["container_start_errors"] = errors
    every: dict[str, Callable[[], Server]] = {
        "container": lambda: start_container(images, mnt, f"bench-container-{name}-{secrets.token_hex(3)}", lineup),
        "host nginx": lambda: start_host(mnt, root / name / "host-nginx", front="nginx"),
        "host aiohttp": lambda: start_host(mnt, root / name / "host-aiohttp", front="aiohttp"),
        "torchserve": lambda: start_host(mnt, root / name / "torchserve", front=None),
        "host": lambda: start_host(mnt, root / name / "host-python", front="python"),
    }
    starters = {k: every[k] for k in lineup.servers}
    rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in starters}
    for trial in range(args.trials):
        order = list(starters) if trial % 2 == 0 else list(starters)[::-1]
        for server_name in order:
            entry: dict[str, Any] = {}
            current = None
            try:
                current = starters[server_name]()
                log(f"{name} round {trial + 1}: {server_name} ready in {current.start_to_ready_s:.2f} s, load {load()}")
                entry = measure(current, bodies, args.concurrency, args.duration)
            except (LoadError, RuntimeError, OSError) as exc:
                log(f"{name}: {server_name} failed: {exc}")
                entry["error"] = str(exc)
            finally:
                if current is not None:
                    stopping = time.perf_counter()
                    current.stop()
                    entry["stop_s"] = round(time.perf_counter() - stopping, 2)
            rounds[server_name].append(entry)
    result["servers"] = {k: combine(v) for k, v in rounds.items()}
    return result


# --- report -------------------------------------------------------------------------------------------

def row_at(entry: dict, kind: str, concurrency: int) -> dict | None:
    return next((r for r in entry.get("runs", {}).get(kind, []) if r["concurrency"] == concurrency), None)


def ratio(a: dict | None, b: dict | None) -> str:
    x, y = (median(r["throughput"]) if r else None for r in (a, b))
    return f"{x / y:.2f}" if x and y else "n/a"


def p99_ratio(a: dict | None, b: dict | None) -> str:
    x, y = (median(r["p99_ms"]) if r else None for r in (a, b))
    return f"{x / y:.2f}" if x and y else "n/a"


def cpu_per_request(row: dict) -> str:
    """The server's CPU µs per answered request (100% CPU = one core for one second)."""
    cpu, rps = median(row["server_cpu_pct"]), median(row["throughput"])
    return f"{cpu / 100 / rps * 1e6:.0f}" if cpu and rps else "n/a"


def target_status(served: dict | None, alone: dict | None, concurrency: int, rps_target: float = TARGET_RPS_RATIO,
                  p99_target: float | None = TARGET_P99_RATIO) -> str:
    """met or missed: `served`'s req/s at least `rps_target` times `alone`'s and (unless None) its p99 at most
    `p99_target` times."""
    if concurrency not in TARGET_CONCURRENCY:
        return ""
    if not served or not alone:
        return "n/a"
    rps = median(served["throughput"]) / median(alone["throughput"])
    p99 = median(served["p99_ms"]) / median(alone["p99_ms"])
    met = rps >= rps_target and (p99_target is None or p99 <= p99_target)
    return f"{'met' if met else '**missed**'} ({rps:.2f}x req/s, {p99:.2f}x p99)"


def markdown(results: dict) -> str:
    image = results["image"]
    lineup = LINEUPS[results.get("runtime", "torchserve")]
    servers, others = lineup.servers, [k for k in lineup.servers if k != lineup.reference]
    concurrencies = " and c=".join(map(str, TARGET_CONCURRENCY))
    lines = [
        "# Serving image vs the same configuration outside a container", "",
        f"Started {results['started']}, took {results['duration_s']:.0f} s. Command: `{results['command']}`", "",
        f"- Machine: {results['machine']['cpu_model']}, {results['machine']['logical_cores']} logical cores, "
        f"{results['machine']['memory_gib']} GiB; engine {image['engine']} (runtime from {image['containers_conf']}); "
        "no CPU/memory limits applied to the container",
        f"- Load average (1/5/15 min): start {results['load_start']}, end {results['load_end']}; per server below",
        f"- Image `{image['ref']}`: {image['size_bytes'] / 1e6:.0f} MB",
        f"- Load: wrk -t1, {results['settings']['trials']} trials x {results['settings']['duration_s']} s per figure "
        "(median, min-max in parentheses), after warming up at c=16 until two 3 s windows agree within 5%; "
        f"{N_IMAGES} held-out PNG digits (dark on white, 112x112) cycled, raw to `{BODIES['png']}` or as KServe v1 "
        f"`{{\"instances\": [{{\"data\": <base64>}}]}}` to `{BODIES['v1']}`. CPU: 100% = one core, per process tree "
        "(container: its PID 1 and descendants, seen from the host).",
        f"- Servers: {lineup.servers_text} CPU µs/request = the server's CPU time per answered request (its whole "
        "process tree): the cost that decides throughput once both cores are busy, and the figure least disturbed by "
        "other work on the machine.",
        "",
        "## Start to ready", "",
        f"Container: from `{image['engine']} run -d` until `/v2/health/ready` answers 200, polled every 0.1 s (the "
        "gateway caches readiness for 1 s), on an otherwise idle server; the other columns are the starts of the "
        f"load rounds, polled the same way{lineup.ready_text}. Stop = "
        f"`{image['engine']} rm -f -t {STOP_TIMEOUT_S}` / SIGTERM to the host process group until all exited.",
        "",
        "| gallery | container s | " + " | ".join("container (load rounds) s" if k == "container" else f"{k} s"
                                               for k in servers)
        + f" | stop s ({' / '.join(servers)}) | .mar MB |", "|---" * (len(servers) + 4) + "|",
    ]
    for name, g in results["galleries"].items():
        s = g["servers"]
        ready = " | ".join(fmt(s[k].get("start_to_ready_s"), 2) for k in servers)
        stops = " / ".join(fmt(s[k].get("stop_s"), 1) for k in servers)
        lines.append(f"| {name} ({g['gallery_size']:,}, {g['index']}) | {fmt(g['container_start_to_ready_s'], 2)} | "
                     f"{ready} | {stops} | {g['mar_mb']} |")
    lines += ["", "## Throughput and latency", "",
              "| gallery | body | server | c | req/s | p50 ms | p99 ms | errors | server CPU % | server CPU µs/request "
              "| load gen CPU % |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, g in results["galleries"].items():
        for kind in BODIES:
            for server in servers:
                entry = g["servers"][server]
                if "error" in entry:
                    lines.append(f"| {name} | {kind} | {server} | | error: {entry['error'][:200]} | | | | | | |")
                    continue
                for r in entry["runs"].get(kind, []):
                    lines.append(f"| {name} | {kind} | {server} | {r['concurrency']} | {fmt(r['throughput'], 0)} | "
                                 f"{fmt(r['p50_ms'], 1)} | {fmt(r['p99_ms'], 1)} | {r['errors']} | "
                                 f"{fmt(r['server_cpu_pct'], 0)} | {cpu_per_request(r)} | "
                                 f"{fmt(r['loadgen_cpu_pct'], 0)} |")
    lines += ["", f"## Against {lineup.against}", "",
              f"Target: the image (`container`) serves >= {lineup.rps_target:g}x "
              + lineup.target_text.format(c=concurrencies, p99=lineup.p99_target or 0), "",
              "| gallery | body | c | " + " | ".join([f"{k} req/s" for k in others] + [f"{k} p99" for k in others])
              + " | target (container) |", "|---" * (2 * len(others) + 4) + "|"]
    for name, g in results["galleries"].items():
        for kind in BODIES:
            for c in results["settings"]["concurrency"]:
                rows = {k: row_at(g["servers"][k], kind, c) for k in servers}
                alone = rows[lineup.reference]
                cells = [ratio(rows[k], alone) for k in others] + [p99_ratio(rows[k], alone) for k in others]
                lines.append(f"| {name} | {kind} | {c} | {' | '.join(cells)} | "
                             f"{target_status(rows['container'], alone, c, lineup.rps_target, lineup.p99_target)} |")
    lines += ["", "## Rounds: load average (1/5/15 min) before and after each server's load, RSS after it", "",
              "| gallery | server | round | load start | load end | RSS MB | warm-up windows req/s (png; v1) |",
              "|---|---|---|---|---|---|---|"]
    for name, g in results["galleries"].items():
        for server in servers:
            for i, r in enumerate(g["servers"][server]["rounds"], 1):
                warm = "; ".join(", ".join(f"{v:.0f}" for v in r.get("warmup_rps", {}).get(k, [])) for k in BODIES)
                lines.append(f"| {name} | {server} | {i} | {r.get('load_start')} | {r.get('load_end')} | "
                             f"{r.get('rss_mb', 'n/a')} | {warm or r.get('error', '')} |")
    return "\n".join(lines) + "\n"


# --- main ---------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench container", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=int, default=20, help="seconds per load trial (default 20)")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated concurrencies (default 1,16,64)")
    p.add_argument("--trials", type=int, default=2, help="trials per figure (default 2)")
    p.add_argument("--starts", type=int, default=3, help="container start-to-ready runs per gallery (default 3)")
    p.add_argument("--gallery", default="5k,60k", help="comma-separated: 5k (artifacts/), 60k (Fashion-MNIST)")
    p.add_argument("--runtime", choices=sorted(LINEUPS), default="torchserve",
                   help="the serving image to measure (default torchserve; python: the JRE-free image against "
                        "the python runtime on the host, report container-python.md)")
    p.add_argument("--build-args", default=os.environ.get("BUILD_IMAGES_ARGS", ""),
                   help="extra scripts/build-images.sh options (default $BUILD_IMAGES_ARGS)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="output directory")
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    return args


def command_line(argv: list[str]) -> str:
    """The command as run, with $BUILD_IMAGES_ARGS when the build options came from it."""
    line = shlex.join([".venv/bin/python", "-m", "bench", "container", *argv])
    if os.environ.get("BUILD_IMAGES_ARGS") and not any(a.startswith("--build-args") for a in argv):
        line = f"BUILD_IMAGES_ARGS={shlex.quote(os.environ['BUILD_IMAGES_ARGS'])} {line}"
    return line


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (shutil.which("podman") or shutil.which("docker")):
        print("bench.container: neither podman nor docker is installed", file=sys.stderr)
        return 2
    started = time.time()
    lineup = LINEUPS[args.runtime]
    results = {"schema_version": 1, "runtime": args.runtime, "started": datetime.now(UTC).isoformat(timespec="seconds"),
               "command": command_line(argv if argv is not None else sys.argv[1:]), "machine": env.machine(),
               "versions": env.versions(), "load_start": load(),
               "settings": {"trials": args.trials, "duration_s": args.duration, "concurrency": args.concurrency,
                            "starts": args.starts, "build_args": args.build_args, "request_images": N_IMAGES}}
    log("building/checking the serving image")
    images = build_image(shlex.split(args.build_args), lineup.runtime.image)
    results["image"] = {"engine": images["engine"], "containers_conf": images.get("containers_conf"),
                        **{k: images[lineup.runtime.image][k] for k in ("ref", "id", "size_bytes")}}
    results["galleries"] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-container-") as tmp:
        os.chmod(tmp, 0o755)  # the image's uid 10001 reads the staged directory through the bind mount
        for name in args.gallery.split(","):
            log(f"gallery {name}")
            results["galleries"][name] = run_gallery(name, images, args, Path(tmp), lineup)
            write(results, args.out, started)  # a later gallery's failure keeps this one's figures
    log(f"wrote {args.out}/{lineup.report}.md and {lineup.report}.summary.json in {results['duration_s']:.0f} s")
    return 0


def write(results: dict, out: Path, started: float) -> None:
    results["load_end"] = load()
    results["duration_s"] = round(time.time() - started, 1)
    output.write(out, LINEUPS[results["runtime"]].report, results, markdown(results))


if __name__ == "__main__":
    sys.exit(main())
