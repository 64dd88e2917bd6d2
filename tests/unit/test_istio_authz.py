"""deploy/kserve/authorizationpolicy.yaml in a Kubeflow mesh: every caller the docs name reaches every path the
predictor serves, through the sidecar Kubeflow injects in profile namespaces; nothing else in the pod opens.

The decisions come from tests/support/istio_authz.py (Istio 1.24.3's AuthorizationPolicy evaluation), first
checked here against upstream's own cases. Without the shipped policy, Kubeflow's defaults answer the pipeline's
canary check, a service account's token, another profile and the activator's hop 403: the tests say so, so they
would fail if the policy were dropped."""

from __future__ import annotations

import types

import pytest
import yaml
from support import istio_authz as authz
from support.istio_authz import Request, Workload, decide

from pipeline.manifests import validate_file
from pipeline.networkpolicy import ISTIO_POLICY_FILE, authorization_policy, main
from serving.gateway.app import Gateway
from serving.grpc_v2 import SERVICE, pb
from settings import KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT

PROFILE, OWNER = "kubeflow-user-example-com", "user@example.com"
PREDICTOR = Workload(PROFILE, {"serving.kserve.io/inferenceservice": "embedding", "component": "predictor"})
#: Knative's queue-proxy ports (knative.dev/networking pkg/apis/networking BackendHTTPPort/BackendHTTP2Port):
#: what a serverless predictor's sidecar receives on. Raw mode receives on the container's own ports.
QUEUE_HTTP, QUEUE_H2C = 8012, 8013
METRICS_PORT = 8082


# Upstream's own cases first: istio/istio 1.24.3.

@pytest.mark.parametrize("pattern, expected", [
    ("/productpage", ("exact", "/productpage")),  # matcher/header_test.go TestPathMatcher "exact match"
    ("/prefix*", ("prefix", "/prefix")),  # "prefix match"
    ("*suffix", ("suffix", "suffix")),  # "suffix match"
    ("*", ("regex", ".+")),  # "wildcard match"
    ("abc*", ("prefix", "abc")),  # matcher/string_test.go TestStringMatcherWithPrefix "prefix"
    ("*abc", ("suffix", "abc")),  # "suffix"
])
def test_value_matchers_are_istios(pattern, expected):
    assert authz.value_matcher(pattern) == expected


def _upstream_policies(workload_label: str, *specs: tuple[str, dict]) -> list[dict]:
    return [{"kind": "AuthorizationPolicy", "metadata": {"name": name, "namespace": "ns1"},
             "spec": {"selector": {"matchLabels": {"app": workload_label}}, **spec}} for name, spec in specs]


def test_path_precedence_as_upstreams_integration_test():
    """tests/integration/security/authz_test.go TestAuthz_PathPrecedence, testdata/authz/path-precedence.yaml.tmpl:
    DENY /allow/admin beside ALLOW /allow*; the query never matters."""
    policies = _upstream_policies("b", ("deny", {"action": "DENY", "rules": [{"to": [{"operation": {
        "paths": ["/allow/admin"]}}]}]}), ("allow", {"action": "ALLOW", "rules": [{"to": [{"operation": {
            "paths": ["/allow*"]}}]}]}))
    b = Workload("ns1", {"app": "b"})
    for path, allowed in (("/allow/admin", False), ("/allow/admin?param=value", False), ("/allow", True),
                          ("/allow?param=value", True)):
        assert decide(policies, b, Request(path, "GET"))[0] is allowed, path


@pytest.mark.parametrize("path, allowed", [
    ("/public", True), ("/public/../public", True), ("/private", False), ("/public/../private", False),
    ("/public/./../private", False), ("/public/.././private", False), ("/public/%2E%2E/private", False),
    ("/public/%2e%2e/private", False), ("/public/%2E/%2E%2E/private", False), ("/public/%2e/%2e%2e/private", False),
    ("/public/%2E%2E/%2E/private", False), ("/public/%2e%2e/%2e/private", False),
])
def test_path_normalization_as_upstreams_integration_test(path, allowed):
    """TestAuthz_PathNormalization, testdata/authz/path-normalization.yaml.tmpl: ALLOW GET /public*."""
    policies = _upstream_policies("b", ("b", {"rules": [{"to": [{"operation": {"paths": ["/public*"],
                                                                              "methods": ["GET"]}}]}]}))
    assert decide(policies, Workload("ns1", {"app": "b"}), Request(path, "GET"))[0] is allowed


def test_plaintext_callers_have_no_principal_as_upstreams_integration_test():
    """TestAuthz_DenyPlaintext (testdata/authz/plaintext.yaml.tmpl): DENY notPrincipals ["*"] refuses a caller
    without a sidecar and admits one with; `namespaces` never matches plaintext."""
    policies = _upstream_policies("b", ("deny-plaintext", {"action": "DENY", "rules": [{"from": [{"source": {
        "notPrincipals": ["*"]}}]}]}))
    b = Workload("ns1", {"app": "b"})
    assert decide(policies, b, Request("/", peer=None)) == (False, f"{authz.DENIED} (DENY deny-plaintext)")
    assert decide(policies, b, Request("/", peer=authz.principal("ns1", "a")))[0]
    only_ns1 = _upstream_policies("b", ("ns1", {"rules": [{"from": [{"source": {"namespaces": ["ns1"]}}]}]}))
    assert not decide(only_ns1, b, Request("/", peer=None))[0]
    assert decide(only_ns1, b, Request("/", peer=authz.principal("ns1", "a")))[0]


def test_a_policy_without_rules_denies_and_no_sidecar_enforces_nothing():
    """builder.go: an ALLOW policy with no rules never matches; global-deny-all is one in the root namespace."""
    mesh = authz.kubeflow_mesh(PROFILE, OWNER)[:1]
    assert decide(mesh, Workload("anywhere", {}), Request("/x"))[0] is False
    assert decide(mesh, Workload("anywhere", {}, sidecar=False), Request("/x"))[0] is True


# The shipped policy in Kubeflow's mesh.

(FILE,) = validate_file(ISTIO_POLICY_FILE)
SHIPPED = [authorization_policy("embedding", PROFILE)]  # the file as `kubectl -n PROFILE apply -f` places it
assert SHIPPED[0]["spec"] == FILE["spec"]


def served_paths() -> list[tuple[str, str]]:
    """(method, path) of every route the predictor's gateway serves (both runtimes serve the same gateway), with
    the model's name filled in, and every Open Inference gRPC method as HTTP/2 carries it."""
    app = Gateway(types.SimpleNamespace(max_request_size=1), api_key="k").app()
    fill = {"{model}": "embedding", "{version}": "1.0"}
    routes = []
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        path = route.resource.canonical
        for placeholder, value in fill.items():
            path = path.replace(placeholder, value)
        if "{spec}" in path:
            routes += [(route.method, path.replace("{spec}", "embedding")),
                       (route.method, path.replace("{spec}", "embedding:predict"))]
        else:
            routes.append((route.method, path))
    grpc = [("POST", f"/{SERVICE}/{m.name}") for m in pb.DESCRIPTOR.services_by_name[SERVICE.split(".")[1]].methods]
    assert len(routes) >= 17 and len(grpc) >= 6  # the walk found the routes, not an empty list
    return routes + grpc


#: (who, the peer the predictor's sidecar sees, headers past the gateways, how a serverless pod receives it)
CALLERS = {
    "the owner through the ingress, straight to the pod": (authz.INGRESS_GATEWAY, {"kubeflow-userid": OWNER}),
    "the owner through the ingress, the activator in the path": (authz.ACTIVATOR, {"kubeflow-userid": OWNER}),
    "a service account's token through the ingress": (authz.INGRESS_GATEWAY, {}),
    "the pipeline's canary check from a KFP pod, through the cluster-local gateway": (authz.LOCAL_GATEWAY, {}),
    "another profile's pod, through the cluster-local gateway": (authz.LOCAL_GATEWAY, {}),
    "a pod of the profile itself, with its sidecar": (authz.principal(PROFILE, "default-editor"), {}),
}
#: Which of them Kubeflow's own policies admit to the predictor's paths, without the shipped one.
KUBEFLOW_ALONE_ADMITS = {"the owner through the ingress, straight to the pod", "a pod of the profile itself, with its sidecar"}


def _port(path: str) -> int:
    return QUEUE_H2C if path.startswith(f"/{SERVICE}/") else QUEUE_HTTP


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_every_caller_reaches_every_served_path_with_the_shipped_policy(caller):
    peer, headers = CALLERS[caller]
    mesh = authz.kubeflow_mesh(PROFILE, OWNER) + SHIPPED
    for method, path in served_paths():
        allowed, why = decide(mesh, PREDICTOR, Request(path, method, _port(path), peer, headers))
        assert allowed, f"{caller}: {method} {path}: {why}"


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_without_it_kubeflow_refuses_the_canary_check_tokens_and_the_activators_hop(caller):
    peer, headers = CALLERS[caller]
    allowed, why = decide(authz.kubeflow_mesh(PROFILE, OWNER), PREDICTOR,
                          Request("/v1/models/embedding:predict", "POST", QUEUE_HTTP, peer, headers))
    assert allowed is (caller in KUBEFLOW_ALONE_ADMITS), why
    if not allowed:
        assert why == f"{authz.DENIED} (no ALLOW policy matches)"


def test_prometheus_without_a_sidecar_scrapes_the_metrics_port():
    mesh = authz.kubeflow_mesh(PROFILE, OWNER) + SHIPPED
    assert decide(mesh, PREDICTOR, Request("/metrics", "GET", METRICS_PORT, None))[0]


@pytest.mark.parametrize("path", ["/models", "/models/embedding", "/api/kernels", "/predictions/../models",
                                  "/v2/%2e%2e/models", "/v1/../models?x=/v1/models/embedding", "/metrics/../admin",
                                  "/inference.GRPCInferenceService", "/grpc.health.v1.Health/Check"])
def test_the_shipped_policy_opens_nothing_but_the_served_paths(path):
    """TorchServe's management API answers /models, so it must stay shut even where a sidecar's path
    normalization would let a crafted path through."""
    mesh = authz.kubeflow_mesh(PROFILE, OWNER) + SHIPPED
    assert not decide(mesh, PREDICTOR, Request(path, "POST", QUEUE_HTTP, authz.LOCAL_GATEWAY))[0]


def test_it_selects_only_its_own_predictor_and_raw_mode_ports_pass_too():
    mesh = authz.kubeflow_mesh(PROFILE, OWNER) + SHIPPED
    other = Workload(PROFILE, {"serving.kserve.io/inferenceservice": "other"})
    assert not decide(mesh, other, Request("/predictions/embedding", peer=authz.LOCAL_GATEWAY))[0]
    for port in (KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT):  # raw mode: the pod receives on the container's ports
        assert decide(mesh, PREDICTOR, Request("/v2/models/embedding/infer", port=port, peer=authz.INGRESS_GATEWAY))[0]


def test_the_generator_renames_it_for_another_inference_service(capsys):
    policy = authorization_policy("digits", "models")
    assert policy["metadata"] == {"name": "digits-predictor", "namespace": "models"}
    digits = Workload("models", {"serving.kserve.io/inferenceservice": "digits"})
    assert decide(authz.kubeflow_mesh("models", OWNER) + [policy], digits,
                  Request("/predictions/digits", peer=authz.LOCAL_GATEWAY))[0]
    assert main(["--istio", "--inference-service", "digits"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["spec"] == policy["spec"]
    assert main(["--istio", "--inference-service", "Digits"]) == 2
    assert "not a DNS-1035 label" in capsys.readouterr().err


def test_unemulated_fields_raise_instead_of_being_guessed():
    policy = {"kind": "AuthorizationPolicy", "metadata": {"name": "p", "namespace": PROFILE},
              "spec": {"rules": [{"from": [{"source": {"ipBlocks": ["10.0.0.0/8"]}}]}]}}
    with pytest.raises(NotImplementedError, match="ipBlocks"):
        decide([policy], PREDICTOR, Request("/"))
