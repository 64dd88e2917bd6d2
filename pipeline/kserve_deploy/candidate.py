"""The canary's candidate revision asked directly, through its own route, before it is watched: it must answer a
held-out digit with the model the archive holds. Every answer names its model by `model_digest` (SHA-256 of the
metadata.json inside the .mar), so this proves what the candidate's pods loaded, not what the spec names.

The route: with tag routing KServe gives the candidate the tag `latest` (pipeline.kserve_deploy.canary) and Knative a
Service named `latest-<route>` in the namespace for it (knative/serving knative-v1.15.3,
pkg/reconciler/route/resources/service.go MakeK8sService, named by domains.HostnameFromTemplate), reachable in the
cluster as `latest-<service>-predictor.<namespace>.svc.cluster.local` whatever the ingress domain. The key comes
from the Secret the predictor reads (deploy/kubeflow/rbac.yaml grants `get` on that one Secret).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from serving.gateway.auth import API_KEY_HEADER

from .errors import KServeError

#: The key of the API key Secret (manifest.inference_service's secretKeyRef).
SECRET_KEY = "api-key"
PROBE_TIMEOUT_S = 30.0
#: Envoy's body when an Istio sidecar's AuthorizationPolicy refuses a call, and what to do about it.
MESH_REFUSAL = "RBAC: access denied"
MESH_REFUSAL_HINT = (" (the pod's Istio sidecar refused it: apply deploy/kserve/authorizationpolicy.yaml in the "
                     "namespace, see docs/kserve.md)")


def archive_digest(mar: Path) -> str | None:
    """"sha256:<hex>" of the metadata.json inside the .mar (what its answers name); None without one."""
    try:
        with zipfile.ZipFile(mar) as archive:
            names = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "metadata.json"]
            return "sha256:" + hashlib.sha256(archive.read(min(names, key=len))).hexdigest() if names else None
    except (OSError, zipfile.BadZipFile):
        return None


def in_cluster_url(tag_url: str, namespace: str) -> str:
    """The cluster-local address of a tagged revision's route, from the URL status gives it."""
    host = urlsplit(tag_url).hostname or ""
    return f"http://{host.split('.', 1)[0]}.{namespace}.svc.cluster.local"


def read_key(core: Any, namespace: str, secret: str) -> str:
    """The callers' key from Secret `secret`; KServeError when it cannot be read."""
    from kubernetes.client.exceptions import ApiException

    from .api import api_error, call

    try:
        data = call(core.read_namespaced_secret, secret, namespace).data or {}
    except ApiException as exc:
        hint = " (deploy/kubeflow/rbac.yaml grants get on it)" if exc.status in (401, 403) else ""
        raise KServeError(f"cannot read Secret {namespace}/{secret}: {api_error(exc)}{hint}") from None
    if SECRET_KEY not in data:
        raise KServeError(f"Secret {namespace}/{secret} has no key {SECRET_KEY!r}")
    return base64.b64decode(data[SECRET_KEY]).decode()


def sample_png() -> bytes:
    """A held-out 7 as users send it."""
    from serving.samples import held_out_digits, user_digit_png

    return user_digit_png(held_out_digits()[7])


def answered_digest(url: str, model: str, key: str, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """The model_digest of the answer `url` gives a held-out digit (KServe v1); KServeError otherwise."""
    body = json.dumps({"instances": [{"data": base64.b64encode(sample_png()).decode()}]}).encode()
    request = urllib.request.Request(f"{url}/v1/models/{model}:predict", data=body, method="POST",
                                     headers={"Content-Type": "application/json", API_KEY_HEADER: key})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.load(io.TextIOWrapper(response, encoding="utf-8"))
    except urllib.error.HTTPError as exc:
        said = exc.read()[:200].decode(errors="replace")
        hint = MESH_REFUSAL_HINT if exc.code == 403 and said.startswith(MESH_REFUSAL) else ""
        raise KServeError(f"{url} answered {exc.code}: {said}{hint}") from None
    except (OSError, ValueError) as exc:
        raise KServeError(f"{url} did not answer: {exc}") from None
    try:
        return answer["predictions"][0]["model_digest"]
    except (KeyError, IndexError, TypeError):
        raise KServeError(f"{url} answered without a model_digest: {str(answer)[:200]}") from None


def checker(core: Any, namespace: str, secret: str, model: str, mar: Path) -> Callable[[str], tuple[str, str]] | None:
    """check(tag URL) -> (problem or "", what was checked) for the candidate of `mar`; None when the archive names
    no model digest (nothing to compare with)."""
    expected = archive_digest(mar)
    if expected is None:
        return None

    def check(tag_url: str) -> tuple[str, str]:
        if not tag_url:
            return "the candidate has no tagged URL (tag routing off?)", ""
        url = in_cluster_url(tag_url, namespace)
        try:
            got = answered_digest(url, model, read_key(core, namespace, secret))
        except KServeError as exc:
            return f"asked through its own route, it did not answer: {exc}", ""
        if got != expected:
            return (f"asked through its own route ({url}), it answered with model {got[:19]}, not the archive's "
                    f"{expected[:19]}"), ""
        return "", f"its own route answered with the archive's model {expected[:19]}"
    return check
