"""nginx in front of TorchServe: the serving image's port 8080 without a Python hop on the hot paths.

The Python gateway (:mod:`serving.gateway.app`) costs a third of TorchServe's throughput on a 2-core pod: every
request is read, parsed and sent again by one Python process. nginx does the same forwarding in C for a tenth of
that CPU. So nginx (Debian's, with lua-nginx-module) listens on the port KServe routes to and

- sends ``/predictions/<m>[/<v>]`` and KServe v1 ``/v1/models/<m>:predict`` straight to TorchServe (the handler
  reads raw images and v1 JSON itself), with the bearer key checked in nginx;
- sends everything else to the Python gateway on loopback: health, readiness and metadata, Open Inference v2
  (its binary tensor extension and binary outputs are written there), v1 bodies with a Content-Encoding (which
  aiohttp inflates) and form-labelled image bodies (``curl --data-binary``), which the gateway relabels;
- keeps the gateway's contract (``serving/nginx/front.lua``): the key compared in constant time, the drain
  (``Connection: close`` on every answer from SIGTERM on, then 503), requests in flight counted for the
  drain, and the request-duration histogram the alerts read, which the gateway serves on its metrics port.

The gateway drives it through a Unix socket only it can reach (:class:`Front`), and serves the histogram nginx
keeps as its own (:func:`front_histogram`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import ClientError, ClientSession, ClientTimeout, UnixConnector
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from serving.gateway_metrics import BUCKETS, LABELS, REQUEST_SECONDS, REQUEST_SECONDS_HELP

logger = logging.getLogger("kserve_runtime")

LUA_DIR = Path(__file__).with_name("nginx")
MODULES_DIR = Path("/usr/lib/nginx/modules")
#: Debian's lua-nginx-module needs the NDK module loaded first.
MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")
#: Debian package names, for the error message when nginx cannot run.
PACKAGES = "nginx libnginx-mod-http-lua"
#: How long nginx may take to answer on its control socket after it was started.
START_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 2.0


class FrontError(Exception):
    """nginx cannot be run in front of TorchServe; the message says why (one line)."""


@dataclass(frozen=True)
class FrontSettings:
    """What the nginx configuration is rendered from."""

    host: str
    port: int
    torchserve: str  # TorchServe's inference address, e.g. http://127.0.0.1:8085
    gateway_port: int  # the Python gateway, on 127.0.0.1
    model: str
    versions: tuple[str, ...]
    default_version: str
    max_request_size: int
    response_timeout_s: float
    require_key: bool
    buckets: tuple[float, ...]
    #: How long nginx lets requests in flight finish once it is told to quit.
    shutdown_timeout_s: float
    runtime_dir: Path


def _lua_string(value: str) -> str:
    return "[==[" + value + "]==]" if "]==]" not in value else repr(value)


def _listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _route(match: str, name: str, proxy: tuple[str, ...]) -> str:
    """A location and its closing twin: while the pod drains, front.access jumps to the twin, whose
    ``keepalive_timeout 0`` makes nginx answer ``Connection: close`` and close the connection."""
    body = "".join(f"\n            {line}" for line in proxy)
    return (f"        location {match} {{\n"
            f"            access_by_lua_block {{ front.access(\"@{name}_closing\") }}\n"
            f"            log_by_lua_block {{ front.log() }}{body}\n"
            f"        }}\n"
            f"        location @{name}_closing {{\n"
            f"            keepalive_timeout 0;\n"
            f"            access_by_lua_block {{ front.access() }}\n"
            f"            log_by_lua_block {{ front.log() }}{body}\n"
            f"        }}")


def render(settings: FrontSettings) -> str:
    """nginx.conf for `settings` (paths absolute, so nginx runs as any user from any directory). Long because it is
    the whole template, in the order nginx reads it."""
    run = settings.runtime_dir
    upstream = settings.torchserve.split("://", 1)[-1].rstrip("/")
    versions = ", ".join(f"[ {_lua_string(v)} ] = true" for v in settings.versions)
    buckets = ", ".join(repr(b) for b in settings.buckets)
    timeout = int(settings.response_timeout_s + 5)
    too_large = f'{{"error": "request body larger than {settings.max_request_size} bytes"}}'
    modules = "\n".join(f"load_module {MODULES_DIR / name};" for name in MODULES)
    temp = "\n".join(f"    {kind}_temp_path {run / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                          "uwsgi", "scgi"))
    routes = "\n".join((
        _route("/predictions/", "predictions", ("proxy_set_header Authorization $predict_key;",
                                                "proxy_set_header X-API-Key $predict_api_key;",
                                                "proxy_pass http://$predict_to;")),
        _route("~ ^/v1/models/[^/]+:predict$", "v1", ("proxy_set_header Authorization $v1_key;",
                                                      "proxy_set_header X-API-Key $v1_api_key;",
                                                      "proxy_set_header Content-Type application/json;",
                                                      "proxy_pass http://$v1_to;")),
        _route("/", "gateway", ("proxy_pass http://gateway;",)),
    ))
    return f"""# Rendered by serving/kserve_runtime/nginx_front.py; do not edit.
{modules}
worker_processes 1;
pid {run / 'nginx.pid'};
error_log stderr warn;
env INFERENCE_API_KEY;
worker_shutdown_timeout {max(int(settings.shutdown_timeout_s), 1)}s;

events {{
    worker_connections 1024;
}}

http {{
    access_log off;
    server_tokens off;
{temp}
    client_max_body_size {settings.max_request_size};
    client_body_buffer_size {min(settings.max_request_size, 1024 * 1024)};
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_read_timeout {timeout}s;
    proxy_send_timeout {timeout}s;
    # A kept-alive upstream connection the other side closed (aiohttp closes one after a body it could not read)
    # is tried once more on a new connection; inference has no side effects, so a POST may be sent again.
    proxy_next_upstream error non_idempotent;
    proxy_next_upstream_tries 2;
    lua_package_path "{LUA_DIR}/?.lua;;";
    lua_shared_dict front 1m;
    init_by_lua_block {{
        front = require "front"
        front.init({{
            require_key = {'true' if settings.require_key else 'false'},
            model = {_lua_string(settings.model)},
            versions = {{{versions}}},
            default_version = {_lua_string(settings.default_version)},
            buckets = {{{buckets}}},
        }})
    }}

    upstream torchserve {{
        server {upstream};
        keepalive 64;
    }}
    upstream gateway {{
        server 127.0.0.1:{settings.gateway_port};
        keepalive 16;
    }}
    # Image bytes labelled as a form (curl --data-binary) go to the gateway, which relabels them.
    map $http_content_type $predict_to {{
        ~*^application/x-www-form-urlencoded gateway;
        default torchserve;
    }}
    # A v1 body with a Content-Encoding goes to the gateway, which inflates it.
    map $http_content_encoding $v1_to {{
        "" torchserve;
        default gateway;
    }}
    # TorchServe never sees the key (either header); the gateway checks it again.
    map $predict_to $predict_key {{
        torchserve "";
        default $http_authorization;
    }}
    map $predict_to $predict_api_key {{
        torchserve "";
        default $http_x_api_key;
    }}
    map $v1_to $v1_key {{
        torchserve "";
        default $http_authorization;
    }}
    map $v1_to $v1_api_key {{
        torchserve "";
        default $http_x_api_key;
    }}

    server {{
        listen {_listen(settings.host, settings.port)};
        error_page 413 = @too_large;
        error_page 502 504 = @unavailable;
        location @too_large {{
            default_type application/json;
            return 413 '{too_large}';
        }}
        location @unavailable {{
            default_type application/json;
            return 503 '{{"error": "the model server is not answering; retry shortly"}}';
        }}
        location = /v2/health/live {{
            proxy_pass http://gateway;
        }}
        location = /v2/health/ready {{
            proxy_pass http://gateway;
        }}
{routes}
    }}

    server {{
        listen unix:{run / 'control.sock'};
        location = /state {{
            content_by_lua_block {{ front.control() }}
        }}
    }}
}}
"""


def nginx_binary() -> str:
    """The nginx executable, or FrontError naming the packages to install."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    missing = [name for name in MODULES if not (MODULES_DIR / name).is_file()]
    if found is None or missing:
        what = "nginx" if found is None else ", ".join(str(MODULES_DIR / m) for m in missing)
        raise FrontError(f"{what} not found: install the Debian packages {PACKAGES}, or pass --front aiohttp")
    return found


@dataclass
class FrontState:
    """What the control socket answers."""

    drain: str
    in_flight: int
    since_last_arrival: float
    #: (version, status) -> (counts per bucket slot, the last slot being +Inf; sum of seconds)
    histogram: dict[tuple[str, str], tuple[list[int], float]]


def parse_state(text: str, n_buckets: int) -> FrontState:
    """The control socket's "name value" lines (see serving/nginx/front.lua)."""
    values: dict[str, str] = {}
    histogram: dict[tuple[str, str], tuple[list[int], float]] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("h|"):
            _, version, status, slot = name.split("|")
            counts, total = histogram.get((version, status), ([0] * (n_buckets + 1), 0.0))
            if slot == "sum":
                total = float(value)
            else:
                counts[int(slot) - 1] = int(float(value))
            histogram[(version, status)] = (counts, total)
        elif name:
            values[name] = value
    return FrontState(values.get("drain", "serving"), int(float(values.get("in_flight", 0))),
                      float(values.get("since_last_arrival", 0.0)), histogram)


class Front:
    """A running nginx front: its process, and its control socket."""

    def __init__(self, settings: FrontSettings, process: subprocess.Popen) -> None:
        self.settings = settings
        self.process = process
        self.socket = settings.runtime_dir / "control.sock"
        self._session: ClientSession | None = None

    @classmethod
    def start(cls, settings: FrontSettings, environ: dict[str, str]) -> "Front":
        binary = nginx_binary()
        settings.runtime_dir.mkdir(parents=True, exist_ok=True)
        conf = settings.runtime_dir / "nginx.conf"
        conf.write_text(render(settings))
        stale = settings.runtime_dir / "control.sock"
        if stale.exists():
            stale.unlink()
        # Its own process group: a worker whose master died (killed, OOM) is found and stopped through it.
        process = subprocess.Popen([binary, "-p", str(settings.runtime_dir), "-e", "stderr", "-c", str(conf),
                                    "-g", "daemon off;"], env=environ, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        return cls(settings, process)

    async def wait_started(self) -> None:
        """Until the control socket answers; FrontError when nginx exits first or takes too long."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise FrontError(f"nginx exited with code {self.process.returncode} while starting on port "
                                 f"{self.settings.port}; its error is logged above")
            try:
                await self.state()
                return
            except (ClientError, asyncio.TimeoutError, OSError):
                await asyncio.sleep(0.05)
        raise FrontError(f"nginx did not answer on {self.socket} within {START_TIMEOUT_S:g} s")

    async def _request(self, method: str, params: dict[str, str] | None = None) -> FrontState:
        if self._session is None:
            self._session = ClientSession(connector=UnixConnector(path=str(self.socket)),
                                          timeout=ClientTimeout(total=CONTROL_TIMEOUT_S))
        async with self._session.request(method, "http://front/state", params=params) as response:
            text = await response.text()
            if response.status != 200:
                raise ClientError(f"nginx control answered {response.status}: {text.strip()}")
        return parse_state(text, len(self.settings.buckets))

    async def state(self) -> FrontState:
        return await self._request("GET")

    async def set_drain(self, drain: str) -> FrontState:
        """'draining' (answers close their connection) or 'refusing' (new requests get 503)."""
        return await self._request("PUT", {"drain": drain})

    async def drain_to(self, drain: str) -> int | None:
        """:meth:`set_drain`; the requests nginx has in flight, or None (logged) when it did not answer."""
        try:
            return (await self.set_drain(drain)).in_flight
        except (ClientError, asyncio.TimeoutError, OSError) as exc:
            logger.warning("nginx front did not take the drain state %s: %s", drain, exc)
            return None

    async def histogram_page(self) -> bytes:
        """The request histogram nginx keeps, in Prometheus' text format (the gateway's metrics page)."""
        return front_histogram(await self.state(), self.settings.model, self.settings.buckets)

    async def settled(self, deadline: float, quiet_s: float) -> bool:
        """Until nothing is in flight and no request came for `quiet_s`; False if `deadline` came first."""
        while time.monotonic() < deadline:
            try:
                state = await self.state()
            except (ClientError, asyncio.TimeoutError, OSError):
                return self.process.poll() is not None
            if state.in_flight == 0 and state.since_last_arrival >= quiet_s:
                return True
            await asyncio.sleep(0.05)
        return False

    def stop(self, grace_s: float) -> None:
        """SIGQUIT (nginx's graceful stop: listeners close, requests in flight finish), SIGKILL after `grace_s`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:  # workers outlive a master that was killed: they would keep the port
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def shut(self, grace_s: float) -> None:
        """Close the control session, then :meth:`stop` nginx (off the event loop)."""
        await self.close()
        await asyncio.get_running_loop().run_in_executor(None, self.stop, grace_s)


class _Families(Collector):
    def __init__(self, *families: HistogramMetricFamily) -> None:
        self.families = families

    def collect(self):  # noqa: ANN201 (prometheus_client's interface)
        return iter(self.families)


def front_histogram(state: FrontState, model: str, buckets: tuple[float, ...] = BUCKETS) -> bytes:
    """The nginx front's counts (per bucket, per version and status) as the gateway's own histogram reads."""
    family = HistogramMetricFamily(REQUEST_SECONDS, REQUEST_SECONDS_HELP, labels=LABELS)
    edges = [floatToGoString(b) for b in buckets] + ["+Inf"]
    for (version, status), (counts, total) in sorted(state.histogram.items()):
        running, cumulative = 0, []
        for edge, count in zip(edges, counts):
            running += count
            cumulative.append((edge, running))
        family.add_metric([model, version, status], cumulative, total)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(family))
    return generate_latest(registry)
