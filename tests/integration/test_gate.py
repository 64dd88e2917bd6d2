"""The no-regression gate and the deploy record, with the real `kubernetes` client talking to a Kubernetes API
stand-in on loopback that lags and fails like a cluster running KServe (tests/support/k8s_standin.py; no cluster
runs here): the record is written only once the new revision serves, a failed or late rollout leaves it (and
the spec) as they were, a record the serving spec contradicts is unknown, and 403 / unreachable / no record
fail on one line unless allow_unknown_current. Last, the quality gate's defaults against the shipped model."""

from __future__ import annotations

import pytest
import yaml
from support.rollout import archive, cluster, deploy_version, entry, pvc, record  # noqa: F401 (fixtures)

from pipeline.gate import ANNOTATIONS, GateError, decide, report
from pipeline.kserve_deploy import KServeError
from serving.server import free_ports
from settings import REPO

BASE = "/apis/serving.kserve.io/v1beta1/namespaces/models/inferenceservices"
RECORD = "/api/v1/namespaces/models/configmaps"


def calls(cluster) -> list[tuple[str, str]]:
    return [(r["method"], r["path"].split("?")[0]) for r in cluster.requests]


def test_first_deploy_passes_and_records_once_the_revision_serves(cluster, archive, pvc):
    decision = decide(0.93, "models", "embedding", allow_unknown_current=False)
    assert decision.deploy and decision.reason == "first deploy: no InferenceService models/embedding yet"
    cluster.ready_delay_s = 0.3
    deploy_version(archive, "1.0", 0.93)
    made = calls(cluster)
    lock = [("GET", f"{RECORD}/embedding-deployed-model"), ("POST", RECORD)]  # the deploy lock, in the record
    assert made[:7] == [("GET", f"{BASE}/embedding"),
                        ("GET", "/api/v1/namespaces/models/persistentvolumeclaims/models"), *lock,
                        ("GET", f"{BASE}/embedding"),  # canary or all at once
                        ("GET", f"{BASE}/embedding"), ("POST", BASE)]
    record_write = ("PUT", f"{RECORD}/embedding-deployed-model")
    assert made[-4:] == [("GET", f"{RECORD}/embedding-deployed-model"), record_write,  # the record, then the lock's
                         ("GET", f"{RECORD}/embedding-deployed-model"), record_write]  # release
    assert all(r["headers"]["authorization"] == "Bearer runner-token" for r in cluster.requests)
    assert record(cluster) == {"current": entry("1.0", 0.93), "history": [entry("1.0", 0.93)]}
    served = cluster.isvc("models", "embedding")
    assert not any(k.startswith("mnist-embedding/") for k in served["metadata"].get("annotations") or {})
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/1.0"


def test_the_record_is_not_written_before_the_new_revision_serves(cluster, archive, pvc):
    """KServe's status lags the patch: the deploy must not return (nor record) on the old revision's Ready."""
    deploy_version(archive, "1.0", 0.90)
    cluster.reconcile_delay_s, cluster.ready_delay_s = 0.3, 0.3
    deploy_version(archive, "2.0", 0.95)
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/2.0"
    assert record(cluster)["current"] == entry("2.0", 0.95)


def test_better_model_deploys_and_the_previous_entry_is_kept(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.90)
    decision = decide(0.95, "models", "embedding", allow_unknown_current=False)
    assert decision.deploy and decision.reason == "new accuracy 0.9500 >= deployed 0.9000 (version 1.0)"
    deploy_version(archive, "2.0", 0.95)
    assert [r["method"] for r in cluster.requests if "inferenceservices" in r["path"]].count("PATCH") == 1
    patch = next(r for r in cluster.requests if r["method"] == "PATCH")
    assert patch["headers"]["content-type"] == "application/merge-patch+json"
    assert patch["body"]["metadata"]["resourceVersion"]  # a conditional write: 409 if the object moved on
    obj = cluster.isvc("models", "embedding")
    assert obj["spec"]["predictor"]["model"]["storageUri"] == "pvc://models/embedding/2.0"
    assert obj["metadata"]["generation"] == 2
    assert record(cluster) == {"current": entry("2.0", 0.95), "previous": entry("1.0", 0.90),
                               "history": [entry("1.0", 0.90), entry("2.0", 0.95)]}
    assert "| accuracy | 0.9500 | 0.9000 |" in report(decision, 0.95, 0.9)


def test_a_failed_revision_leaves_the_spec_and_the_record_as_they_were(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.90)
    cluster.fail_revisions = "Container failed with: ModuleNotFoundError"
    with pytest.raises(KServeError) as failed:
        deploy_version(archive, "2.0", 0.99)
    message = str(failed.value)
    assert "\n" not in message
    assert message == ('InferenceService models/embedding: rollout failed: Revision "embedding-predictor-00002" '
                       "failed with message: Container failed with: ModuleNotFoundError.; spec put back on "
                       "pvc://models/embedding/1.0")
    cluster.fail_revisions = ""
    obj = cluster.isvc("models", "embedding")
    assert obj["spec"]["predictor"]["model"]["storageUri"] == "pvc://models/embedding/1.0"
    assert obj["metadata"]["labels"]["app.kubernetes.io/version"] == "1.0"
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/1.0"
    assert record(cluster)["current"] == entry("1.0", 0.90)
    worse = decide(0.95, "models", "embedding", allow_unknown_current=False)
    assert worse.deploy and worse.reason == "new accuracy 0.9500 >= deployed 0.9000 (version 1.0)"
    deploy_version(archive, "2.0", 0.99)  # the rerun rolls out again and serves
    assert record(cluster)["current"] == entry("2.0", 0.99)


def test_a_rollout_past_the_deadline_leaves_the_record(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.90)
    cluster.ready_delay_s = 30
    with pytest.raises(KServeError, match=r"^InferenceService models/embedding not Ready after 0s: revision "
                                          r"embedding-predictor-00002 is not ready yet \(traffic on "
                                          r"embedding-predictor-00001\); spec put back on pvc://models/embedding/1.0$"):
        deploy_version(archive, "2.0", 0.99, timeout_s=0.2)
    assert record(cluster)["current"] == entry("1.0", 0.90)
    assert cluster.isvc("models", "embedding")["spec"]["predictor"]["model"]["storageUri"].endswith("/1.0")


def test_equal_model_deploys_worse_model_is_skipped(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.95)
    assert decide(0.95, "models", "embedding", allow_unknown_current=False).deploy
    worse = decide(0.9, "models", "embedding", allow_unknown_current=False)
    assert not worse.deploy
    assert worse.reason == "new accuracy 0.9000 < deployed 0.9500 (version 1.0): not deploying"
    assert report(worse, 0.9, 0.8).startswith("## No-regression gate: skip\n")


def test_a_record_the_serving_spec_contradicts_is_unknown(cluster, archive, pvc):
    """Someone pointed the service elsewhere by hand: the record no longer describes what serves."""
    deploy_version(archive, "1.0", 0.95)
    obj = cluster.objects[("inferenceservices", "models", "embedding")]
    obj["spec"]["predictor"]["model"]["storageUri"] = "s3://elsewhere/model"
    cluster._new_revision(("models", "embedding"), obj)
    with pytest.raises(GateError, match=r"^InferenceService models/embedding serves s3://elsewhere/model but its "
                                        r"deploy record ConfigMap models/embedding-deployed-model names "
                                        r"pvc://models/embedding/1.0 \(changed outside the pipeline\?\); set "
                                        r"allow_unknown_current=true to deploy anyway$"):
        decide(0.99, "models", "embedding", allow_unknown_current=False)
    assert decide(0.99, "models", "embedding", allow_unknown_current=True).deploy


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


def test_a_role_without_configmaps_cannot_read_the_record(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.95)
    cluster.role = {**cluster.role, "rules": [r for r in cluster.role["rules"] if "configmaps" not in r["resources"]]}
    with pytest.raises(GateError, match=r"^cannot read its deploy record ConfigMap models/embedding-deployed-model: "
                                        r"403 Forbidden \(the run's service account needs get on configmaps"):
        decide(0.95, "models", "embedding", allow_unknown_current=False)


def test_unreachable_api_fails_on_one_line_unless_allowed(tmp_path, monkeypatch):
    from support.k8s_standin import write_kubeconfig

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


def test_a_service_without_a_record_is_unknown(cluster):
    cluster.objects[("inferenceservices", "models", "embedding")] = {
        "metadata": {"name": "embedding", "namespace": "models", "resourceVersion": "1", "generation": 1,
                     "annotations": {ANNOTATIONS["accuracy"]: "0.99"}}, "spec": {}}
    with pytest.raises(GateError, match="has no deploy record with mnist-embedding/accuracy"):
        decide(0.95, "models", "embedding", allow_unknown_current=False)
    assert decide(0.95, "models", "embedding", allow_unknown_current=True).deploy


def test_the_shipped_role_allows_exactly_what_the_gate_and_deploy_call(cluster, archive, pvc):
    """The stand-in enforces the Role of deploy/kubeflow/rbac.yaml; this checks it grants nothing unused."""
    deploy_version(archive, "1.0", 0.90)
    decide(0.95, "models", "embedding", allow_unknown_current=False)
    deploy_version(archive, "2.0", 0.95)
    verbs = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update"}
    used: dict[str, set[str]] = {}
    for r in cluster.requests:
        used.setdefault(r["path"].split("?")[0].split("/")[-1 if r["method"] == "POST" else -2], set()).add(
            verbs[r["method"]])
    role = next(d for d in yaml.safe_load_all((REPO / "deploy/kubeflow/rbac.yaml").read_text()) if d["kind"] == "Role")
    granted = {resource: set(rule["verbs"]) for rule in role["rules"] for resource in rule["resources"]}
    assert used == {"inferenceservices": {"get", "create", "patch"}, "configmaps": {"get", "create", "update"},
                    "persistentvolumeclaims": {"get"}}
    assert all(used[resource] <= granted[resource] for resource in used)
    assert granted["configmaps"] == used["configmaps"] and granted["persistentvolumeclaims"] == {"get"}


def test_a_record_edited_into_nonsense_is_unknown_and_the_next_deploy_replaces_it(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.95)
    cluster.objects[("configmaps", "models", "embedding-deployed-model")]["data"] = {"current": "[1, 2"}
    with pytest.raises(GateError, match="has no deploy record with mnist-embedding/accuracy"):
        decide(0.99, "models", "embedding", allow_unknown_current=False)
    deploy_version(archive, "2.0", 0.99)
    assert record(cluster) == {"current": entry("2.0", 0.99), "history": [entry("2.0", 0.99)]}


# ---------------------------------------------------------------- the quality gate's defaults


def test_the_shipped_model_passes_the_default_quality_gate(product_artifacts):
    """The quick start's model (support/product_model.py) clears every default minimum of the quality gate; a
    2-epoch model does not (tests/unit/test_pipeline_quality.py)."""
    from handler.artifacts import read_metadata
    from pipeline import params as P
    from pipeline.quality import judge

    verdict = judge(read_metadata(product_artifacts), P.DEFAULTS)
    print(f"shipped model: {verdict.summary}")
    assert verdict.passed, verdict.summary
