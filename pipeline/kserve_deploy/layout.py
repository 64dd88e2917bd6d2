"""What the runtime pod reads from storage: `config/config.properties` (TorchServe on loopback behind the gateway,
the model listed in its startup snapshot) and `model-store/<model_name>.mar`, staged in a local folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from settings import (CONFIG_FILE, MODEL_CONFIG_FILE, POD_TORCHSERVE_PORT, Endpoints, properties, read_properties,
                      write_properties)

from .errors import KServeError

#: TorchServe's inference and management APIs inside the pod: loopback only, behind the gateway.
INFERENCE_PORT = POD_TORCHSERVE_PORT
#: Prometheus metrics, scraped from outside the pod: the port of config.properties' metrics_address.
METRICS_PORT = Endpoints.from_properties(properties()).ports()["metrics"]
CONFIG_PATH = "config/config.properties"
STORE_DIR = "model-store"
MODEL_STORE_MOUNT = "/mnt/models/model-store"
SNAPSHOT_KEYS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")

#: TorchServe's own metrics inside the pod: loopback only. The gateway serves them on METRICS_PORT together
#: with its per-request latency histogram (serving.gateway_metrics), so the scrape target stays one port.
TORCHSERVE_METRICS_PORT = INFERENCE_PORT + 2


def model_snapshot(model_name: str, version: str, model_config: Path = MODEL_CONFIG_FILE) -> dict:
    """TorchServe's startup snapshot: the runtime loads exactly the models listed here."""
    settings = yaml.safe_load(Path(model_config).read_text()) or {}
    missing = [key for key in SNAPSHOT_KEYS if key not in settings]
    if missing:
        raise KServeError(f"{model_config}: missing {', '.join(missing)}")
    entry = {"defaultVersion": True, "marName": f"{model_name}.mar", **{key: settings[key] for key in SNAPSHOT_KEYS}}
    return {"name": "startup.cfg", "modelCount": 1, "models": {model_name: {version: entry}}}


def runtime_properties(model_name: str, version: str, base_config: Path = CONFIG_FILE,
                       model_config: Path = MODEL_CONFIG_FILE) -> dict[str, str]:
    """config.properties for the runtime pod.

    TorchServe listens on loopback with its own token check off: the gateway in front of it
    (serving.kserve_runtime) is the only way in and checks the caller's bearer key. No request envelope:
    the handler reads KServe's formats itself, so frontend batching stays on. settings.SERVER_PROPERTIES
    (limits, metrics format and model_metrics_auto_detect) are copied from `base_config`, which must hold
    every one of them. TorchServe's metrics stay on loopback; `gateway_metrics_address` (a key TorchServe
    ignores) tells the gateway to serve them, with its own request histogram, on METRICS_PORT.
    """
    from settings import GATEWAY_METRICS_KEY, SERVER_PROPERTIES

    base = read_properties(base_config)
    missing = [key for key in SERVER_PROPERTIES if key not in base]
    if missing:
        raise KServeError(f"{base_config}: missing {', '.join(missing)} (settings.SERVER_PROPERTIES hold in the "
                          "cluster too)")
    props = {key: base[key] for key in SERVER_PROPERTIES}
    props.update({
        "inference_address": f"http://127.0.0.1:{INFERENCE_PORT}",
        "management_address": f"http://127.0.0.1:{INFERENCE_PORT + 1}",
        "metrics_address": f"http://127.0.0.1:{TORCHSERVE_METRICS_PORT}",
        GATEWAY_METRICS_KEY: f"http://0.0.0.0:{METRICS_PORT}",
        "disable_token_authorization": "true",
        "install_py_dep_per_model": "false",
        "model_store": MODEL_STORE_MOUNT,
        # Nothing but the store KServe downloaded: TorchServe's default lets a registration fetch any URL.
        "allowed_urls": f"file://{MODEL_STORE_MOUNT}/.*",
        "model_snapshot": json.dumps(model_snapshot(model_name, version, model_config), separators=(",", ":")),
    })
    return props


def stage_layout(mar: Path, model_name: str, version: str, out: Path) -> None:
    """Write config/config.properties and model-store/<model_name>.mar under `out`."""
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / STORE_DIR).mkdir(exist_ok=True)
    write_properties(runtime_properties(model_name, version), out / CONFIG_PATH)
    shutil.copy2(mar, out / STORE_DIR / f"{model_name}.mar")
