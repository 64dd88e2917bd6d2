"""The no-regression gate and the deploy annotations, with the real `kubernetes` client talking to a
Kubernetes API stand-in on loopback (tests/support/k8s_standin.py; no cluster runs here): first deploy, a better
model deploys and is annotated, a worse one is skipped, 403 / unreachable / unannotated fail on one line
unless allow_unknown_current."""

from __future__ import annotations

import pytest
from support.k8s_standin import KubernetesStandin, write_kubeconfig

from pipeline.gate import ANNOTATIONS, GateError, annotations_for, decide, report
from pipeline.kserve import KServeTarget, deploy
from serving.server import free_ports


@pytest.fixture()
def cluster(tmp_path, monkeypatch):
    standin = KubernetesStandin(token="runner-token")
    with standin as url:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url, "runner-token")))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield standin


@pytest.fixture()
def pvc(tmp_path, monkeypatch):
    mount = tmp_path / "pvc"
    mount.mkdir()
    monkeypatch.setenv("PVC_MOUNT_PATH", str(mount))
    return mount


def deploy_version(model_store, version: str, accuracy: float) -> dict:
    notes = annotations_for(accuracy, 0.9, version, "ab" * 32, f"run-{version}")
    target = KServeTarget(storage_uri="pvc://models/embedding", namespace="models", annotations=notes, poll_s=0.01,
                          timeout_s=5)
    return deploy(model_store / "embedding.mar", "embedding", version, target).manifest


def test_first_deploy_passes_and_writes_the_annotations(cluster, model_store, pvc):
    decision = decide(0.93, "models", "embedding", allow_unknown_current=False)
    assert decision.deploy and decision.reason == "first deploy: no InferenceService models/embedding yet"
    deploy_version(model_store, "1.0", 0.93)
    methods = [(r["method"], r["path"].split("?")[0]) for r in cluster.requests]
    base = "/apis/serving.kserve.io/v1beta1/namespaces/models/inferenceservices"
    assert methods[:3] == [("GET", f"{base}/embedding"), ("GET", f"{base}/embedding"), ("POST", base)]
    assert all(r["headers"]["authorization"] == "Bearer runner-token" for r in cluster.requests)
    notes = cluster.objects[("models", "embedding")]["metadata"]["annotations"]
    assert notes == {ANNOTATIONS["accuracy"]: "0.930000", ANNOTATIONS["open_set_rejection"]: "0.900000",
                     ANNOTATIONS["model_version"]: "1.0", ANNOTATIONS["mar_sha256"]: "ab" * 32,
                     ANNOTATIONS["run_id"]: "run-1.0"}


def test_better_model_deploys_and_its_annotations_replace_the_old(cluster, model_store, pvc):
    deploy_version(model_store, "1.0", 0.90)
    decision = decide(0.95, "models", "embedding", allow_unknown_current=False)
    assert decision.deploy and decision.reason == "new accuracy 0.9500 >= deployed 0.9000 (version 1.0)"
    deploy_version(model_store, "2.0", 0.95)
    assert [r["method"] for r in cluster.requests].count("PATCH") == 1
    obj = cluster.objects[("models", "embedding")]
    assert obj["metadata"]["annotations"][ANNOTATIONS["accuracy"]] == "0.950000"
    assert obj["metadata"]["annotations"][ANNOTATIONS["model_version"]] == "2.0"
    assert obj["spec"]["predictor"]["model"]["storageUri"] == "pvc://models/embedding/2.0"
    assert "| accuracy | 0.9500 | 0.9000 |" in report(decision, 0.95, 0.9)


def test_equal_model_deploys_worse_model_is_skipped(cluster, model_store, pvc):
    deploy_version(model_store, "1.0", 0.95)
    assert decide(0.95, "models", "embedding", allow_unknown_current=False).deploy
    worse = decide(0.9, "models", "embedding", allow_unknown_current=False)
    assert not worse.deploy
    assert worse.reason == "new accuracy 0.9000 < deployed 0.9500 (version 1.0): not deploying"
    assert report(worse, 0.9, 0.8).startswith("## No-regression gate: skip\n")


def test_forbidden_fails_on_one_line_unless_allowed(cluster):
    cluster.forbidden = True
    with pytest.raises(GateError) as refused:
        decide(0.95, "models", "embedding", allow_unknown_current=False)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("cannot read InferenceService models/embedding: 403 Forbidden (the run's service "
                              "account needs get on inferenceservices.serving.kserve.io")
    assert message.endswith("; set allow_unknown_current=true to deploy anyway")
    allowed = decide(0.95, "models", "embedding", allow_unknown_current=True)
    assert allowed.deploy and "deploying because allow_unknown_current=true" in allowed.reason


def test_unreachable_api_fails_on_one_line_unless_allowed(tmp_path, monkeypatch):
    (port,) = free_ports(1)  # nothing listens there
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}", "t")))
    with pytest.raises(GateError, match=r"^cannot reach the Kubernetes API to read InferenceService models/embedding: "
                                        r"\w+; set allow_unknown_current=true to deploy anyway$"):
        decide(0.95, "models", "embedding", allow_unknown_current=False)
    assert decide(0.95, "models", "embedding", allow_unknown_current=True).deploy


def test_no_credentials_at_all_is_unknown_too(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(GateError, match="no Kubernetes credentials"):
        decide(0.95, "models", "embedding", allow_unknown_current=False)


def test_a_service_without_the_annotation_is_unknown(cluster):
    cluster.objects[("models", "embedding")] = {"metadata": {"name": "embedding", "namespace": "models"}, "spec": {}}
    with pytest.raises(GateError, match="carries no mnist-embedding/accuracy annotation"):
        decide(0.95, "models", "embedding", allow_unknown_current=False)
    assert decide(0.95, "models", "embedding", allow_unknown_current=True).deploy


def test_the_shipped_role_allows_exactly_what_the_gate_and_deploy_call(cluster, model_store, pvc):
    import yaml

    from settings import REPO

    deploy_version(model_store, "1.0", 0.90)
    decide(0.95, "models", "embedding", allow_unknown_current=False)
    deploy_version(model_store, "2.0", 0.95)
    verbs = {"GET": "get", "POST": "create", "PATCH": "patch"}
    used = {verbs[r["method"]] for r in cluster.requests}
    role = next(d for d in yaml.safe_load_all((REPO / "deploy/kubeflow/rbac.yaml").read_text()) if d["kind"] == "Role")
    (rule,) = role["rules"]
    assert rule["apiGroups"] == ["serving.kserve.io"] and rule["resources"] == ["inferenceservices"]
    assert used == {"get", "create", "patch"} and used <= set(rule["verbs"])
