"""The Kubernetes API as deploy, the gate and rollback use it: clients from in-cluster credentials or a kubeconfig,
calls retried with backoff on 429 and 5xx (`call`), errors on one line (`api_error`), and the pod's own namespace."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .errors import KServeError

#: The InferenceService resource: group, version and plural of its API path.
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"

#: Where a pod finds its own namespace.
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def resolve_namespace(namespace: str) -> str:
    """The given namespace, else the pipeline run's own (read inside its pod); KServeError when neither."""
    if namespace:
        return namespace
    own = own_namespace()
    if not own:
        raise KServeError("kserve_namespace is required (not running in a pod whose namespace could be read)")
    return own


def api_client() -> Any:
    """A Kubernetes API client: in-cluster credentials, else the kubeconfig ($KUBECONFIG as it is now: the client
    library reads that variable only once, at import)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        try:
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                    client_configuration=configuration)
        except (config.ConfigException, OSError) as exc:
            raise KServeError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from None
    return client.ApiClient(configuration)


def custom_objects_api() -> Any:
    """The Kubernetes API for custom objects (InferenceServices)."""
    from kubernetes import client

    return client.CustomObjectsApi(api_client())


def core_v1_api() -> Any:
    """The Kubernetes core API (the deploy record's ConfigMap, PersistentVolumeClaims)."""
    from kubernetes import client

    return client.CoreV1Api(api_client())


#: Attempts of one Kubernetes API call that answers 429 or 5xx, and the first pause between them (doubling).
API_ATTEMPTS, API_BACKOFF_S = 5, 0.5
#: Attempts of a write whose resourceVersion went stale (409 Conflict): re-read and re-apply.
CONFLICT_ATTEMPTS = 5


def api_error(exc: Any) -> str:
    """`<code> <reason>: <the API server's message>` on one line."""
    message = ""
    try:
        message = json.loads(exc.body or "{}").get("message", "")
    except (TypeError, ValueError, AttributeError):
        pass
    return f"{exc.status} {exc.reason}" + (f": {message.splitlines()[0]}" if message else "")


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args)`, again with backoff while the API server answers 429 or 5xx. Only for reads and for writes that
    are safe to repeat: a create (a repeat answers 409 AlreadyExists) or a write carrying a resourceVersion (a
    repeat after a lost answer finds the version moved on and answers 409)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    pause = API_BACKOFF_S
    for attempt in range(1, API_ATTEMPTS + 1):
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if attempt == API_ATTEMPTS or not (exc.status == 429 or (exc.status or 0) >= 500):
                raise
        except (HTTPError, OSError) as exc:
            if attempt == API_ATTEMPTS:
                raise KServeError(f"cannot reach the Kubernetes API: {type(exc).__name__}") from None
        time.sleep(pause)
        pause = min(pause * 2, 8.0)
    raise AssertionError("unreachable")


def read_inference_service(api: Any, namespace: str, name: str) -> dict | None:
    """The InferenceService namespace/name; None when there is none. ApiException on other failures."""
    from kubernetes.client.exceptions import ApiException

    try:
        return call(api.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def apps_v1_api() -> Any:
    """The Kubernetes apps API (the predictor Deployment of raw deployment mode)."""
    from kubernetes import client

    return client.AppsV1Api(api_client())


def own_namespace() -> str:
    """The namespace this pod runs in; '' outside a pod."""
    try:
        return NAMESPACE_FILE.read_text().strip()
    except OSError:
        return ""
