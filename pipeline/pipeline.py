"""The KFP pipeline: data -> train -> index -> evaluate -> archive, check-quality -> (quality gate) -> deploy.

`build(options)` makes the pipeline for one set of compile options (pipeline.options); its run parameters
are `options.run_params()`, pipeline.params' table, given to KFP as the function's signature.
`mnist_embedding_pipeline` is the pipeline of the default options.
"""

from __future__ import annotations

import inspect
from typing import Any

from kfp import dsl, kubernetes
from kfp.compiler.compiler_utils import _cpu_to_float, _memory_to_float

from settings import PVC_MOUNT_DEFAULT
from training.params import CONFIG_FIELDS

from .kfp_backend import RUN_ID_ENV, RUN_ID_FIELD_PATH
from .components import (archive, build_index, check_quality, compare_with_deployed, deploy_kserve, deploy_local,
                         evaluate, load_data, train)
from .options import CompileOptions
from .params import STORAGE_SECRET_MOUNT

PIPELINE_NAME = "mnist-embedding"
DESCRIPTION = ("Train an MNIST embedding model and FAISS gallery, archive it for TorchServe, and deploy it when it "
               "beats the quality gate.")


class _Tasks:
    """Gives every task of the pipeline its resources and image pull secrets from the compile options."""

    def __init__(self, options: CompileOptions):
        self.options = options

    def __call__(self, task: dsl.PipelineTask) -> dsl.PipelineTask:
        name = task.component_spec.name.replace("_", "-")
        res = self.options.resources[name]
        for kind, to_float in (("cpu", _cpu_to_float), ("memory", _memory_to_float)):
            request, limit = getattr(res, f"{kind}_request"), getattr(res, f"{kind}_limit")
            try:
                getattr(task, f"set_{kind}_request")(request)
                getattr(task, f"set_{kind}_limit")(limit)
                above = to_float(request) > to_float(limit)
            except ValueError as exc:
                raise ValueError(f"{name}: {kind} {request}/{limit}: {exc}") from None
            if above:
                raise ValueError(f"{name}: {kind} request {request} is above its limit {limit}")
        if self.options.image_pull_secrets:
            kubernetes.set_image_pull_secrets(task, list(self.options.image_pull_secrets))
        return task


def _graph(p: dict[str, Any], options: CompileOptions) -> None:
    task = _Tasks(options)
    # The storage Secret's name: a run parameter only where the backend reads one (--secret-name-parameter).
    secret = p["storage_secret"] if options.secret_name_parameter else options.storage_secret
    # The data behind a URI can change while the URI does not: never reuse a cached load. The storage Secret
    # gives the task its credentials for s3:// and gs:// sources (training.data.remote reads them from the env).
    data = task(load_data(source=p["data_source"], preprocessing=p["preprocessing"])).set_caching_options(False)
    kubernetes.use_secret_as_volume(data, secret_name=secret, mount_path=STORAGE_SECRET_MOUNT, optional=True)
    if options.data_pvc_claim:
        kubernetes.mount_pvc(data, pvc_name=options.data_pvc_claim, mount_path=PVC_MOUNT_DEFAULT)
    trained = task(train(dataset=data.outputs["dataset"], k=p["k"], **{name: p[name] for name in CONFIG_FIELDS}))
    indexed = task(build_index(dataset=data.outputs["dataset"], model=trained.outputs["model"],
                               index_type=p["index_type"], seed=p["seed"]))
    evaluated = task(evaluate(dataset=data.outputs["dataset"], artifacts=indexed.outputs["artifacts"], k=p["k"],
                              open_set_score=p["open_set_score"], kth=p["kth"]))
    packed = task(archive(artifacts=evaluated.outputs["evaluated"], model_name=p["model_name"],
                          model_version=p["model_version"]))
    quality = task(check_quality(evaluated=evaluated.outputs["evaluated"], min_accuracy=p["min_accuracy"],
                                 min_open_set_rejection=p["min_open_set_rejection"],
                                 min_digits_accepted=p["min_digits_accepted"]))
    mar = packed.outputs["mar"]

    with dsl.If(quality.outputs["Output"] == "pass", name="quality-gate"):
        with dsl.If(p["deploy_target"] == "local", name="target-local"):
            task(deploy_local(mar=mar, model_name=p["model_name"], workdir=p["serve_workdir"],
                              config=p["serve_config"], runtime=p["serving_runtime"])).set_caching_options(False)
        with dsl.Elif(p["deploy_target"] == "kserve", name="target-kserve"):
            gate = task(compare_with_deployed(evaluated=evaluated.outputs["evaluated"], model_name=p["model_name"],
                                              namespace=p["kserve_namespace"], service_name=p["kserve_service_name"],
                                              allow_unknown_current=p["allow_unknown_current"]))
            gate.set_caching_options(False)
            with dsl.If(gate.outputs["Output"] == "deploy", name="no-regression"):
                inputs = dict(mar=mar, model_name=p["model_name"], model_version=p["model_version"],
                              storage_uri=p["kserve_storage_uri"], model_uri=p["kserve_model_uri"],
                              namespace=p["kserve_namespace"], service_name=p["kserve_service_name"],
                              protocol=p["kserve_protocol"], runtime=p["kserve_runtime"],
                              serving_runtime=p["serving_runtime"], min_replicas=p["kserve_min_replicas"],
                              max_replicas=p["kserve_max_replicas"], scale_target=p["kserve_scale_target"],
                              watch_timeout_s=p["kserve_watch_timeout"], canary_percent=p["kserve_canary_percent"],
                              canary_window_s=p["kserve_canary_window"], prometheus_url=p["kserve_prometheus_url"],
                              service_account=p["kserve_service_account"], api_key_secret=p["kserve_api_key_secret"],
                              image_pull_secret=p["kserve_image_pull_secret"], run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                              dry_run=p["kserve_dry_run"])
                # One task per storage kind: only a pvc:// deploy mounts a claim.
                with dsl.If(p["kserve_pvc_claim"] == "", name="object-storage"):
                    _deploy_kserve(task, secret, inputs)
                with dsl.Else(name="pvc-storage"):
                    kubernetes.mount_pvc(_deploy_kserve(task, secret, inputs), pvc_name=p["kserve_pvc_claim"],
                                         mount_path=PVC_MOUNT_DEFAULT)


def _deploy_kserve(task: _Tasks, secret: Any, inputs: dict[str, Any]) -> dsl.PipelineTask:
    """The deploy-kserve task with the storage Secret mounted, optional (so are its keys): nothing secret is
    ever a pipeline parameter. The task reads the credentials from the files (params.storage_environment).

    The run id for the deploy record comes from the pod's own run-id label as an environment variable
    (pipeline.kfp_backend.RUN_ID_LABEL): drivers before 2.5.0 pass the run_id input, {{$.pipeline_job_uuid}}, through
    unresolved, while every supported driver sets field-path variables."""
    deploy = task(deploy_kserve(**inputs)).set_caching_options(False)
    kubernetes.use_secret_as_volume(deploy, secret_name=secret, mount_path=STORAGE_SECRET_MOUNT, optional=True)
    kubernetes.use_field_path_as_env(deploy, env_name=RUN_ID_ENV, field_path=RUN_ID_FIELD_PATH)
    return deploy


def build(options: CompileOptions | None = None) -> Any:
    """The pipeline (a kfp GraphComponent) under `options`; ValueError (one line) for unusable resources."""
    options = options or CompileOptions()
    run_params = options.run_params()
    names = [p.name for p in run_params]

    def pipeline_func(*args: Any) -> None:
        _graph(dict(zip(names, args)), options)

    pipeline_func.__name__ = pipeline_func.__qualname__ = "mnist_embedding_pipeline"
    pipeline_func.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default, annotation=p.type)
        for p in run_params])
    return dsl.pipeline(name=PIPELINE_NAME, description=DESCRIPTION)(pipeline_func)


mnist_embedding_pipeline = build()
