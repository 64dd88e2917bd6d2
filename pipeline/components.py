"""KFP v2 lightweight components: thin wrappers over the project's plain functions.

KFP ships each function's source on its own, so every import is inside the body; the
project itself must be importable where the task runs (the project image sets PYTHONPATH,
`python -m pipeline run-local` puts the repository on PYTHONPATH).
"""

import os

from kfp import dsl
from kfp.dsl import Artifact, ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output

DEFAULT_PIPELINE_IMAGE = "ghcr.io/example/mnist-embedding:0.1.0"
#: Image every task runs in on a cluster; read when this module is imported (at compile time).
PIPELINE_IMAGE = os.environ.get("PIPELINE_IMAGE") or DEFAULT_PIPELINE_IMAGE

component = dsl.component(base_image=PIPELINE_IMAGE, install_kfp_package=False, packages_to_install=[])


@component
def load_data(source: str, dataset: Output[Dataset], preprocessing: str = "auto") -> None:
    """Load and validate a data source; write the canvases of the preprocessing profile as .npz.

    s3:// and gs:// sources read their credentials from the mounted storage Secret's files
    (pipeline.params.storage_environment), as the deploy task does.
    """
    import os
    from pathlib import Path

    from pipeline.params import storage_environment
    from training.steps import prepare_data

    os.environ.update(storage_environment())
    data = prepare_data(source, profile=preprocessing)
    data.save(Path(dataset.path))
    dataset.metadata.update({"format": "npz", "preprocessing": data.profile, **data.summary()})


@component
def train(dataset: Input[Dataset], epochs: int, embedding_dim: int, width: int, batch_size: int, lr: float,
          seed: int, negatives: int, printed: int, oe_weight: float, oe_loss: str, oe_margin: float, quantize: str,
          precision: str, k: int, model: Output[Model]) -> None:
    """Train the embedding network with training.params' parameters, as ``python -m training`` does (precision
    bf16: the forward pass autocast); the output directory holds the network (model.pt, float32; or model.pt2, int8,
    when quantize resolves to int8: auto does for the digits profile) and train.json. The model's metadata records
    the resolved quantize, never auto."""
    from pathlib import Path

    from training.data import Dataset as TrainingData
    from training.params import train_config
    from training.steps import train_and_export

    out = Path(model.path)
    out.mkdir(parents=True, exist_ok=True)
    config = train_config(dict(epochs=epochs, embedding_dim=embedding_dim, width=width, batch_size=batch_size,
                               lr=lr, seed=seed, negatives=negatives, printed=printed, oe_weight=oe_weight,
                               oe_loss=oe_loss, oe_margin=oe_margin, quantize=quantize, precision=precision))
    info = train_and_export(TrainingData.load(Path(dataset.path)), config, out, k)
    quantize = info["config"]["quantize"]  # auto resolved by the data's preprocessing profile
    # The last epoch's k-NN accuracy is the float network's; the evaluate task measures the exported (int8) one.
    accuracy_key = "knn_accuracy" if quantize == "none" else "float_knn_accuracy"
    model.metadata.update({"framework": info["model_format"], "quantize": quantize, "precision": precision,
                           "train_seconds": info["train_seconds"], accuracy_key: info["history"][-1]["knn_accuracy"]})


@component
def build_index(dataset: Input[Dataset], model: Input[Model], index_type: str, seed: int,
                artifacts: Output[Model]) -> None:
    """Embed the training split into a FAISS gallery beside a copy of the model."""
    import shutil
    from pathlib import Path

    from training.data import Dataset as TrainingData
    from training.steps import build_gallery

    shutil.copytree(model.path, artifacts.path, dirs_exist_ok=True)
    info = build_gallery(TrainingData.load(Path(dataset.path)), Path(artifacts.path), index_type, seed)
    artifacts.metadata.update({"index_type": index_type, "gallery_size": info["size"], "dim": info["dim"]})


@component
def evaluate(dataset: Input[Dataset], artifacts: Input[Model], k: int, open_set_score: str, kth: int,
             evaluated: Output[Model],
             metrics: Output[Metrics], confusion: Output[ClassificationMetrics],
             report: Output[Markdown]) -> float:
    """Evaluate with the serving searcher, calibrate the threshold, write metadata.json and a report.

    Returns the held-out accuracy (output `Output`: kfp.local resolves only that name in conditions).
    """
    import json
    import shutil
    from pathlib import Path

    from pipeline.report import render_report
    from training.data import Dataset as TrainingData
    from training.steps import METRICS_FILE, TRAIN_FILE, evaluate_and_finalize

    out = Path(evaluated.path)
    shutil.copytree(artifacts.path, out, dirs_exist_ok=True)
    data = TrainingData.load(Path(dataset.path))
    metadata = evaluate_and_finalize(data, out, k, score=open_set_score, kth=kth)
    result = json.loads((out / METRICS_FILE).read_text())
    history = json.loads((out / TRAIN_FILE).read_text())["history"]
    accuracy = metadata.metrics.accuracy
    metrics.log_metric("accuracy", accuracy)
    metrics.log_metric("threshold", metadata.threshold)
    metrics.log_metric("open_set_rejection", metadata.metrics.open_set_rejection)
    confusion.log_confusion_matrix(list(data.classes), result["confusion_matrix"])
    Path(report.path).write_text(render_report(metadata, result, history))
    evaluated.metadata.update({"accuracy": accuracy, "threshold": metadata.threshold})
    return accuracy


@component
def check_quality(evaluated: Input[Model], min_accuracy: float, min_open_set_rejection: float,
                  min_digits_accepted: float, report: Output[Markdown]) -> str:
    """The quality gate (pipeline.quality): "pass" when every figure evaluate measured reaches its minimum,
    else "fail"; the figures against their minimums are printed and are the task's report."""
    from pathlib import Path

    from handler.artifacts import read_metadata
    from pipeline.quality import judge

    verdict = judge(read_metadata(Path(evaluated.path)), {"min_accuracy": min_accuracy,
                                                          "min_open_set_rejection": min_open_set_rejection,
                                                          "min_digits_accepted": min_digits_accepted})
    Path(report.path).write_text(verdict.markdown())
    print(f"quality gate {'passed' if verdict.passed else 'not passed'}: {verdict.summary}")
    return "pass" if verdict.passed else "fail"


@component
def archive(artifacts: Input[Model], model_name: str, model_version: str, mar: Output[Model]) -> None:
    """Pack the verified artifacts into `<model_name>.mar`; the output directory is a model store."""
    from pathlib import Path

    from handler.artifacts import read_metadata, sha256_file
    from serving.archive import build_mar

    path = build_mar(Path(artifacts.path), Path(mar.path), model_name, model_version)
    metrics = read_metadata(Path(artifacts.path)).metrics
    mar.metadata.update({"model_name": model_name, "version": model_version, "mar_name": path.name,
                         "sha256": sha256_file(path), "size_bytes": path.stat().st_size,
                         "accuracy": metrics.accuracy, "open_set_rejection": metrics.open_set_rejection})


@component
def deploy_local(mar: Input[Model], model_name: str, workdir: str, config: str, timeout_s: float = 180.0,
                 runtime: str = "torchserve") -> str:
    """(Re)start the local server (`runtime`: torchserve or python) of `workdir` with the new archive; returns the
    inference URL.

    For `python -m pipeline run-local` only: in a cluster task it would serve from inside the task's pod,
    which ends with the task, so there it refuses.
    """
    import os
    from pathlib import Path

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise RuntimeError("deploy_target=local serves from this task's pod, which ends with the task: use "
                           "deploy_target=kserve on a cluster (local is for python -m pipeline run-local)")

    from pipeline.local_serving import serve_archive

    instance = serve_archive(Path(mar.path), model_name, workdir, config, timeout_s, runtime)
    url = f"{instance.endpoints.inference}/predictions/{model_name}"
    print(f"{'TorchServe' if runtime == 'torchserve' else 'python runtime'} READY: {url} "
          f"(tokens in {instance.key_file})")
    return url


@component
def compare_with_deployed(evaluated: Input[Model], model_name: str, namespace: str, service_name: str,
                          allow_unknown_current: bool, report: Output[Markdown]) -> str:
    """The no-regression gate against the live InferenceService: returns "deploy" or "skip"."""
    from pathlib import Path

    from handler.artifacts import read_metadata
    from pipeline.gate import decide
    from pipeline.gate import report as gate_report
    from pipeline.kserve_deploy.api import resolve_namespace
    from settings import service_name_for

    metrics = read_metadata(Path(evaluated.path)).metrics
    name = service_name or service_name_for(model_name)
    decision = decide(metrics.accuracy, resolve_namespace(namespace), name, allow_unknown_current)
    Path(report.path).write_text(gate_report(decision, metrics.accuracy, metrics.open_set_rejection))
    print(decision.reason)
    return "deploy" if decision.deploy else "skip"


@component
def deploy_kserve(mar: Input[Model], model_name: str, model_version: str, storage_uri: str, model_uri: str,
                  namespace: str, service_name: str, protocol: str, runtime: str, service_account: str,
                  api_key_secret: str, run_id: str, dry_run: bool, manifest: Output[Artifact],
                  image_pull_secret: str = "", serving_runtime: str = "torchserve", min_replicas: int = 1,
                  max_replicas: int = 4, scale_target: int = 16, watch_timeout_s: float = 600.0,
                  canary_percent: int = 10, canary_window_s: float = 300.0, prometheus_url: str = "") -> str:
    """Publish the KServe model store and create or patch the InferenceService; returns its URL.

    The predictor runs ClusterServingRuntime `runtime`, else the project's one for `serving_runtime`.

    What was deployed (accuracy, open-set rejection, version, .mar SHA-256, run id) is recorded in the
    ConfigMap `<service>-deployed-model` once the new revision serves: the next run's gate reads it. A new model
    version on a serverless service first takes `canary_percent`% of the traffic for `canary_window_s`, judged on
    the Prometheus at `prometheus_url` ('' = on readiness), and is promoted or taken back. Storage
    credentials come from the mounted storage Secret's files (pipeline.params.storage_environment). The run id is
    the pod's run-id label where the pipeline sets it as $KFP_RUN_ID, else `run_id` (pipeline.kfp_backend.run_id).
    """
    import json
    import os
    from pathlib import Path

    from handler.artifacts import sha256_file
    from pipeline.kfp_backend import run_id as resolved_run_id
    from pipeline.gate import annotations_for
    from pipeline.kserve_deploy import Canary, KServeTarget, Scaling, cluster_runtime, deploy
    from pipeline.params import storage_environment

    recorded_run = resolved_run_id(run_id, os.environ)  # before anything is published
    os.environ.update(storage_environment())
    path = Path(mar.path) / f"{model_name}.mar"
    notes = annotations_for(float(mar.metadata["accuracy"]), float(mar.metadata["open_set_rejection"]),
                            model_version, sha256_file(path), recorded_run)
    target = KServeTarget(storage_uri=storage_uri, model_uri=model_uri, namespace=namespace,
                          service_name=service_name, protocol=protocol,
                          runtime=cluster_runtime(serving_runtime, runtime),
                          service_account=service_account, api_key_secret=api_key_secret,
                          image_pull_secrets=[image_pull_secret] if image_pull_secret else [], annotations=notes,
                          # int(): KFP passes numbers as protobuf doubles (1.0) to the executor.
                          scaling=Scaling(int(min_replicas), int(max_replicas), int(scale_target)),
                          canary=Canary(int(canary_percent), float(canary_window_s), prometheus_url),
                          timeout_s=float(watch_timeout_s),
                          lock_holder=f"pipeline run {recorded_run}")
    result = deploy(path, model_name, model_version, target, dry_run)
    print(f"rollout: {result.rollout}")
    Path(manifest.path).write_text(json.dumps(result.manifest, indent=2))
    manifest.metadata.update({"storage": result.location, "applied": not dry_run, "url": result.url})
    print(json.dumps(result.manifest, indent=2))
    return result.url
