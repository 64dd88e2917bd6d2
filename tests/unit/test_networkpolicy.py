"""deploy/kserve/networkpolicy.yaml: valid against the NetworkPolicy schema (deploy/schemas), callers reach the
predictor's REST and gRPC ports, Knative's system namespace the queue-proxy's ports, the monitoring namespace the
metrics port, and both names are parameters of `python -m pipeline.networkpolicy`."""

from __future__ import annotations

import pytest
import yaml

from pipeline.kserve_deploy import METRICS_PORT
from settings import KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT
from pipeline.manifests import ManifestError, validate, validate_file
from pipeline.networkpolicy import POLICY_FILE, main, network_policy

#: Knative Serving's queue-proxy (knative.dev/serving pkg/networking): 8012 http, 8013 h2c, 8022 admin,
#: 9090 metrics for the autoscaler, 9091 metrics for users.
QUEUE_PROXY = {"http": 8012, "h2c": 8013, "admin": 8022, "autoscaler": 9090, "user": 9091}


def ports_from(policy: dict, namespace: str | None) -> set[int]:
    """Ports the policy opens to pods of `namespace` (None: to anyone, i.e. rules without `from`)."""
    opened: set[int] = set()
    for rule in policy["spec"]["ingress"]:
        peers = rule.get("from")
        if peers is None:
            if namespace is None:
                opened |= {p["port"] for p in rule["ports"]}
            continue
        names = {peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
                 for peer in peers}
        if namespace in names:
            opened |= {p["port"] for p in rule["ports"]}
    return opened


def test_shipped_policy_is_valid_and_opens_what_knative_and_prometheus_need():
    (policy,) = validate_file(POLICY_FILE)
    anyone = ports_from(policy, None)
    assert anyone == {KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT, QUEUE_PROXY["http"], QUEUE_PROXY["h2c"]}
    knative = ports_from(policy, "knative-serving")
    assert {QUEUE_PROXY["autoscaler"], QUEUE_PROXY["http"], QUEUE_PROXY["admin"]} <= knative
    assert METRICS_PORT not in knative | anyone  # the model's metrics are not Knative's business
    assert {METRICS_PORT, QUEUE_PROXY["user"]} <= ports_from(policy, "monitoring")
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_namespaces_are_parameters():
    policy = network_policy("observability", "knative-system", "digits", "models")
    validate(policy)
    assert ports_from(policy, "monitoring") == set() and ports_from(policy, "knative-serving") == set()
    assert ports_from(policy, "observability") == ports_from(yaml.safe_load(POLICY_FILE.read_text()), "monitoring")
    assert QUEUE_PROXY["autoscaler"] in ports_from(policy, "knative-system")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"serving.kserve.io/inferenceservice": "digits"}
    assert policy["metadata"]["namespace"] == "models"
    assert policy["metadata"]["name"] == "digits-predictor"  # two services' policies in one namespace coexist
    assert network_policy() == yaml.safe_load(POLICY_FILE.read_text())  # the defaults are the shipped file


@pytest.mark.parametrize("kwargs, message", [
    ({"monitoring_namespace": "Monitoring"}, "monitoring namespace 'Monitoring' is not a DNS-1123 label"),
    ({"knative_namespace": "knative_serving"}, "Knative namespace 'knative_serving' is not a DNS-1123 label"),
    ({"inference_service": "9lives"}, "InferenceService name '9lives' is not a DNS-1035 label"),
    ({"namespace": "-x"}, "namespace '-x' is not a DNS-1123 label"),
])
def test_invalid_names_are_refused(kwargs, message):
    with pytest.raises(ManifestError, match=message):
        network_policy(**kwargs)


def test_a_policy_file_without_the_monitoring_rule_is_refused(tmp_path):
    text = POLICY_FILE.read_text().replace("kubernetes.io/metadata.name: monitoring", "team: monitoring")
    (tmp_path / "policy.yaml").write_text(text)
    with pytest.raises(ManifestError, match="no ingress rule selects the namespace 'monitoring'"):
        network_policy(path=tmp_path / "policy.yaml")


@pytest.mark.parametrize("port", [KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT])
def test_a_policy_file_that_closes_a_serving_port_is_refused(tmp_path, port):
    """A raw-mode Service targets the predictor's port itself (8081 for grpc-v2): without it, that protocol is
    unreachable."""
    policy = yaml.safe_load(POLICY_FILE.read_text())
    (open_rule,) = [rule for rule in policy["spec"]["ingress"] if "from" not in rule]
    open_rule["ports"] = [p for p in open_rule["ports"] if p["port"] != port]
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    with pytest.raises(ManifestError, match=f"no ingress rule opens the predictor's .* port {port} to callers"):
        network_policy(path=tmp_path / "policy.yaml")


def test_command_writes_the_policy_for_kubectl(capsys):
    assert main(["--monitoring-namespace", "observability", "--namespace", "models"]) == 0
    policy = yaml.safe_load(capsys.readouterr().out)
    validate(policy)
    assert METRICS_PORT in ports_from(policy, "observability")
    assert main(["--monitoring-namespace", "Bad"]) == 2
    assert capsys.readouterr().err.strip() == "networkpolicy: monitoring namespace 'Bad' is not a DNS-1123 label"
