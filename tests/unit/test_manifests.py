"""The manifests the project ships pass the official KServe / Kubernetes schemas (pipeline.manifests)."""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from settings import REPO as ROOT
from jsonschema import Draft4Validator

from pipeline.manifests import SCHEMA_DIR, ManifestError, _adapt, validate, validate_file

DEPLOY = ROOT / "deploy"
# deploy/prometheus holds Prometheus configs and rules (promtool checks them) and Prometheus Operator objects
# without stored schemas: tests/integration/test_prometheus.py checks those.
PROMETHEUS = DEPLOY / "prometheus"
DEPLOY_YAML = sorted(p for pattern in ("*.yaml", "*.yml") for p in DEPLOY.rglob(pattern)
                     if SCHEMA_DIR not in p.parents and PROMETHEUS not in p.parents)


@pytest.mark.parametrize("path", DEPLOY_YAML, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_shipped_manifest_validates(path):
    assert validate_file(path), f"{path} holds no document"


def test_shipped_manifests_exist():
    """The test above must have validated something."""
    assert DEPLOY_YAML, f"no *.yaml under {DEPLOY} (outside {SCHEMA_DIR.name}/)"


@pytest.mark.parametrize("path", sorted(SCHEMA_DIR.glob("*.json*")), ids=lambda p: p.name)
def test_stored_schemas_are_valid_draft4_and_small(path):
    data = path.read_bytes()
    assert len(data) < 2_000_000
    Draft4Validator.check_schema(_adapt(json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)))


META = {"name": "embedding", "namespace": "models"}
VALID = {
    "InferenceService": {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": META,
        "spec": {"predictor": {"minReplicas": 1, "model": {
            "modelFormat": {"name": "pytorch"}, "protocolVersion": "v2", "storageUri": "gs://bucket/embedding/1",
            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
            "resources": {"requests": {"cpu": 1, "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}}}},
    },
    "ServingRuntime": {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "ServingRuntime", "metadata": META,
        "spec": {"supportedModelFormats": [{"name": "pytorch", "version": "1", "autoSelect": True, "priority": 1}],
                 "protocolVersions": ["v1", "v2"],
                 "containers": [{"name": "kserve-container", "image": "example.org/torchserve:1",
                                 "ports": [{"containerPort": 8085, "protocol": "TCP"}],
                                 "resources": {"limits": {"cpu": "500m", "memory": 1073741824}}}]},
    },
    "ClusterServingRuntime": {
        "apiVersion": "serving.kserve.io/v1alpha1", "kind": "ClusterServingRuntime", "metadata": {"name": "ts"},
        "spec": {"containers": [{"name": "kserve-container", "image": "example.org/torchserve:1"}]},
    },
    "ServiceAccount": {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": META,
                       "secrets": [{"name": "storage"}], "automountServiceAccountToken": False},
    "Secret": {"apiVersion": "v1", "kind": "Secret", "metadata": {**META, "annotations": {"a": "b"}},
               "type": "Opaque", "data": {"key": "aGVsbG8="}, "stringData": {"other": "plain text"}},
    "Role": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": META,
             "rules": [{"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"],
                        "verbs": ["get", "create", "patch"]}]},
    "RoleBinding": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": META,
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
                    "subjects": [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "kubeflow"}]},
    "NetworkPolicy": {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": META,
                      "spec": {"podSelector": {"matchLabels": {"app": "embedding"}}, "policyTypes": ["Ingress"],
                               "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                                            "ports": [{"port": 8085, "protocol": "TCP"}, {"port": "http"}]}]}},
}


@pytest.mark.parametrize("kind", sorted(VALID))
def test_minimal_valid_object_passes(kind):
    validate(copy.deepcopy(VALID[kind]))


def _set(doc: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for key in parents:
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    if value is DELETE:
        del doc[last]
    elif isinstance(doc, list):
        doc[int(last)] = value
    else:
        doc[last] = value


DELETE = object()
# kind, field to change, new value (DELETE: remove it), text the error must contain
BROKEN = [
    # wrong types
    ("InferenceService", "spec.predictor.model.storageUri", 3,
     "InferenceService embedding: spec.predictor.model.storageUri: 3 is not of type 'string'"),
    ("InferenceService", "spec.predictor.minReplicas", "1", "spec.predictor.minReplicas: '1' is not of type"),
    ("InferenceService", "spec.predictor.model.env.0.value", 1, "spec.predictor.model.env[0].value: 1 is not of"),
    ("ServingRuntime", "spec.containers", {"name": "x"}, "ServingRuntime embedding: spec.containers: "),
    ("ClusterServingRuntime", "spec.containers.0.image", ["a"], "spec.containers[0].image: ['a'] is not of"),
    ("ServiceAccount", "automountServiceAccountToken", "false", "automountServiceAccountToken: 'false' is not of"),
    ("Secret", "stringData.other", 5, "stringData.other: 5 is not of type 'string'"),
    ("Role", "rules.0.verbs", "get", "rules[0].verbs: 'get' is not of type 'array'"),
    ("RoleBinding", "subjects", {"kind": "User", "name": "u"}, "RoleBinding embedding: subjects: "),
    ("NetworkPolicy", "spec.ingress.0.ports.0.port", 80.5, "spec.ingress[0].ports[0].port: 80.5 is not valid"),
    ("NetworkPolicy", "spec.ingress.0.ports.0.port", True, "spec.ingress[0].ports[0].port: True is not valid"),
    # values out of the schema's enum / pattern / range / format
    ("InferenceService", "spec.predictor.scaleMetric", "gpu", "spec.predictor.scaleMetric: 'gpu' is not one of"),
    ("InferenceService", "spec.predictor.model.resources.limits.memory", "2 GB",
     "spec.predictor.model.resources.limits.memory: '2 GB' does not match"),
    ("ServingRuntime", "spec.supportedModelFormats.0.priority", 0, "priority: 0 is less than the minimum of 1"),
    ("ServingRuntime", "spec.containers.0.ports.0.containerPort", 2**31, "containerPort: 2147483648 is not a 'int32'"),
    ("Secret", "data.key", "not base64!", "data.key: 'not base64!' is not a 'byte'"),
    # missing required fields
    ("InferenceService", "spec.predictor.model.modelFormat.name", DELETE,
     "spec.predictor.model.modelFormat: 'name' is a required property"),
    ("ServingRuntime", "spec.containers", DELETE, "ServingRuntime embedding: spec: 'containers' is a required"),
    ("ClusterServingRuntime", "spec.containers.0.name", DELETE, "spec.containers[0]: 'name' is a required"),
    ("Role", "rules.0.verbs", DELETE, "Role embedding: rules[0]: 'verbs' is a required property"),
    ("RoleBinding", "roleRef", DELETE, "RoleBinding embedding: (document): 'roleRef' is a required property"),
    ("RoleBinding", "roleRef.name", DELETE, "roleRef: 'name' is a required property"),
    ("NetworkPolicy", "spec.ingress.0.from.0.ipBlock.cidr", DELETE, "ipBlock: 'cidr' is a required property"),
    # unknown fields (strict field validation, as kubectl apply asks for)
    ("InferenceService", "spec.predictor.model.storageUrl", "gs://b", "spec.predictor.model: Additional properties"),
    ("ServingRuntime", "metadata.label", {"a": "b"}, "metadata: Additional properties are not allowed ('label'"),
    ("Secret", "strinData", {"a": "b"}, "Secret embedding: (document): Additional properties are not allowed"),
    ("NetworkPolicy", "spec.podselector", {}, "spec: Additional properties are not allowed ('podselector'"),
    # metadata, which a CRD leaves to the API server
    ("InferenceService", "metadata.labels", {"version": 3}, "metadata.labels.version: 3 is not of type 'string'"),
    ("InferenceService", "metadata.name", "Embedding_1", "metadata.name: 'Embedding_1' is not a DNS-1035 label"),
    ("InferenceService", "metadata.name", "1embedding", "metadata.name: '1embedding' is not a DNS-1035"),
    ("ServingRuntime", "metadata.name", DELETE, "ServingRuntime (no name): metadata.name: required"),
    ("Secret", "metadata.name", "a" * 254, "is not a DNS-1123 subdomain of at most 253"),
    ("RoleBinding", "metadata.name", "a/b", "metadata.name: 'a/b' is not a path segment name"),
    ("NetworkPolicy", "metadata.namespace", "Models", "metadata.namespace: 'Models' is not a DNS-1123 label"),
]


@pytest.mark.parametrize("kind, path, value, message", BROKEN, ids=lambda v: v if isinstance(v, str) else None)
def test_broken_object_is_refused_with_its_path(kind, path, value, message):
    doc = copy.deepcopy(VALID[kind])
    _set(doc, path, value)
    with pytest.raises(ManifestError) as info:
        validate(doc)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_int_or_string_and_quantities_accept_both_spellings():
    doc = copy.deepcopy(VALID["InferenceService"])
    resources = doc["spec"]["predictor"]["model"]["resources"]
    for value in (1, "1", "500m", "1.5", "2Gi", "1e3"):
        resources["limits"]["cpu"] = value
        validate(doc)
    policy = copy.deepcopy(VALID["NetworkPolicy"])
    for value in (8085, "http"):
        policy["spec"]["ingress"][0]["ports"][0]["port"] = value
        validate(policy)


def test_formats_and_nullable_are_handled():
    """Formats the schemas use (date-time, int32, byte) and OpenAPI's nullable don't break validation."""
    doc = copy.deepcopy(VALID["Secret"])
    doc["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    doc["data"]["empty"] = ""
    validate(doc)
    schema = _adapt({"type": "object", "properties": {"a": {"type": "string", "nullable": True},
                                                      "b": {"type": "integer", "format": "int64"}}})
    validator = Draft4Validator(schema)
    assert validator.is_valid({"a": None, "b": 1}) and validator.is_valid({"a": "x"})
    assert not validator.is_valid({"a": 1}) and not validator.is_valid({"c": 1})


@pytest.mark.parametrize("api_version, kind", [
    ("serving.kserve.io/v1beta1", "Deployment"),
    ("serving.kserve.io/v1alpha1", "InferenceService"),
    ("v2", "Secret"),
    ("example.org/v1", "Widget"),
    ("../../v1", "Secret"),
])
def test_unknown_kind_is_refused(api_version, kind):
    with pytest.raises(ManifestError, match=f"no schema for apiVersion '{api_version}' kind '{kind}'"):
        validate({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}})


@pytest.mark.parametrize("doc", [[], {"kind": "Secret"}, {"apiVersion": "v1", "kind": 3}])
def test_malformed_document_is_refused(doc):
    with pytest.raises(ManifestError):
        validate(doc)


def test_validate_file_reads_every_document(tmp_path):
    import yaml

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump_all([VALID["ServiceAccount"], None, VALID["RoleBinding"]]) + "---\n")
    assert [d["kind"] for d in validate_file(good)] == ["ServiceAccount", "RoleBinding"]
    broken = copy.deepcopy(VALID["RoleBinding"])
    del broken["roleRef"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all([VALID["ServiceAccount"], broken]))
    with pytest.raises(ManifestError, match=r"bad\.yaml \(document 2\): RoleBinding embedding: .*'roleRef'"):
        validate_file(bad)


def test_kserve_inference_service_passes_the_official_schema():
    from pipeline.kserve_deploy import inference_service

    for protocol in ("v1", "v2", "grpc-v2"):
        validate(inference_service("embedding", "models", "s3://bucket/embedding/1.0", protocol, "embedding", "1.0",
                                   runtime="kserve-torchserve", service_account="storage"))
