"""The deploy record: a ConfigMap beside the InferenceService naming what it serves, what it served before, and the
versions it served, written only once a rollout serves; the gate and rollback read it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .api import CONFLICT_ATTEMPTS, api_error, call
from .errors import KServeError

#: Prefix of the record's keys; the gate (pipeline.gate) names the others.
RECORD_PREFIX = "mnist-embedding"
STORAGE_URI_KEY = f"{RECORD_PREFIX}/storage-uri"
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
    data = obj.data or {}
    try:
        current = json.loads(data["current"])
        previous = json.loads(data["previous"]) if data.get("previous") else None
        history = json.loads(data.get("history") or "[]")
        if not (isinstance(current, dict) and isinstance(previous, dict | None) and isinstance(history, list)):
            raise ValueError("not a record")
    except (KeyError, ValueError):
        current, previous, history = {}, None, []
    return Record(current, previous, history, obj.metadata.resource_version or "")


def write_record(core: Any, namespace: str, service: str, entry: dict[str, str]) -> None:
    """Make `entry` the current one (the current one becomes previous); a 409 re-reads and retries (bounded)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = record_name(service)
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        old = read_record(core, namespace, service)
        history = [e for e in (old.history if old else []) if e != entry] + [entry]
        data = {"current": json.dumps(entry, sort_keys=True),
                "history": json.dumps(history[-RECORD_HISTORY:], sort_keys=True)}
        if old is not None and old.current and old.current != entry:
            data["previous"] = json.dumps(old.current, sort_keys=True)
        elif old is not None and old.previous:
            data["previous"] = json.dumps(old.previous, sort_keys=True)
        meta = client.V1ObjectMeta(name=name, namespace=namespace,
                                   labels={"app.kubernetes.io/managed-by": "mnist-embedding-pipeline"},
                                   resource_version=old.resource_version if old else None)
        body = client.V1ConfigMap(metadata=meta, data=data)
        try:
            if old is None:
                call(core.create_namespaced_config_map, namespace, body)
            else:
                call(core.replace_namespaced_config_map, name, namespace, body)
            return
        except ApiException as exc:
            if exc.status != 409 or attempt == CONFLICT_ATTEMPTS:
                raise


def record_served(core: Any, namespace: str, service: str, entry: dict[str, str], what: str) -> None:
    """write_record once `what` serves; KServeError on one line when the record cannot be written."""
    from kubernetes.client.exceptions import ApiException

    try:
        write_record(core, namespace, service, entry)
    except ApiException as exc:
        raise KServeError(f"{what} serves, but its record ConfigMap {namespace}/{record_name(service)} could not be "
                          f"written: {api_error(exc)} (the gate refuses until a deploy or rollback records it)"
                          ) from None
