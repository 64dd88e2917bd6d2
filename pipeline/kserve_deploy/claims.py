"""pvc:// storage: the claim KServe mounts must be one the deploy task can share."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from .api import api_error, call, own_namespace
from .errors import KServeError


def check_claim(core: Any, model_uri: str, storage_uri: str, namespace: str) -> None:
    """pvc:// rules: KServe mounts the claim in the InferenceService's namespace, the deploy task in its own, so
    where both name a claim the two namespaces must be one (checked when this runs in a pod); the claim must be
    ReadWriteMany, since the task writes while serving pods on other nodes read. KServeError otherwise."""
    from kubernetes.client.exceptions import ApiException

    parts = urlsplit(model_uri)
    if parts.scheme != "pvc":
        return
    claim = parts.netloc
    own = own_namespace()
    if urlsplit(storage_uri).scheme == "pvc" and own and own != namespace:
        raise KServeError(f"{model_uri}: KServe mounts claim {claim} from namespace {namespace} but this task runs "
                          f"in {own}, where its claim is mounted: deploy to {own}, or use s3:// or gs://")
    try:
        pvc = call(core.read_namespaced_persistent_volume_claim, claim, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise KServeError(f"{model_uri}: no PersistentVolumeClaim {claim} in namespace {namespace}, where KServe "
                              "mounts it") from None
        hint = (" (needs get on persistentvolumeclaims: deploy/kubeflow/rbac.yaml)" if exc.status in (401, 403)
                else "")
        raise KServeError(f"cannot read PersistentVolumeClaim {namespace}/{claim}: {api_error(exc)}{hint}") from None
    modes = (pvc.status.access_modes if pvc.status and pvc.status.access_modes else pvc.spec.access_modes) or []
    if "ReadWriteMany" not in modes:
        raise KServeError(f"{model_uri}: claim {namespace}/{claim} is {', '.join(modes) or 'without access modes'}; "
                          "it must be ReadWriteMany (the deploy task writes while serving pods read)")
