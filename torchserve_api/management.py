"""TorchServe's management API for one model: its versions, their workers, and version operations.

``describe``/``status`` and ``wait_ready`` (GET), ``set_default`` and ``scale`` (PUT) work on any server;
``register`` and ``unregister`` (POST/DELETE /models) need ``enable_model_api=true`` (see ``MODEL_API_HINT``).
Every call sends the management key; failures raise the typed errors of :mod:`torchserve_api.errors`.
"""

from __future__ import annotations

import json
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from settings import CONFIG_FILE, MODEL_NAME, SettingsError, read_properties

from .errors import AuthError, BadImageError, ClientError, LifecycleError, ModelNotFoundError, ServerError, UsageError
from .retry import RetryPolicy
from .tokens import Token
from .transport import Http, classify, default_endpoints, is_loopback, parse_body

MODEL_API_HINT = ("the server runs with enable_model_api=false, so versions cannot be registered or unregistered "
                  "over HTTP: start it with a lifecycle config (python -m client lifecycle-config --out "
                  "run/lifecycle.properties; python -m serving --config run/lifecycle.properties start), or start it "
                  "with every version in load_models and switch with set-default")


#: Where config.properties gives each API's address (gRPC: its port, on grpc_inference_address).
ADDRESS_KEYS = {"inference": "inference_address", "management": "management_address", "metrics": "metrics_address",
                "gRPC inference": "grpc_inference_port"}


def served_api(http: Http, base_url: str) -> str | None:
    """"inference", "management" or "metrics": which TorchServe API answers at `base_url`, by the paths of the API
    description it gives for ``OPTIONS /`` without a token; None when it gives none (not TorchServe, no answer)."""
    try:
        body = parse_body(http.request("OPTIONS", f"{base_url.rstrip('/')}/"))
    except ClientError:
        return None
    paths = body.get("paths") if isinstance(body, dict) else None
    if not isinstance(paths, dict):
        return None
    if "/predictions/{model_name}" in paths:
        return "inference"
    if "/models" in paths:
        return "management"
    return "metrics" if set(paths) == {"/metrics"} else None


def wrong_port(where: str, what: str, wanted: str, config: Path = CONFIG_FILE) -> UsageError:
    """The error for a client that reached `what` ("TorchServe's metrics port") at `where` but needs TorchServe's
    `wanted` API (a key of ADDRESS_KEYS): it names the address to use from `config`."""
    key = ADDRESS_KEYS[wanted]
    try:
        props = read_properties(config)
        host = props.get("grpc_inference_address", "127.0.0.1")
        address = props[key] if key.endswith("_address") else f"{host}:{props[key]}"
        fix = f"use --url {address} ({key} in {config})"
    except (OSError, SettingsError, KeyError):
        fix = f"use the address in {key} of the server's config.properties"
    return UsageError(f"{where} is {what}, not TorchServe's {wanted} port: {fix}")


def check_refusal(error: ClientError, http: Http, base_url: str, wanted: str,
                  config: Path = CONFIG_FILE) -> ClientError:
    """`error`, unless it blames the token or the model while `base_url` is another TorchServe API than `wanted`:
    then the wrong_port error that names the right address."""
    if not isinstance(error, (AuthError, ModelNotFoundError)):
        return error
    role = served_api(http, base_url)
    if role is None or role == wanted:
        return error
    return wrong_port(urlsplit(base_url).netloc or base_url, f"TorchServe's {role} port", wanted, config)


#: The keys TorchServe 0.12's token API replaces; its API key changes only with a restart.
ROTATABLE = ("inference", "management")


@dataclass(frozen=True)
class Worker:
    id: str
    status: str
    pid: int | None
    memory: int | None  # bytes, as TorchServe reports memoryUsage


@dataclass(frozen=True)
class VersionStatus:
    version: str
    default: bool
    url: str
    batch_size: int
    max_batch_delay: int
    min_workers: int
    max_workers: int
    workers: tuple[Worker, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "default": self.default, "url": self.url, "batchSize": self.batch_size,
                "maxBatchDelay": self.max_batch_delay, "minWorkers": self.min_workers,
                "maxWorkers": self.max_workers,
                "workers": [w.__dict__ for w in self.workers]}


@dataclass(frozen=True)
class ModelStatus:
    model: str
    default: str | None
    versions: tuple[VersionStatus, ...]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "default": self.default, "versions": [v.to_json() for v in self.versions]}

    def text(self) -> str:
        lines = [f"model {self.model}: default version {self.default}"]
        for v in self.versions:
            mark = "*" if v.default else " "
            lines.append(f"{mark} {v.version:<8} {v.url}  batchSize={v.batch_size} maxBatchDelay={v.max_batch_delay}ms "
                         f"workers={len(v.workers)} (min {v.min_workers}, max {v.max_workers})")
            for w in v.workers:
                memory = f"{w.memory / 2**20:.0f} MiB" if w.memory else "not measured yet"
                lines.append(f"      worker {w.id}  {w.status:<10} pid {w.pid}  memory {memory}")
        return "\n".join(lines)


def _version_status(entry: dict[str, Any], default: str | None) -> VersionStatus:
    workers = tuple(Worker(id=str(w.get("id", "")), status=str(w.get("status", "")),
                           pid=w.get("pid") if isinstance(w.get("pid"), int) else None,
                           memory=w.get("memoryUsage") if isinstance(w.get("memoryUsage"), int) else None)
                    for w in entry.get("workers", []))
    version = str(entry.get("modelVersion", ""))
    return VersionStatus(version=version, default=version == default, url=str(entry.get("modelUrl", "")),
                         batch_size=int(entry.get("batchSize", 1)), max_batch_delay=int(entry.get("maxBatchDelay", 0)),
                         min_workers=int(entry.get("minWorkers", 0)), max_workers=int(entry.get("maxWorkers", 0)),
                         workers=workers)


def mar_manifest(path: Path) -> dict[str, Any]:
    """MAR-INF/MANIFEST.json's ``model`` section (modelName, modelVersion, handler...)."""
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
    except (OSError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise UsageError(f"{path}: not a model archive ({exc})") from None
    return manifest.get("model", {})


class ManagementClient:
    """Versions of one model on a TorchServe management API (``--url``, default from config.properties)."""

    def __init__(self, url: str | None = None, *, model: str = MODEL_NAME, token: Token | str | None = None,
                 timeout: float = 120.0, retries: int = 3, backoff: float = 0.2, config: Path = CONFIG_FILE) -> None:
        self.config = config
        self.url = (url or default_endpoints(config).management).rstrip("/")
        self.model = model
        self.token = token if isinstance(token, Token) else Token(token, source="the token argument")
        self.http = Http(timeout, RetryPolicy(retries=max(0, retries), backoff=backoff),
                         trust_env=not is_loopback(self.url))

    @property
    def where(self) -> str:
        return urlsplit(self.url).netloc or self.url

    def _call(self, method: str, path: str, version: str | None = None, **params: Any) -> Any:
        query = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items() if v is not None}
        response = self.http.request(method, self.url + path, params=query, headers=self.token.header())
        body = parse_body(response)
        if response.status_code == 200:
            return body
        kind = body.get("type", "") if isinstance(body, dict) else ""
        message = body.get("message", "") if isinstance(body, dict) else str(body)[:200]
        if response.status_code == 405:
            raise LifecycleError(f"{method} {path} refused (405): {MODEL_API_HINT}", 405)
        if response.status_code == 409 or kind == "InvalidModelVersionException":
            hint = " (set another default version first)" if "default version" in message else ""
            raise LifecycleError(f"{message}{hint}", response.status_code)
        error = check_refusal(classify(response.status_code, body, self.token, self.where, self.model, version),
                              self.http, self.url, "management", self.config)
        if isinstance(error, BadImageError):  # a 4xx that is about the operation, not an image
            raise LifecycleError(f"{method} {path} refused ({response.status_code}): {message or error}",
                                 response.status_code)
        raise error

    def _model_path(self, version: str | None = None) -> str:
        return f"/models/{quote(self.model)}" + (f"/{quote(version)}" if version else "")

    def list_models(self) -> list[dict[str, Any]]:
        """Every model on the server (all pages)."""
        models: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            body = self._call("GET", "/models", limit=100, next_page_token=token)
            models.extend(body.get("models", []))
            token = body.get("nextPageToken")
            if not token:
                return models

    def describe(self, version: str | None = None) -> list[dict[str, Any]]:
        """TorchServe's description of one version, the default one (None), or all ("all")."""
        body = self._call("GET", self._model_path(version), version=None if version == "all" else version)
        if not isinstance(body, list):
            raise ClientError(f"unexpected describe answer from {self.where}: {str(body)[:120]}")
        return body

    def status(self) -> ModelStatus:
        """Versions, default, workers (id, status, pid, memory), batchSize and maxBatchDelay."""
        default_entry = self.describe()
        default = str(default_entry[0].get("modelVersion")) if default_entry else None
        versions = tuple(_version_status(entry, default) for entry in self.describe("all"))
        return ModelStatus(self.model, default, versions)

    def wait_ready(self, timeout: float = 120.0, poll: float = 0.25) -> ModelStatus:
        """Wait until every version has at least its minWorkers workers READY.

        A starting or restarting worker is described as "UNLOADING" until its model is loaded.
        """
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if all(sum(w.status == "READY" for w in v.workers) >= max(1, v.min_workers) for v in status.versions):
                return status
            if time.monotonic() > deadline:
                waiting = ", ".join(f"{v.version}: {sum(w.status == 'READY' for w in v.workers)}/{v.min_workers}"
                                    for v in status.versions)
                raise ServerError(f"workers not READY after {timeout:g}s ({waiting})")
            time.sleep(poll)

    def register(self, mar: str | Path, version: str, workers: int | None = None,
                 model_store: Path | None = None) -> str:
        """Register a version from an archive and wait until its workers are up.

        A local file is checked first (model name and version from its manifest). If it lies in the
        server's ``model_store`` it is registered by file name; any other local file is sent as a
        ``file://`` URL, which TorchServe (default ``allowed_urls``, same host) copies into its store.
        Anything that is not a local file (a name in the server's store, an http(s) URL) passes through.
        """
        location = str(mar)
        path = Path(location)
        if path.is_file():
            manifest = mar_manifest(path)
            if manifest.get("modelName") != self.model:
                raise UsageError(f"{location} holds model {manifest.get('modelName')!r}, not {self.model!r}")
            if str(manifest.get("modelVersion")) != version:
                raise UsageError(f"{location} holds version {manifest.get('modelVersion')!r}, not {version!r} "
                                 f"(build it with ./archive.sh --model-version {version})")
            in_store = model_store is not None and path.resolve().parent == Path(model_store).resolve()
            location = path.name if in_store else path.resolve().as_uri()
        try:
            body = self._call("POST", "/models", version=version, url=location, model_name=self.model,
                              initial_workers=workers, synchronous=True)
        except ServerError as exc:
            if "already exists" not in str(exc):
                raise
            raise LifecycleError(f"the server's model store already holds a file named {path.name}: if {location} is "
                                 "that file, pass --model-store with the server's store; otherwise rename the "
                                 "archive", exc.status) from None
        return str(body.get("status", body))

    def set_default(self, version: str) -> str:
        body = self._call("PUT", f"{self._model_path(version)}/set-default", version=version)
        return str(body.get("status", body))

    def unregister(self, version: str) -> str:
        body = self._call("DELETE", self._model_path(version), version=version)
        return str(body.get("status", body))

    def scale(self, min_workers: int, max_workers: int, version: str | None = None) -> str:
        if not 0 <= min_workers <= max_workers:
            raise UsageError(f"need 0 <= min ({min_workers}) <= max ({max_workers})")
        body = self._call("PUT", self._model_path(version), version=version, min_worker=min_workers,
                          max_worker=max_workers, synchronous=True)
        return str(body.get("status", body))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "ManagementClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rotate_key(url: str, kind: str, api_key: Token, timeout: float = 30.0, config: Path = CONFIG_FILE) -> None:
    """Have the server whose management API is at `url` replace its `kind` key (``GET /token?type=KIND`` with the API
    key). TorchServe writes the new key, with a new expiry time, into its key_file.json and refuses the old one from
    then on; its answer carries no key."""
    if kind not in ROTATABLE:
        raise UsageError(f"cannot rotate the {kind!r} key: TorchServe rotates {' and '.join(ROTATABLE)} keys only")
    with ManagementClient(url, token=api_key, timeout=timeout, config=config) as mgmt:
        try:
            mgmt._call("GET", "/token", type=kind)
        except AuthError as exc:
            raise AuthError(f"{mgmt.where} refused the API key from {api_key.source}: rotating needs the API entry of "
                            "the server's key_file.json, which changes when the server restarts", exc.reason) from None
