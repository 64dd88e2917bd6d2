"""`python -m pipeline rollback --to VERSION`: serve a version the deploy record lists again.

The record (pipeline.kserve_deploy.record, written by deploy once a revision serves) keeps the versions the
InferenceService served, each with its storageUri, the gate's fields and the predictor as deployed. Rolling back
puts that predictor back whole (runtime, protocol, port and probes, resources, replicas, storage) with the version
label and the autoscaling target (entries recorded before the predictor was: the storageUri and label only), waits
until the new revision serves the way deploy does, and only then makes that version the record's current one (the
one it replaces becomes previous), so the next run's gate compares with the model that really serves. A revision
that fails, the deadline or an interrupt put the spec back on the version that was serving and leave the record as
it was. It holds the deploy lock throughout: a deploy of the same service meanwhile is refused, and it is refused
while one runs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

from cli_common import positive_seconds
from settings import MODEL_NAME, service_name_for

from .gate import ANNOTATIONS
from .kserve_deploy.api import core_v1_api, custom_objects_api, own_namespace, read_inference_service
from .kserve_deploy.errors import KServeError
from .kserve_deploy.record import (LOCK_SLACK_S, REVISION_KEY, STORAGE_URI_KEY, deploy_lock, read_record, record_name,
                                   record_served)
from .kserve_deploy.rollout import merge_diff, owned_annotations_patch, roll_out, rollout_state, served_storage_uri

VERSION_KEY = ANNOTATIONS["model_version"]


class RollbackError(Exception):
    """One-line reason the rollback did not start."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `rollback` subcommand's options."""
    parser.add_argument("--to", required=True, metavar="VERSION", help="a model version the deploy record lists")
    parser.add_argument("--namespace", default="", help="namespace of the InferenceService (default: this pod's)")
    parser.add_argument("--service-name", default="", help="InferenceService name (default: derived from "
                                                             "--model-name)")
    parser.add_argument("--model-name", default=MODEL_NAME, help="model name the service name derives from")
    parser.add_argument("--timeout", type=positive_seconds, default=600.0, metavar="S",
                        help="seconds to wait for the rolled-back revision to serve")
    parser.add_argument("--poll", type=positive_seconds, default=5.0, metavar="S", help=argparse.SUPPRESS)


def rollback(version: str, namespace: str, service: str, timeout_s: float = 600.0, poll_s: float = 5.0,
             api: Any = None, core_api: Any = None) -> str:
    """Serve `version` again; returns what happened on one line. RollbackError / KServeError otherwise."""
    from kubernetes.client.exceptions import ApiException

    api = api or custom_objects_api()
    core_api = core_api or core_v1_api()
    where = f"InferenceService {namespace}/{service}"
    try:
        obj = read_inference_service(api, namespace, service)
        record = read_record(core_api, namespace, service) if obj is not None else None
    except ApiException as exc:
        hint = " (the Role of deploy/kubeflow/rbac.yaml grants what rollback needs)" if exc.status in (401, 403) else ""
        raise RollbackError(f"cannot read {where} or its deploy record: {exc.status} {exc.reason}{hint}") from None
    if obj is None:
        raise RollbackError(f"no {where}")
    if record is None:
        raise RollbackError(f"{where} has no deploy record (ConfigMap {record_name(service)}): nothing to roll back to")
    entry = next((e for e in reversed(record.history) if e.get(VERSION_KEY) == version), None)
    if entry is None or not entry.get(STORAGE_URI_KEY):
        known = ", ".join(dict.fromkeys(e.get(VERSION_KEY, "?") for e in record.history)) or "none"
        raise RollbackError(f"version {version!r} is not in the deploy record of {where} (recorded: {known})")
    uri = entry[STORAGE_URI_KEY]
    if record.current == entry and served_storage_uri(obj) == uri and rollout_state(obj, None)[0] == "served":
        return f"{where} already serves version {version} ({uri}): nothing to do"
    was = record.current.get(VERSION_KEY, "?")
    recorded = _revision(entry)

    def make(existing: dict) -> dict:
        labels = {"app.kubernetes.io/version": version}
        if recorded is None:
            return {"metadata": {"labels": labels}, "spec": {"predictor": {"model": {"storageUri": uri}}}}
        predictor = merge_diff((existing.get("spec") or {}).get("predictor") or {}, recorded["predictor"])
        notes = owned_annotations_patch(existing, recorded["annotations"])
        return {"metadata": {"labels": labels, **({"annotations": notes} if notes else {})},
                "spec": {"predictor": predictor}}

    holder = f"pipeline rollback on {socket.gethostname()} pid {os.getpid()}"
    with deploy_lock(core_api, namespace, service, holder, timeout_s + LOCK_SLACK_S):
        served = roll_out(api, namespace, service, make, timeout_s, poll_s)
        record_served(core_api, namespace, service, entry, f"version {version} ({uri})")
    revision = (((served.get("status") or {}).get("components") or {}).get("predictor") or {}).get(
        "latestReadyRevision")
    whole = "its whole predictor" if recorded is not None else "its storage only (recorded before predictors were)"
    return (f"rolled {where} back from version {was} to {version} ({uri}; {whole})"
            + (f": revision {revision} serves" if revision else ""))


def _revision(entry: dict[str, str]) -> dict[str, Any] | None:
    """The predictor and annotations an entry recorded (REVISION_KEY); None for entries from before it."""
    try:
        revision = json.loads(entry.get(REVISION_KEY) or "null")
    except ValueError:
        return None
    if not isinstance(revision, dict) or not isinstance(revision.get("predictor"), dict):
        return None
    return {"predictor": revision["predictor"], "annotations": dict(revision.get("annotations") or {})}


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; one line on stdout (done) or stderr (refused or failed)."""
    try:
        namespace = args.namespace or own_namespace()
        if not namespace:
            raise RollbackError("--namespace is required (not running in a pod whose namespace could be read)")
        service = args.service_name or service_name_for(args.model_name)
        print(rollback(args.to, namespace, service, args.timeout, args.poll))
        return 0
    except (RollbackError, KServeError) as exc:
        print(f"rollback: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rollback: interrupted; the deploy record is unchanged", file=sys.stderr)
        return 130
