"""The KFP pipeline: data -> train -> index -> evaluate -> archive -> (quality gate) -> deploy.

Parameter names and defaults mirror `pipeline.params.PARAMS` (KFP reads them from this signature).
"""

from kfp import dsl, kubernetes

from .components import (archive, build_index, compare_with_deployed, deploy_kserve, deploy_local, evaluate,
                         load_data, train)
from .kserve import PVC_MOUNT_DEFAULT
from .params import DEFAULTS as D
from .params import STORAGE_SECRET_ENV, STORAGE_SECRET_MOUNT

PIPELINE_NAME = "mnist-embedding"


def _deploy_kserve(storage_secret, **inputs) -> dsl.PipelineTask:
    """The deploy-kserve task with its storage credentials from a Kubernetes Secret (all keys optional), so
    nothing secret is ever a pipeline parameter."""
    task = deploy_kserve(**inputs).set_caching_options(False)
    kubernetes.use_secret_as_env(task, secret_name=storage_secret, optional=True,
                                 secret_key_to_env={key: key for key in STORAGE_SECRET_ENV})
    kubernetes.use_secret_as_volume(task, secret_name=storage_secret, mount_path=STORAGE_SECRET_MOUNT, optional=True)
    return task


@dsl.pipeline(name=PIPELINE_NAME, description="Train an MNIST embedding model and FAISS gallery, archive it "
              "for TorchServe, and deploy it when it beats the quality gate.")
def mnist_embedding_pipeline(
    data_source: str = D["data_source"],
    preprocessing: str = D["preprocessing"],
    epochs: int = D["epochs"],
    embedding_dim: int = D["embedding_dim"],
    width: int = D["width"],
    seed: int = D["seed"],
    quantize: str = D["quantize"],
    precision: str = D["precision"],
    k: int = D["k"],
    index_type: str = D["index_type"],
    model_name: str = D["model_name"],
    model_version: str = D["model_version"],
    min_accuracy: float = D["min_accuracy"],
    allow_unknown_current: bool = D["allow_unknown_current"],
    deploy_target: str = D["deploy_target"],
    serve_workdir: str = D["serve_workdir"],
    serve_config: str = D["serve_config"],
    kserve_storage_uri: str = D["kserve_storage_uri"],
    kserve_model_uri: str = D["kserve_model_uri"],
    kserve_namespace: str = D["kserve_namespace"],
    kserve_service_name: str = D["kserve_service_name"],
    kserve_protocol: str = D["kserve_protocol"],
    kserve_runtime: str = D["kserve_runtime"],
    kserve_service_account: str = D["kserve_service_account"],
    kserve_api_key_secret: str = D["kserve_api_key_secret"],
    kserve_pvc_claim: str = D["kserve_pvc_claim"],
    storage_secret: str = D["storage_secret"],
    kserve_dry_run: bool = D["kserve_dry_run"],
):
    data = load_data(source=data_source, preprocessing=preprocessing)
    trained = train(dataset=data.outputs["dataset"], epochs=epochs, embedding_dim=embedding_dim, width=width,
                    seed=seed, k=k, quantize=quantize, precision=precision)
    indexed = build_index(dataset=data.outputs["dataset"], model=trained.outputs["model"], index_type=index_type,
                          seed=seed)
    evaluated = evaluate(dataset=data.outputs["dataset"], artifacts=indexed.outputs["artifacts"], k=k)
    packed = archive(artifacts=evaluated.outputs["evaluated"], model_name=model_name, model_version=model_version)
    accuracy = evaluated.outputs["Output"]
    mar = packed.outputs["mar"]

    with dsl.If(accuracy >= min_accuracy, name="quality-gate"):
        with dsl.If(deploy_target == "local", name="target-local"):
            deploy_local(mar=mar, model_name=model_name, workdir=serve_workdir,
                         config=serve_config).set_caching_options(False)
        with dsl.Elif(deploy_target == "kserve", name="target-kserve"):
            gate = compare_with_deployed(evaluated=evaluated.outputs["evaluated"], model_name=model_name,
                                         namespace=kserve_namespace, service_name=kserve_service_name,
                                         allow_unknown_current=allow_unknown_current)
            gate.set_caching_options(False)
            with dsl.If(gate.outputs["Output"] == "deploy", name="no-regression"):
                inputs = dict(mar=mar, model_name=model_name, model_version=model_version,
                              storage_uri=kserve_storage_uri, model_uri=kserve_model_uri, namespace=kserve_namespace,
                              service_name=kserve_service_name, protocol=kserve_protocol, runtime=kserve_runtime,
                              service_account=kserve_service_account, api_key_secret=kserve_api_key_secret,
                              run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, dry_run=kserve_dry_run)
                # One task per storage kind: only a pvc:// deploy mounts a claim.
                with dsl.If(kserve_pvc_claim == "", name="object-storage"):
                    _deploy_kserve(storage_secret, **inputs)
                with dsl.Else(name="pvc-storage"):
                    kubernetes.mount_pvc(_deploy_kserve(storage_secret, **inputs), pvc_name=kserve_pvc_claim,
                                         mount_path=PVC_MOUNT_DEFAULT)
