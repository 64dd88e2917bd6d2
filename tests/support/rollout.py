"""What the rollout tests share: the Kubernetes stand-in reached through a kubeconfig, as the pipeline reaches a
cluster, with a ReadWriteMany claim `models` mounted for pvc:// storage, and a deploy of one version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.k8s_standin import KubernetesStandin, write_kubeconfig

from pipeline import kserve_deploy
from pipeline.gate import annotations_for
from pipeline.kserve_deploy import Canary, KServeTarget, deploy

TOKEN = "runner-token"


@pytest.fixture()
def cluster(tmp_path, monkeypatch):
    standin = KubernetesStandin(token=TOKEN)
    standin.add_pvc("models", "models", ["ReadWriteMany"])
    with standin as url:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url, TOKEN)))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setattr(kserve_deploy.api, "NAMESPACE_FILE", tmp_path / "no-pod-namespace")
        monkeypatch.setattr(kserve_deploy.api, "API_BACKOFF_S", 0.01)
        yield standin


@pytest.fixture()
def pvc(tmp_path, monkeypatch) -> Path:
    mount = tmp_path / "pvc"
    mount.mkdir()
    monkeypatch.setenv("PVC_MOUNT_PATH", str(mount))
    return mount


@pytest.fixture()
def archive(tmp_path) -> Path:
    """A stand-in for embedding.mar: these tests move and point at archives, they never load one."""
    path = tmp_path / "embedding.mar"
    path.write_bytes(b"PK archive bytes " * 64)
    return path


def target(version: str, accuracy: float, **options) -> KServeTarget:
    """All at once unless `canary` is given (tests/integration/test_kserve_canary.py rolls out canaries)."""
    notes = annotations_for(accuracy, 0.9, version, "ab" * 32, f"run-{version}")
    return KServeTarget(**{"storage_uri": "pvc://models/embedding", "namespace": "models", "annotations": notes,
                           "poll_s": 0.01, "timeout_s": 5, "canary": Canary(0), **options})


def deploy_version(archive: Path, version: str, accuracy: float, **options) -> kserve_deploy.Deployment:
    return deploy(archive, "embedding", version, target(version, accuracy, **options))


def record(cluster: KubernetesStandin) -> dict:
    """The deploy record's data, parsed."""
    data = cluster.objects[("configmaps", "models", "embedding-deployed-model")]["data"]
    return {key: json.loads(value) for key, value in data.items()}


def entry(version: str, accuracy: float, **options) -> dict:
    """The record's entry for a deploy_version(archive, version, accuracy, **options) that served: the gate's fields,
    the storageUri and the InferenceService's predictor as that deploy writes it."""
    uri = f"pvc://models/embedding/{version}"
    manifest = kserve_deploy.target_manifest(target(version, accuracy, **options), "embedding", version, uri, "models")
    return {**annotations_for(accuracy, 0.9, version, "ab" * 32, f"run-{version}"),
            kserve_deploy.STORAGE_URI_KEY: uri,
            kserve_deploy.REVISION_KEY: kserve_deploy.revision_entry(manifest, kserve_deploy.OWNED_ANNOTATIONS)}
