"""The deploy record: a ConfigMap beside the InferenceService naming what it serves, what it served before, and the
versions it served, written only once a rollout serves; the gate and rollback read it. Each entry keeps the predictor
as deployed (REVISION_KEY), so a rollback restores the whole of it. The same ConfigMap holds the lock that keeps two
deploys (or a deploy and a rollback) of one InferenceService from overlapping (`deploy_lock`)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .api import CONFLICT_ATTEMPTS, api_error, call
from .errors import KServeError

#: Prefix of the record's keys; the gate (pipeline.gate) names the others.
RECORD_PREFIX = "mnist-embedding"
STORAGE_URI_KEY = f"{RECORD_PREFIX}/storage-uri"
#: The entry's predictor as deployed and the annotations deploy owns, JSON: what `pipeline rollback` puts back whole
#: (runtime, protocol, resources, probes, replicas, storage). Entries written before it restore the storage only.
REVISION_KEY = f"{RECORD_PREFIX}/revision"
#: The record's key holding the lock of a deploy or rollback in progress: {"holder": ..., "until": epoch seconds}.
LOCK_KEY = "deploying"
#: How much longer than a rollout's own deadline its lock may outlive a deploy or rollback that died holding it
#: (publishing the .mar and writing the record come on top of the rollout).
LOCK_SLACK_S = 600.0
#: How many deployed versions the record keeps for rollback.
RECORD_HISTORY = 10


def record_name(service: str) -> str:
    """The ConfigMap, beside the InferenceService, that records what it serves.

    Not annotations on the InferenceService: KServe copies its annotations into the Knative revision template
    (pkg/controller/v1beta1/inferenceservice/components/predictor.go), so writing them after Ready would start
    another revision.
    """
    return f"{service}-deployed-model"


@dataclass(frozen=True)
class Record:
    """What the InferenceService serves, what it served before, and the versions it served (newest last)."""

    current: dict[str, str]
    previous: dict[str, str] | None
    history: list[dict[str, str]]
    resource_version: str = ""


def read_record(core: Any, namespace: str, service: str) -> Record | None:
    """The deploy record of `service`; None when there is none, empty entries when it cannot be parsed (edited by
    hand). ApiException on other failures."""
    from kubernetes.client.exceptions import ApiException

    try:
        obj = call(core.read_namespaced_config_map, record_name(service), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    record = _parsed(obj.data or {}) or Record({}, None, [])
    return Record(record.current, record.previous, record.history, obj.metadata.resource_version or "")


def _parsed(data: dict[str, str]) -> Record | None:
    """The record in a ConfigMap's data; None when it holds none (or only a lock), empty entries when it cannot be
    parsed (edited by hand)."""
    if "current" not in data:
        return None
    try:
        current = json.loads(data["current"])
        previous = json.loads(data["previous"]) if data.get("previous") else None
        history = json.loads(data.get("history") or "[]")
        if not (isinstance(current, dict) and isinstance(previous, dict | None) and isinstance(history, list)):
            raise ValueError("not a record")
    except ValueError:
        return Record({}, None, [])
    return Record(current, previous, history)


def revision_entry(manifest: dict, owned: tuple[str, ...]) -> str:
    """REVISION_KEY's value for an InferenceService `manifest`: its predictor and the annotations of `owned`."""
    notes = (manifest["metadata"].get("annotations") or {})
    return json.dumps({"predictor": manifest["spec"]["predictor"],
                       "annotations": {key: notes[key] for key in owned if key in notes}}, sort_keys=True)


def _lock_of(data: dict[str, str]) -> dict[str, Any] | None:
    try:
        lock = json.loads(data.get(LOCK_KEY) or "null")
    except ValueError:
        return None
    return lock if isinstance(lock, dict) and isinstance(lock.get("until"), int | float) else None


def _write_data(core: Any, namespace: str, service: str, change: Any) -> None:
    """Read the record's ConfigMap, let `change(data)` edit its data (or create it), write it back carrying the
    resourceVersion it read; a 409 re-reads and re-applies (bounded)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = record_name(service)
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        try:
            obj = call(core.read_namespaced_config_map, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            obj = None
        data = dict(obj.data or {}) if obj is not None else {}
        change(data)
        meta = client.V1ObjectMeta(name=name, namespace=namespace,
                                   labels={"app.kubernetes.io/managed-by": "mnist-embedding-pipeline"},
                                   resource_version=obj.metadata.resource_version if obj is not None else None)
        body = client.V1ConfigMap(metadata=meta, data=data)
        try:
            if obj is None:
                call(core.create_namespaced_config_map, namespace, body)
            else:
                call(core.replace_namespaced_config_map, name, namespace, body)
            return
        except ApiException as exc:
            if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                raise


@contextlib.contextmanager
def deploy_lock(core: Any, namespace: str, service: str, holder: str, ttl_s: float) -> Iterator[None]:
    """Hold the record's lock for InferenceService `service` while the block runs, or refuse on one line
    (KServeError) while another holder's lock is live. A lock outlives a holder that died by `ttl_s` at most:
    then the next deploy takes it over."""
    from kubernetes.client.exceptions import ApiException

    where = f"InferenceService {namespace}/{service}"

    def take(data: dict[str, str]) -> None:
        lock = _lock_of(data)
        if lock is not None and lock.get("holder") != holder and lock["until"] > time.time():
            since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lock.get("since", 0)))
            raise KServeError(f"{lock.get('holder', 'another run')} is deploying {where} since {since}: wait until "
                              f"it ends (its lock in ConfigMap {namespace}/{record_name(service)} lapses "
                              f"{lock['until'] - time.time():.0f} s from now at the latest)")
        data[LOCK_KEY] = json.dumps({"holder": holder, "since": time.time(), "until": time.time() + ttl_s})

    def give_back(data: dict[str, str]) -> None:
        lock = _lock_of(data)
        if lock is not None and lock.get("holder") == holder:
            data.pop(LOCK_KEY, None)

    try:
        _write_data(core, namespace, service, take)
    except ApiException as exc:
        raise KServeError(f"cannot lock {where} for this deploy in ConfigMap {namespace}/{record_name(service)}: "
                          f"{api_error(exc)}") from None
    try:
        yield
    finally:
        with contextlib.suppress(ApiException, KServeError):  # a lock left behind lapses by itself
            _write_data(core, namespace, service, give_back)


def write_record(core: Any, namespace: str, service: str, entry: dict[str, str]) -> None:
    """Make `entry` the current one (the current one becomes previous); a 409 re-reads and retries (bounded).
    Keys other than the record's own (the lock) are kept."""
    def change(data: dict[str, str]) -> None:
        old = _parsed(data)
        history = [e for e in (old.history if old else []) if e != entry] + [entry]
        previous = (old.current if old is not None and old.current and old.current != entry else
                    old.previous if old is not None else None)
        data.update({"current": json.dumps(entry, sort_keys=True),
                     "history": json.dumps(history[-RECORD_HISTORY:], sort_keys=True)})
        data.pop("previous", None)
        if previous:
            data["previous"] = json.dumps(previous, sort_keys=True)

    _write_data(core, namespace, service, change)


def record_served(core: Any, namespace: str, service: str, entry: dict[str, str], what: str) -> None:
    """write_record once `what` serves; KServeError on one line when the record cannot be written."""
    from kubernetes.client.exceptions import ApiException

    try:
        write_record(core, namespace, service, entry)
    except ApiException as exc:
        raise KServeError(f"{what} serves, but its record ConfigMap {namespace}/{record_name(service)} could not be "
                          f"written: {api_error(exc)} (the gate refuses until a deploy or rollback records it)"
                          ) from None
