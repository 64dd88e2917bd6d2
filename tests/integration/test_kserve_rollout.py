"""Deploying to KServe through the Kubernetes stand-in when the way there is rough: 409 and 5xx from the API
server, pvc:// claims that KServe cannot share with the deploy task, predictor options; and the stand-in's own
API-server semantics the rest relies on, checked through the real `kubernetes` client."""

from __future__ import annotations

import json
import time

import pytest
from support.rollout import archive, cluster, deploy_version, entry, pvc, record  # noqa: F401 (fixtures)

from pipeline import kserve_deploy
from pipeline.kserve_deploy import GROUP, LOCK_KEY, PLURAL, VERSION, KServeError, inference_service
from pipeline.releases import RAW_MODE_NAMES


def writes(cluster, resource: str) -> list[dict]:
    return [r for r in cluster.requests if r["method"] != "GET" and f"/{resource}" in r["path"]]


# ---------------------------------------------------------------- API faults


def test_5xx_on_the_patch_is_retried_with_backoff(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    cluster.fail_next("PATCH", "inferenceservices", 500, times=2)
    deploy_version(archive, "2.0", 0.9)
    assert [r["method"] for r in writes(cluster, "inferenceservices")] == ["POST", "PATCH", "PATCH", "PATCH"]
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/2.0"
    assert record(cluster)["current"] == entry("2.0", 0.9)


def test_5xx_that_persists_ends_on_one_line_and_changes_nothing(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    cluster.fail_next("PATCH", "inferenceservices", 503, times=kserve_deploy.API_ATTEMPTS)
    with pytest.raises(KServeError, match=r"^InferenceService models/embedding: 503 Service Unavailable: Internal "
                                          r"error occurred: injected$"):
        deploy_version(archive, "2.0", 0.9)
    assert len(writes(cluster, "inferenceservices")) == 1 + kserve_deploy.API_ATTEMPTS
    assert cluster.isvc("models", "embedding")["spec"]["predictor"]["model"]["storageUri"].endswith("/1.0")
    assert record(cluster)["current"] == entry("1.0", 0.9)


def test_a_stored_write_whose_answer_is_lost_still_rolls_back_a_failed_revision(cluster, archive, pvc):
    """The PATCH is applied but answers 504; the retry meets 409, re-reads the new spec and changes nothing.
    The rollout must still count as a change: wait for the new revision, and put the spec back when it fails."""
    deploy_version(archive, "1.0", 0.9)
    cluster.lose_answer_next("PATCH", "inferenceservices")
    cluster.fail_revisions = "crash"
    with pytest.raises(KServeError, match=r"spec put back on pvc://models/embedding/1\.0$"):
        deploy_version(archive, "2.0", 0.95)
    assert cluster.isvc("models", "embedding")["spec"]["predictor"]["model"]["storageUri"].endswith("/1.0")
    assert record(cluster)["current"] == entry("1.0", 0.9)


def test_a_client_error_is_not_retried(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    cluster.fail_next("PATCH", "inferenceservices", 422)
    with pytest.raises(KServeError, match=r"^InferenceService models/embedding: 422 Unprocessable Entity"):
        deploy_version(archive, "2.0", 0.9)
    assert len(writes(cluster, "inferenceservices")) == 2


def test_409_on_the_patch_rereads_and_reapplies(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    cluster.interfere_next("PATCH", "inferenceservices")
    cluster.interfere_next("PUT", "configmaps", after=1)  # the record's write; the lock's comes first
    deploy_version(archive, "2.0", 0.95)
    patches = writes(cluster, "inferenceservices")[1:]
    # 1.0: the lock (creating the record's ConfigMap), the record, the lock's release; 2.0: the lock, the record
    # (refused once and redone), the release.
    assert len(patches) == 2 and [r["method"] for r in writes(cluster, "configmaps")] == ["POST"] + ["PUT"] * 6
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/2.0"
    assert record(cluster)["current"] == entry("2.0", 0.95) and record(cluster)["previous"] == entry("1.0", 0.9)


def test_a_record_that_cannot_be_written_says_what_serves(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    cluster.fail_next("PUT", "configmaps", 500, times=kserve_deploy.API_ATTEMPTS, after=1)  # after the lock
    with pytest.raises(KServeError, match=r"^version 2\.0 \(pvc://models/embedding/2\.0\) serves, but its record "
                                          r"ConfigMap models/embedding-deployed-model could not be written: 500 "):
        deploy_version(archive, "2.0", 0.95)


@pytest.mark.parametrize("mode", sorted(RAW_MODE_NAMES))
def test_raw_deployment_mode_waits_for_the_deployment_rollout(cluster, archive, pvc, mode):
    """Raw mode's Ready is the Deployment's Available, which the old pod keeps True: only the Deployment's
    rollout tells when the new version serves. KServe 0.16 names the mode Standard."""
    cluster.mode = mode
    deploy_version(archive, "1.0", 0.9)
    cluster.reconcile_delay_s, cluster.ready_delay_s = 0.2, 0.4
    deploy_version(archive, "2.0", 0.95)
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/2.0"
    assert record(cluster)["current"] == entry("2.0", 0.95)
    assert any(r["path"].startswith("/apis/apps/v1/namespaces/models/deployments/embedding-predictor")
               for r in cluster.requests)


def test_raw_deployment_mode_failure_is_the_deployments_progress_deadline(cluster, archive, pvc):
    cluster.mode = "RawDeployment"
    deploy_version(archive, "1.0", 0.9)
    cluster.fail_revisions = "crash"
    with pytest.raises(KServeError, match=r"^InferenceService models/embedding: rollout failed: Deployment "
                                          r"models/embedding-predictor exceeded its progress deadline: ReplicaSet "
                                          r'"embedding-predictor-2" has timed out progressing\.; spec put back on '
                                          r"pvc://models/embedding/1\.0$"):
        deploy_version(archive, "2.0", 0.95)
    assert record(cluster)["current"] == entry("1.0", 0.9)


# ---------------------------------------------------------------- pvc://


def test_a_claim_that_is_not_read_write_many_is_refused_before_anything_is_written(cluster, archive, pvc):
    cluster.add_pvc("models", "models", ["ReadWriteOnce"])
    with pytest.raises(KServeError, match=r"^pvc://models/embedding/1\.0: claim models/models is ReadWriteOnce; it "
                                          r"must be ReadWriteMany \(the deploy task writes while serving pods read\)$"):
        deploy_version(archive, "1.0", 0.9)
    assert not any(pvc.iterdir())
    assert not writes(cluster, "inferenceservices")


def test_a_missing_claim_is_refused(cluster, archive, pvc):
    with pytest.raises(KServeError, match=r"^pvc://other/embedding/1\.0: no PersistentVolumeClaim other in namespace "
                                          r"models, where KServe mounts it$"):
        deploy_version(archive, "1.0", 0.9, storage_uri="pvc://other/embedding")


def test_a_claim_in_another_namespace_than_the_task_is_refused(cluster, archive, pvc, tmp_path, monkeypatch):
    (tmp_path / "namespace").write_text("kubeflow\n")
    monkeypatch.setattr(kserve_deploy.api, "NAMESPACE_FILE", tmp_path / "namespace")
    with pytest.raises(KServeError, match=r"^pvc://models/embedding/1\.0: KServe mounts claim models from namespace "
                                          r"models but this task runs in kubeflow, where its claim is mounted"):
        deploy_version(archive, "1.0", 0.9)
    assert not any(pvc.iterdir()) and len(cluster.requests) == 0
    (tmp_path / "namespace").write_text("models\n")
    deploy_version(archive, "1.0", 0.9)  # the same namespace: it can be shared


def test_reading_the_claim_needs_the_role(cluster, archive, pvc):
    cluster.role = {**cluster.role, "rules": [r for r in cluster.role["rules"]
                                              if "persistentvolumeclaims" not in r["resources"]]}
    with pytest.raises(KServeError, match=r"^cannot read PersistentVolumeClaim models/models: 403 Forbidden: .* "
                                          r"\(needs get on persistentvolumeclaims: deploy/kubeflow/rbac.yaml\)$"):
        deploy_version(archive, "1.0", 0.9)


# ---------------------------------------------------------------- predictor options


def test_each_predictor_declares_its_one_port_and_is_ready_when_the_model_is():
    """Knative allows one container port: REST declares 8080 (http1), grpc-v2 the gateway's gRPC port (h2c).
    Readiness is /v2/health/ready on the REST port for both; grpc-v2's liveness is a TCP connect, since Knative
    points liveness probes at the serving port (tests/unit/test_kserve_compose.py checks the composed pods)."""
    from settings import KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT

    grpc = inference_service("embedding", "models", "s3://b/e/1.0", "grpc-v2", "embedding", "1.0")["spec"][
        "predictor"]["model"]
    rest = inference_service("embedding", "models", "s3://b/e/1.0", "v2", "embedding", "1.0")["spec"][
        "predictor"]["model"]
    assert grpc["protocolVersion"] == "grpc-v2"
    assert grpc["ports"] == [{"name": "h2c", "containerPort": KSERVE_GRPC_PORT, "protocol": "TCP"}]
    assert rest["ports"] == [{"name": "http1", "containerPort": KSERVE_GATEWAY_PORT, "protocol": "TCP"}]
    assert grpc["readinessProbe"] == rest["readinessProbe"]
    assert rest["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": KSERVE_GATEWAY_PORT}
    assert grpc["livenessProbe"]["tcpSocket"] == {"port": KSERVE_GRPC_PORT}
    assert rest["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": KSERVE_GATEWAY_PORT}


@pytest.mark.parametrize("mode", ["Serverless", "RawDeployment"])
def test_a_grpc_v2_deploy_composes_with_the_shipped_runtime_and_serves(cluster, archive, pvc, mode):
    """The stand-in merges the spec with deploy/kserve/servingruntime.yaml as KServe does and makes no revision
    of a pod Knative or the API server would refuse: a grpc-v2 deploy must come to serve."""
    cluster.mode = mode
    deploy_version(archive, "1.0", 0.9, protocol="grpc-v2")
    assert cluster.refused == []
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/1.0"


@pytest.mark.parametrize("protocol", ["v1", "grpc-v2"])
def test_switching_the_serving_runtime_rolls_a_revision_composed_from_the_other_runtime(cluster, archive, pvc,
                                                                                       protocol):
    """serving_runtime=python names mnist-embedding-python: the spec changes, so KServe makes a revision, which the
    stand-in composes from deploy/kserve/servingruntime-python.yaml and checks as Knative would; back to torchserve
    is one more revision. A runtime the stand-in does not hold would make one too, unchecked, so the name matters."""
    from pipeline.kserve_deploy import cluster_runtime

    deploy_version(archive, "1.0", 0.9, protocol=protocol)
    deploy_version(archive, "2.0", 0.9, protocol=protocol, runtime=cluster_runtime("python"))
    deploy_version(archive, "3.0", 0.9, protocol=protocol, runtime=cluster_runtime("torchserve"))
    assert cluster.refused == []
    revisions = cluster.revisions[("models", "embedding")]
    runtimes = [r["template"][0]["predictor"]["model"]["runtime"] for r in revisions]
    assert runtimes == ["mnist-embedding-torchserve", "mnist-embedding-python", "mnist-embedding-torchserve"]
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/3.0"


def test_a_new_scale_target_rolls_a_revision_and_a_failed_one_is_put_back(cluster, archive, pvc):
    """The autoscaling target is an annotation KServe copies to the revision: changing it makes one, with the new
    target; when that revision fails, the annotation is put back with the spec. Annotations deploy does not own
    (the user's) are never touched."""
    from kubernetes.client import CustomObjectsApi

    from pipeline.kserve_deploy import Scaling

    target = "autoscaling.knative.dev/target"
    deploy_version(archive, "1.0", 0.9)
    api = CustomObjectsApi(kserve_deploy.api_client())
    api.patch_namespaced_custom_object(GROUP, VERSION, "models", PLURAL, "embedding",
                                       {"metadata": {"annotations": {"team.example.com/owner": "ml"}}})
    deploy_version(archive, "2.0", 0.9, scaling=Scaling(2, 6, 8))
    revisions = cluster.revisions[("models", "embedding")]
    assert [r["template"][2].get(target) for r in revisions][-1] == "8"
    predictor = cluster.isvc("models", "embedding")["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 6)
    cluster.fail_revisions = "crash"
    with pytest.raises(KServeError, match=r"spec put back on pvc://models/embedding/2\.0$"):
        deploy_version(archive, "3.0", 0.9, scaling=Scaling(1, 4, 4))
    notes = cluster.isvc("models", "embedding")["metadata"]["annotations"]
    assert notes[target] == "8" and notes["team.example.com/owner"] == "ml"
    predictor = cluster.isvc("models", "embedding")["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 6)


def test_a_service_written_with_other_probe_handlers_is_patched_to_one_handler_each(cluster, archive, pvc):
    """An InferenceService is updated by JSON merge patch, which merges objects key by key: a grpc-v2 service an
    older release wrote (tcpSocket readiness) must lose that handler when the new readiness is httpGet, or KServe's
    pod carries two and no revision is made."""
    from kubernetes.client import CustomObjectsApi

    older = inference_service("embedding", "models", "pvc://models/embedding/1.0", "grpc-v2", "embedding", "1.0")
    older["spec"]["predictor"]["model"]["readinessProbe"] = {"tcpSocket": {"port": 8081}, "periodSeconds": 5}
    api = CustomObjectsApi(kserve_deploy.api_client())
    api.create_namespaced_custom_object(GROUP, VERSION, "models", PLURAL, older)
    deploy_version(archive, "2.0", 0.95, protocol="grpc-v2")
    model = cluster.isvc("models", "embedding")["spec"]["predictor"]["model"]
    assert model["readinessProbe"] == kserve_deploy.predictor_endpoint("grpc-v2")["readinessProbe"]
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/2.0"


def test_image_pull_secrets_and_resources_reach_the_manifest():
    default = inference_service("embedding", "models", "s3://b/e/1.0", "v1", "embedding", "1.0")
    assert "imagePullSecrets" not in default["spec"]["predictor"]
    assert default["spec"]["predictor"]["model"]["resources"] == {"requests": {"cpu": "2", "memory": "1536Mi"},
                                                                  "limits": {"cpu": "2", "memory": "1536Mi"}}
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}}
    manifest = inference_service("embedding", "models", "s3://b/e/1.0", "v1", "embedding", "1.0",
                                 image_pull_secrets=["registry-a", "registry-b"], resources=resources)
    assert manifest["spec"]["predictor"]["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
    assert manifest["spec"]["predictor"]["model"]["resources"] == resources
    with pytest.raises(KServeError, match=r"^invalid InferenceService: .*limits\.memory"):
        inference_service("embedding", "models", "s3://b/e/1.0", "v1", "embedding", "1.0",
                          resources={"limits": {"memory": "3 GB"}})
    with pytest.raises(KServeError, match="imagePullSecrets entry needs a Secret name"):
        inference_service("embedding", "models", "s3://b/e/1.0", "v1", "embedding", "1.0", image_pull_secrets=[""])


def test_a_pull_secret_no_longer_asked_for_is_removed_by_the_next_deploy(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9, image_pull_secrets=["registry-a"])
    assert cluster.isvc("models", "embedding")["spec"]["predictor"]["imagePullSecrets"] == [{"name": "registry-a"}]
    deploy_version(archive, "2.0", 0.9)
    assert "imagePullSecrets" not in cluster.isvc("models", "embedding")["spec"]["predictor"]


# ---------------------------------------------------------------- the stand-in is an API server


def test_standin_generation_resource_version_and_patch_types(cluster):
    from kubernetes.client.exceptions import ApiException

    api = kserve_deploy.custom_objects_api()
    where = (GROUP, VERSION, "models", PLURAL)
    cluster.role = {**cluster.role, "rules": [{"apiGroups": [GROUP], "resources": [PLURAL],
                                               "verbs": ["get", "create", "patch", "update"]}]}  # PUT too, here
    manifest = inference_service("embedding", "models", "s3://b/e/1.0", "v1", "embedding", "1.0")
    created = api.create_namespaced_custom_object(*where, manifest)
    assert created["metadata"]["generation"] == 1
    notes = api.patch_namespaced_custom_object(*where, "embedding", {"metadata": {"annotations": {"a": "b"}}})
    assert notes["metadata"]["generation"] == 1  # metadata only
    assert notes["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    assert len(cluster.revisions[("models", "embedding")]) == 2  # but KServe copies annotations into the revision
    with pytest.raises(ApiException) as stale:
        api.patch_namespaced_custom_object(*where, "embedding", {"metadata": {"resourceVersion": "1"},
                                                                  "spec": {"predictor": {"minReplicas": 2}}})
    assert stale.value.status == 409
    current = api.get_namespaced_custom_object(*where, "embedding")
    current["spec"]["predictor"]["minReplicas"] = 2
    replaced = api.replace_namespaced_custom_object(*where, "embedding", current)
    assert replaced["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as stale_put:
        api.replace_namespaced_custom_object(*where, "embedding", current)
    assert stale_put.value.status == 409

    def patch_as(content_type: str, body) -> dict:
        """What kubectl patch --type json|strategic sends; the Python client's custom-object patch is merge only."""
        return api.api_client.call_api(
            f"/apis/{GROUP}/{VERSION}/namespaces/models/{PLURAL}/embedding", "PATCH", body=body,
            header_params={"Content-Type": content_type, "Accept": "application/json"}, response_type="object",
            auth_settings=["BearerToken"], _return_http_data_only=True)

    jsonpatched = patch_as("application/json-patch+json",
                           [{"op": "replace", "path": "/spec/predictor/minReplicas", "value": 3}])
    assert jsonpatched["metadata"]["generation"] == 3 and jsonpatched["spec"]["predictor"]["minReplicas"] == 3
    with pytest.raises(ApiException) as strategic:
        patch_as("application/strategic-merge-patch+json", {"spec": {}})
    assert strategic.value.status == 415
    ignored = api.patch_namespaced_custom_object(*where, "embedding", {"status": {"url": "http://forged"}})
    assert ignored["status"].get("url") != "http://forged"


# ---------------------------------------------------------------- one deploy at a time


def lock_of(cluster) -> dict | None:
    data = cluster.objects[("configmaps", "models", "embedding-deployed-model")]["data"]
    return json.loads(data[LOCK_KEY]) if LOCK_KEY in data else None


def test_a_deploy_is_refused_while_another_holds_the_lock_and_takes_over_a_lapsed_one(cluster, archive, pvc):
    """Two runs deploying one service at once would leave the record naming one and the pods serving the other:
    the second is refused before it publishes anything; a lock whose holder died lapses."""
    deploy_version(archive, "1.0", 0.9)
    assert lock_of(cluster) is None  # released
    data = cluster.objects[("configmaps", "models", "embedding-deployed-model")]["data"]
    data[LOCK_KEY] = json.dumps({"holder": "pipeline run run-7", "since": time.time(), "until": time.time() + 60})
    with pytest.raises(KServeError, match=r"^pipeline run run-7 is deploying InferenceService models/embedding since "
                                          r".* lapses \d+ s from now at the latest\)$"):
        deploy_version(archive, "2.0", 0.95)
    assert not (pvc / "embedding" / "2.0").exists()
    assert cluster.served_storage_uri("models", "embedding") == "pvc://models/embedding/1.0"
    data[LOCK_KEY] = json.dumps({"holder": "pipeline run run-7", "since": time.time() - 99, "until": time.time() - 1})
    deploy_version(archive, "2.0", 0.95, lock_holder="pipeline run run-8")
    assert lock_of(cluster) is None and record(cluster)["current"] == entry("2.0", 0.95)


def test_the_lock_is_held_during_the_rollout_and_released_when_it_fails(cluster, archive, pvc):
    deploy_version(archive, "1.0", 0.9)
    seen = []
    original = cluster._reconcile

    def watch() -> None:
        seen.append(lock_of(cluster))
        original()

    cluster._reconcile = watch
    cluster.fail_revisions = "crash"
    with pytest.raises(KServeError, match="spec put back"):
        deploy_version(archive, "2.0", 0.95, lock_holder="pipeline run run-9")
    assert any(lock and lock["holder"] == "pipeline run run-9" for lock in seen)
    assert lock_of(cluster) is None
