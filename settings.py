"""The project's settings: names, paths, defaults and the serving numbers, each defined once, here.

Every package (client, serving, training, pipeline, bench, queue bridge) takes ports, addresses, the model
name, request limits, token lifetime, workers and threads from here. Two files TorchServe reads must carry some
of the serving numbers as literals: config.properties (addresses, request sizes, token lifetime) is read here
too, and model-config.yaml is packed into the .mar; tests/unit/test_settings.py holds each literal in them equal
to the constant below. This module imports only the standard library and PyYAML, so it sits at the bottom of
the import graph: the client does not need the server package to know where the server is.

What a trained model needs at serving time (k, threshold, score, preprocessing) is not a setting: it lives in
the model's metadata.json, written by training.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parent
CONFIG_FILE = REPO / "config.properties"
MODEL_CONFIG_FILE = REPO / "model-config.yaml"
#: TorchServe's log4j2 configuration (serving/ travels into the serving image). Launchers pass it as
#: `torchserve --log-config`, which resolves it wherever the server's working directory is.
LOG_CONFIG_FILE = REPO / "serving" / "log4j2.xml"
MODEL_NAME = "embedding"
MODEL_VERSION = "1.0"
#: Where training writes and archiving reads artifacts when no folder is named: the repository's artifacts/,
#: wherever the command is started from.
DEFAULT_ARTIFACTS = REPO / "artifacts"
DEFAULT_MODEL_STORE = REPO / "model_store"
KEY_FILE = "key_file.json"
#: The training data when none is named: the MNIST sample bundled with the repository (offline).
DEFAULT_DATA_SOURCE = "mnist-sample"
#: Where a task has the claim of a pvc:// URI mounted (kfp-kubernetes mount_pvc), overridable for other mounts.
PVC_MOUNT_ENV, PVC_MOUNT_DEFAULT = "PVC_MOUNT_PATH", "/mnt/pvc"
#: Torch threads of one-process jobs (training, evaluation, the offline service) unless --threads or
#: $OMP_NUM_THREADS say otherwise. Fixed rather than "all cores" because the thread count changes the order of
#: floating-point sums, so the same seed gives the same model only at the same count; 2 is the small machine
#: this project targets. TorchServe workers use WORKER_THREADS instead.
DEFAULT_THREADS = 2
#: TorchServe workers of the model: model-config.yaml's minWorkers and maxWorkers, config.properties'
#: default_workers_per_model. Two single-threaded workers fill the 2-core machine this project targets.
WORKERS = 2
#: Torch threads (OMP_NUM_THREADS) in each TorchServe worker: model-config.yaml's handler.threads, the
#: environment `python -m serving start`, the images and the KServe pod give TorchServe.
WORKER_THREADS = 1
#: Seconds one request may take: TorchServe's responseTimeout (model-config.yaml) and default_response_timeout
#: (config.properties), and the per-request timeout of the project's HTTP clients.
REQUEST_TIMEOUT_S = 30
#: Largest decoded image the handler accepts (model-config.yaml handler.max_image_pixels; larger ones are
#: refused with 413 before their pixels are decoded).
MAX_IMAGE_PIXELS = 16_000_000
#: Inside a KServe pod: the gateway listens on KServe's container port, TorchServe behind it on loopback.
KSERVE_GATEWAY_PORT = 8080
#: The gateway's Open Inference gRPC (KServe grpc-v2) port: KServe's model server's default gRPC port.
KSERVE_GRPC_PORT = 8081
POD_TORCHSERVE_PORT = 8085
#: Settings of config.properties that hold wherever TorchServe runs, the KServe pod included
#: (pipeline.kserve_deploy.runtime_properties copies them and refuses a config.properties without one): request limits,
#: the metrics format, and model_metrics_auto_detect, without which TorchServe (default false) drops every
#: Embedding* metric the handler emits and the alerts on them never evaluate.
SERVER_PROPERTIES = ("max_request_size", "max_response_size", "limit_max_image_pixels", "job_queue_size",
                     "default_response_timeout", "vmargs", "metrics_mode", "model_metrics_auto_detect",
                     "enable_model_api")
#: A config.properties key TorchServe ignores: where the KServe gateway serves TorchServe's metrics (fetched
#: from its loopback metrics_address) together with its own request histogram. Absent: no gateway metrics.
GATEWAY_METRICS_KEY = "gateway_metrics_address"
MODEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
MODEL_NAME_RULE = "use letters, digits, '-' and '_', starting with a letter or digit"


class SettingsError(ValueError):
    """A setting is missing or invalid; the message is one line naming it."""


def cache_root() -> Path:
    """Downloads and generated files: $XDG_CACHE_HOME/mnist-embedding (~/.cache by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mnist-embedding"


def servers_dir() -> Path:
    """Where every start records its running TorchServe, so any command finds it from any directory:
    $XDG_STATE_HOME/mnist-embedding/servers (~/.local/state by default; torchserve_api.instances)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "mnist-embedding" / "servers"


def env_threads(default: int = DEFAULT_THREADS) -> int:
    """$OMP_NUM_THREADS when it is a plain positive integer (it may also be a list like "4,2"), else `default`."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else default


def service_name_for(model_name: str) -> str:
    """The InferenceService name a model gets unless one is given: DNS-1035 ('my_model' -> 'my-model')."""
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")
    return name if name[:1].isalpha() else f"m-{name}"


def check_model_name(name: str) -> str:
    """`name` if TorchServe, KServe and a file name all accept it; SettingsError otherwise."""
    if not MODEL_NAME_PATTERN.match(name):
        raise SettingsError(f"invalid model name {name!r}: {MODEL_NAME_RULE}")
    return name


def read_properties(path: Path) -> dict[str, str]:
    """The key=value subset of Java's .properties format that TorchServe's configs use.

    Comments (#, !) and blank lines are skipped. What Java would read differently from a plain split on the
    first "=" is refused with a SettingsError naming the line: a ":" or whitespace separator, backslash escapes
    and line continuations. Silently skipping such a line would let TorchServe apply a value the project's own
    checks never saw.
    """
    props: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if "\\" in line:
            problem = "a backslash (escape or line continuation) is not supported"
        elif not sep or any(c in key.strip() for c in ": \t"):
            problem = "write key=value (a ':' or whitespace separator is not supported)"
        else:
            props[key.strip()] = value.strip()
            continue
        raise SettingsError(f"{path}:{number}: {problem}: {line[:80]!r}")
    return props


def write_properties(props: dict[str, str], path: Path) -> None:
    Path(path).write_text("".join(f"{k}={v}\n" for k, v in props.items()))


@functools.cache
def properties() -> dict[str, str]:
    """The project's config.properties, read once."""
    return read_properties(CONFIG_FILE)


@functools.cache
def model_config() -> dict[str, Any]:
    """The project's model-config.yaml, read once."""
    return yaml.safe_load(MODEL_CONFIG_FILE.read_text())


def _required(props: dict[str, str], key: str) -> str:
    try:
        return props[key]
    except KeyError:
        raise SettingsError(f"config.properties has no {key}") from None


def max_request_size(props: dict[str, str] | None = None) -> int:
    """Largest request body in bytes (TorchServe's max_request_size; the queue bridge applies it too)."""
    return int(_required(props if props is not None else properties(), "max_request_size"))


def token_lifetime_min(props: dict[str, str] | None = None) -> int:
    """Minutes a TorchServe API key lives before it must be regenerated."""
    return int(_required(props if props is not None else properties(), "token_expiration_min"))


@dataclass(frozen=True)
class Endpoints:
    inference: str
    management: str
    metrics: str
    grpc_inference_port: int
    grpc_management_port: int

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> "Endpoints":
        return cls(
            inference=_required(props, "inference_address"),
            management=_required(props, "management_address"),
            metrics=_required(props, "metrics_address"),
            grpc_inference_port=int(_required(props, "grpc_inference_port")),
            grpc_management_port=int(_required(props, "grpc_management_port")),
        )

    def ports(self) -> dict[str, int]:
        return {
            "inference": urlsplit(self.inference).port or 80,
            "management": urlsplit(self.management).port or 80,
            "metrics": urlsplit(self.metrics).port or 80,
            "gRPC inference": self.grpc_inference_port,
            "gRPC management": self.grpc_management_port,
        }


def with_ports(props: dict[str, str], inference: int, management: int, metrics: int,
               grpc_inference: int, grpc_management: int) -> dict[str, str]:
    """A copy of `props` listening on other loopback ports (tests run beside a user's server)."""
    out = dict(props)
    out.update({
        "inference_address": f"http://127.0.0.1:{inference}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        "grpc_inference_port": str(grpc_inference),
        "grpc_management_port": str(grpc_management),
    })
    return out
