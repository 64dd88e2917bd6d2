"""The Kubeflow Pipelines API as `python -m pipeline submit` calls it: the health check, the backend version
check against pipeline.releases, and one-line errors for each way the API or the way to it fails."""

from __future__ import annotations

import json
import sys
from typing import Any

from . import kfp_backend, releases

TOKEN_ENV = "KF_PIPELINES_TOKEN"
HEALTHZ_PATH = "/apis/v2beta1/healthz"


class ApiError(Exception):
    """One-line reason a call to the Kubeflow Pipelines API failed, with what to check."""


def unnamed_text() -> str:
    """The supported releases whose KFP API server does not name its version, as "KFP 2.4.1 (Kubeflow 1.10.0), ..."."""
    by_kfp: dict[str, list[str]] = {}
    for release in releases.unnamed_kfp():
        by_kfp.setdefault(release.kfp_text, []).append(release.kubeflow)
    return ", ".join(f"KFP {kfp} (Kubeflow {' and '.join(kubeflow)})" for kfp, kubeflow in by_kfp.items())


def unreachable_reason(exc: BaseException) -> str:
    import urllib3

    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    reason = str(exc).split(": ", 1)[-1] if isinstance(exc, urllib3.exceptions.NewConnectionError) else str(exc)
    return " ".join(reason.split())


def _server_detail(body: object) -> str:
    """The server's own message (KFP answers {"error", "code", "message", "details"}), on one short line."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body.strip():
        return ""
    try:
        data = json.loads(body)
        text = str(data.get("message") or data.get("error") or "") if isinstance(data, dict) else ""
    except ValueError:
        text = "" if body.lstrip().startswith("<") else body  # an HTML error page says nothing useful
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


def api_error(host: str, step: str, exc: Any) -> ApiError:
    """One line for an error status of the KFP API: the status, the server's message, what to check."""
    status, reason = exc.status, " ".join(str(exc.reason or "").split())
    if not status:  # TLS failures and the like: kfp_server_api reports them as status 0
        return ApiError(f"cannot reach Kubeflow Pipelines at {host}: {reason}")
    if status == 401:
        hint = f"check the token (--token or ${TOKEN_ENV}): missing, wrong or expired"
    elif status == 403:
        hint = ("the token was accepted but may not do this: check --namespace (your profile namespace) and "
                "that the account may use it")
    elif status == 404 and step.startswith("check"):
        hint = ("check --host: the Kubeflow Pipelines API root (behind the Kubeflow gateway "
                "https://HOST/pipeline), and a KFP 2.x backend (1.x has no v2beta1 API)")
    elif status == 404:
        hint = "check --host and that the experiment and --namespace exist"
    elif status >= 500:
        hint = "the Kubeflow Pipelines API server failed: see its log (deploy/ml-pipeline) and retry"
    else:
        hint = "the server refused the request"
    detail = _server_detail(getattr(exc, "body", None))
    return ApiError(f"{host} answered {status} {reason} to {step}{f' ({detail})' if detail else ''}: {hint}")


def api_client(host: str, token: str | None) -> Any:
    """A kfp_server_api client configured as kfp.client.Client configures it for an explicit host/token."""
    import kfp_server_api

    config = kfp_server_api.Configuration(host=host)
    if token:
        config.api_key["authorization"] = token
        config.api_key_prefix["authorization"] = "Bearer"
    return kfp_server_api.ApiClient(config)


def backend_health(host: str, token: str | None) -> dict:
    """GET /apis/v2beta1/healthz.

    The API server answers {"commit_sha", "tag_name", "multi_user"} (kfp_server_api's model keeps only
    multi_user, so the JSON is read here); `tag_name` is its release, "unknown" on builds without one."""
    import kfp_server_api

    api = kfp_server_api.HealthzServiceApi(api_client(host, token))
    response = api.healthz_service_get_healthz(_preload_content=False, _request_timeout=(10, 60))
    try:
        health = json.loads(response.data)
        if not isinstance(health, dict):
            raise ValueError
    except ValueError:
        kind = response.headers.get("Content-Type", "a body")
        raise ApiError(f"{host}{HEALTHZ_PATH} answered {kind}, not the Kubeflow Pipelines health JSON: check "
                       "--host (a login page means the gateway did not accept the token)") from None
    return health


def check_version(host: str, health: dict, needed: kfp_backend.Version, why: str,
                   stated: kfp_backend.Version | None = None) -> None:
    """Refuse a backend older than the compiled package needs, and one whose version is not known: healthz's
    `tag_name`, else the --backend-version the user states. A backend newer than the newest supported release
    (pipeline.releases) is accepted with a warning: its messages are a superset of those the package was
    checked against."""
    tag = health.get("tag_name")
    reported = kfp_backend.parse_version(tag)
    minimum = kfp_backend.version_text(needed)
    if reported is not None and stated is not None and reported != stated:
        raise ApiError(f"--backend-version {kfp_backend.version_text(stated)}, but {host} reports KFP backend {tag}")
    version = reported or stated
    if version is None:
        raise ApiError(f"{host} does not report its Kubeflow Pipelines version (healthz tag_name {tag!r}, as the "
                       f"images of {unnamed_text()} answer), so this package's need for {minimum} or later "
                       f"cannot be checked: pass --backend-version with the version your Kubeflow ships")
    shown = tag if reported else f"{kfp_backend.version_text(version)} (--backend-version)"
    if version < needed:
        raise ApiError(f"KFP backend {shown} is older than {minimum}, which this package needs: {why}")
    newest = releases.NEWEST
    if version > newest.kfp:
        print(f"pipeline: warning: KFP backend {shown} is newer than the newest supported, {newest.kfp_text} "
              f"(Kubeflow {newest.kubeflow}); going on", file=sys.stderr)
