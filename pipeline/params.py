"""The pipeline's run parameters in one table: defaults, CLI flags and checks. The build's own parameters are
training.params' table, the one ``python -m training`` makes its options from.

The pipeline function's signature (`pipeline.pipeline`) repeats these names and defaults
because KFP reads them from the signature; a test compares the compiled YAML with this table.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from cli_common import Param
from settings import (DEFAULT_DATA_SOURCE, MODEL_NAME, MODEL_NAME_PATTERN, MODEL_NAME_RULE, MODEL_VERSION,
                      PVC_MOUNT_DEFAULT)
from serving.archive import MODEL_VERSION_PATTERN, MODEL_VERSION_RULE
from serving.runtimes import DEFAULT_SERVING_RUNTIME, SERVING_RUNTIMES
from training.data import SOURCE_FORMS, source_problem
from training.data.sources import pvc_claim
from training.params import TRAINING_PARAMS

from .kserve_deploy.canary import CANARY_PERCENT, CANARY_WINDOW_S, Canary
from .kserve_deploy.manifest import (DEFAULT_API_KEY_SECRET, MAX_REPLICAS, MIN_REPLICAS, PROTOCOLS, SCALE_TARGET,
                                     Scaling)

DEPLOY_TARGETS = ("local", "kserve", "none")
#: The quality gate's open-set minimums (pipeline.quality): the quick start's model clears them (0.997 and 0.994), a
#: model trained for 2 epochs flags 0.30 of non-digits (figures and commands: pipeline/README.md, "The quality gate").
MIN_OPEN_SET_REJECTION = 0.8
MIN_DIGITS_ACCEPTED = 0.98
#: Keys of the storage Secret the KServe deploy task gets as environment (all optional): the AWS SDK's variables.
STORAGE_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")
#: Where the storage Secret is mounted (optional): its keys are files, gcs-key.json a service-account key for gs://.
STORAGE_SECRET_MOUNT = "/var/secrets/storage"
SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SECRET_NAME_RULE = "a Secret name: lowercase letters, digits, '-' and '.', starting and ending alphanumeric"


class ParamError(ValueError):
    """A parameter value the pipeline cannot run with; the message is one line."""


def _accuracy(value: float) -> str | None:
    return None if math.isfinite(value) and value >= 0 else "must be a number >= 0 (above 1 never deploys)"


def _share(value: float) -> str | None:
    return None if math.isfinite(value) and 0 <= value <= 1 else "must be a share between 0 and 1 (0: not checked)"


def _secret_name(value: str) -> str | None:
    return None if not value or SECRET_NAME.match(value) else SECRET_NAME_RULE


def _pattern(regex: re.Pattern, what: str) -> Callable[[str], str | None]:
    return lambda value: None if regex.match(value) else f"{what} ({regex.pattern})"


PARAMS: tuple[Param, ...] = (
    Param("data_source", str, DEFAULT_DATA_SOURCE, SOURCE_FORMS, check=source_problem),
    *TRAINING_PARAMS,
    Param("model_name", str, MODEL_NAME, "TorchServe model name",
          check=_pattern(MODEL_NAME_PATTERN, MODEL_NAME_RULE)),
    Param("model_version", str, MODEL_VERSION, "model version written into the archive",
          check=_pattern(MODEL_VERSION_PATTERN, MODEL_VERSION_RULE)),
    Param("min_accuracy", float, 0.9, "deploy only at or above this held-out accuracy", check=_accuracy),
    Param("min_open_set_rejection", float, MIN_OPEN_SET_REJECTION,
          "deploy only when at least this share of synthetic non-digits is answered unknown", check=_share),
    Param("min_digits_accepted", float, MIN_DIGITS_ACCEPTED,
          "deploy only when the unknown threshold accepts at least this share of held-out digits (cross-fitted)",
          check=_share),
    Param("allow_unknown_current", bool, False,
          "deploy to KServe even when the live InferenceService's accuracy cannot be read (no API access, "
          "no annotation); otherwise that fails the run"),
    Param("deploy_target", str, "none", "where a model that passes the gate goes", choices=DEPLOY_TARGETS),
    Param("serving_runtime", str, DEFAULT_SERVING_RUNTIME, "what serves the model, locally and on KServe: "
          "torchserve, or python (the same .mar without Java; docs/decisions.md says when)",
          choices=tuple(SERVING_RUNTIMES)),
    Param("serve_workdir", str, "", "local TorchServe working directory (logs, key file); '' = local_outputs/serve"),
    Param("serve_config", str, "", "local TorchServe config.properties; '' = the project's"),
    Param("kserve_storage_uri", str, "", "where the model store is written: s3://, gs://, pvc://<claim>/<path> "
          "(claim mounted in the task), or a local directory with kserve_dry_run"),
    Param("kserve_model_uri", str, "", "kserve_storage_uri as the cluster reads it (e.g. pvc://claim/dir); "
          "'' = kserve_storage_uri itself; the version directory is appended to both"),
    Param("kserve_namespace", str, "", "namespace of the InferenceService; '' = the pipeline run's own namespace"),
    Param("kserve_service_name", str, "", "InferenceService name; '' = derived from model_name"),
    Param("kserve_protocol", str, "v1", "KServe inference protocol", choices=PROTOCOLS),
    Param("kserve_runtime", str, "", "ClusterServingRuntime serving the model; '' = the project's one for "
          "serving_runtime (deploy/kserve/servingruntime*.yaml)"),
    Param("kserve_service_account", str, "", "service account holding the storage credentials"),
    Param("kserve_api_key_secret", str, DEFAULT_API_KEY_SECRET,
          "Secret whose key api-key callers present as a bearer token"),
    Param("kserve_pvc_claim", str, "", f"claim mounted in the deploy task at {PVC_MOUNT_DEFAULT} for pvc:// storage "
          "('' = taken from a pvc:// kserve_storage_uri)"),
    Param("kserve_image_pull_secret", str, "", "Secret the InferenceService's predictor pulls its image with "
          "('' = none)", check=_secret_name),
    Param("kserve_min_replicas", int, MIN_REPLICAS, "predictor replicas at least (0: Knative may scale to zero)"),
    Param("kserve_max_replicas", int, MAX_REPLICAS, "predictor replicas at most"),
    Param("kserve_scale_target", int, SCALE_TARGET, "requests in flight per pod that Knative scales on (serverless "
          "mode; raw mode keeps KServe's CPU autoscaling)"),
    Param("kserve_canary_percent", int, CANARY_PERCENT, "share of traffic a new model version gets while it is "
          "watched before promotion (serverless mode; 0: all at once)"),
    Param("kserve_canary_window", float, CANARY_WINDOW_S, "seconds the canary is watched before it is promoted or "
          "taken back"),
    Param("kserve_prometheus_url", str, "", "Prometheus scraping the predictor pods, whose figures judge the canary "
          "(5xx share, unknown share, p99 against the stable version); '' = judged on readiness alone"),
    Param("kserve_watch_timeout", float, 600.0, "seconds deploy waits for the new revision to serve before it puts "
          "the spec back", check=lambda value: None if math.isfinite(value) and value > 0 else "must be > 0"),
    Param("kserve_dry_run", bool, False, "write the storage layout and return the manifest; touch no cluster"),
)
DEFAULTS: dict[str, Any] = {p.name: p.default for p in PARAMS}
#: The Secret mounted in the deploy task: a compile option (pipeline.options), and a run parameter only when
#: compiled with --secret-name-parameter.
STORAGE_SECRET = Param("storage_secret", str, "mnist-embedding-storage",
                       f"Secret mounted at {STORAGE_SECRET_MOUNT} in the deploy task, optional, as are its keys: "
                       f"{', '.join(STORAGE_SECRET_ENV)} (the deploy task's environment) and gcs-key.json (for gs://)")


def storage_environment(mount: Path = Path(STORAGE_SECRET_MOUNT),
                        environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of STORAGE_SECRET_ENV the mounted Secret holds and `environ` (os.environ) lacks.

    The deploy task reads them from the mounted files rather than through secretAsEnv: an optional
    secretAsEnv needs a newer backend than pipeline.kfp_backend.OLDEST, while an optional Secret volume does not.
    """
    environ = os.environ if environ is None else environ
    found = {key: (mount / key).read_text().strip() for key in STORAGE_SECRET_ENV
             if key not in environ and (mount / key).is_file()}
    gcs_key = mount / "gcs-key.json"
    if gcs_key.is_file() and "GOOGLE_APPLICATION_CREDENTIALS" not in environ:
        found["GOOGLE_APPLICATION_CREDENTIALS"] = str(gcs_key)
    return found


def validate(values: dict[str, Any]) -> dict[str, Any]:
    """Complete `values` with defaults and check each one; raises ParamError on the first bad value."""
    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        raise ParamError(f"unknown parameter(s): {', '.join(unknown)}")
    out = {**DEFAULTS, **values}
    for p in PARAMS:
        value = out[p.name]
        if p.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = out[p.name] = float(value)
        if not isinstance(value, p.type) or (p.type is int and isinstance(value, bool)):
            raise ParamError(f"{p.name}: expected {p.type.__name__}, got {value!r}")
        if p.choices and value not in p.choices:
            raise ParamError(f"{p.name}: {value!r} is not one of {', '.join(p.choices)}")
        problem = p.check(value) if p.check else None
        if problem:
            raise ParamError(f"{p.name}={value!r}: {problem}")
    scaling = Scaling(out["kserve_min_replicas"], out["kserve_max_replicas"], out["kserve_scale_target"])
    if scaling.problem():
        raise ParamError(f"kserve_min_replicas, kserve_max_replicas, kserve_scale_target: {scaling.problem()}")
    canary = Canary(out["kserve_canary_percent"], out["kserve_canary_window"], out["kserve_prometheus_url"])
    if canary.problem():
        raise ParamError(f"kserve_canary_percent, kserve_canary_window, kserve_prometheus_url: {canary.problem()}")
    if out["deploy_target"] == "kserve" and not out["kserve_storage_uri"]:
        raise ParamError("deploy_target=kserve needs kserve_storage_uri (an s3://, gs:// or pvc:// URI)")
    uri = out["kserve_storage_uri"]
    claim = pvc_claim(uri)
    if claim is not None:
        if out["kserve_pvc_claim"] and out["kserve_pvc_claim"] != claim:
            raise ParamError(f"kserve_pvc_claim={out['kserve_pvc_claim']!r} but kserve_storage_uri names claim {claim!r}")
        out["kserve_pvc_claim"] = claim
    return out


def add_arguments(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """One flag per parameter; `defaults` overrides the table's default for this command only."""
    group = parser.add_argument_group("pipeline parameters")
    for p in PARAMS:
        default = defaults.get(p.name, p.default)
        if p.type is bool:
            group.add_argument(*p.flags, dest=p.name, action="store_true", default=default, help=p.help)
            continue
        shown = f" (default: {default!r})"
        group.add_argument(*p.flags, dest=p.name, type=p.type, choices=p.choices, default=default,
                           help=p.help + shown, metavar=None if p.choices else p.type.__name__.upper())


def from_namespace(args: argparse.Namespace) -> dict[str, Any]:
    return {p.name: getattr(args, p.name) for p in PARAMS}
