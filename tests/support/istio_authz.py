"""Istio's AuthorizationPolicy decision at a workload's sidecar, and the policies of a Kubeflow mesh, for tests.

No Istio runs here. This evaluates one request against AuthorizationPolicy objects the way istiod builds them into
Envoy's RBAC filters and Envoy applies them, derived from istio/istio at tag 1.24.3 (the Istio of Kubeflow 1.10;
Kubeflow 1.9.1 ships 1.22.1 and 1.11 ships 1.28.0, the same in what is used here):

- which policies apply: those of the root namespace (istio-system) and of the workload's namespace whose
  `selector.matchLabels` the workload's labels hold (pilot/pkg/model/authorization.go ListAuthorizationPolicies);
- the order (pilot/pkg/security/authz/builder/builder.go BuildHTTP, and the evaluation order in
  istio/api security/v1beta1/authorization_policy.proto): a matching DENY denies; no ALLOW policy allows; a
  matching ALLOW allows; otherwise 403 `RBAC: access denied`. A policy without rules never matches
  (builder.go: rbacPolicyMatchNever), so `global-deny-all` (`spec: {}`) denies everything not allowed elsewhere;
- a rule (pilot/pkg/security/authz/model/model.go New): its `from` entries OR, its `to` entries OR, its `when`
  conditions AND, and the three AND; fields inside one source/operation AND, values inside one field OR;
- values (pilot/pkg/security/authz/matcher/string.go StringMatcherWithPrefix, header.go PathMatcher): `*` is any
  non-empty value, `*x` a suffix, `x*` a prefix, else exact, case-sensitive;
- paths are matched without the query (Envoy RBAC `url_path`) after Envoy's normalize_path, which Istio's default
  pathNormalization (BASE) turns on (pilot/pkg/networking/core/listener_builder.go): RFC 3986 dot segments are
  removed, `%2E` counting as a dot; other escapes and repeated slashes stay;
- `principals`, `namespaces` and `source.namespace` read the peer certificate (model/principal.go
  principalAuthenticated), so a caller without a sidecar (plaintext) has neither: it matches only their `not` forms.

Checked against upstream's own cases in tests/unit/test_istio_authz.py (matcher/header_test.go TestPathMatcher,
matcher/string_test.go TestStringMatcherWithPrefix, tests/integration/security/authz_test.go
TestAuthz_PathPrecedence, TestAuthz_PathNormalization, TestAuthz_DenyPlaintext). Fields this project's
policies and Kubeflow's do not use (ipBlocks, hosts, CUSTOM and AUDIT actions, targetRefs) raise instead of
being guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

ROOT_NAMESPACE = "istio-system"
DENIED = "RBAC: access denied"  # Envoy's 403 body


def principal(namespace: str, service_account: str) -> str:
    """The SPIFFE identity (without `spiffe://`) a sidecar's certificate carries."""
    return f"cluster.local/ns/{namespace}/sa/{service_account}"


@dataclass(frozen=True)
class Request:
    """What the workload's sidecar sees: the raw path (with any query), method, the port the pod receives on,
    the peer's principal (None: plaintext, no sidecar) and the headers."""

    path: str
    method: str = "POST"
    port: int = 8012
    peer: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    namespace: str
    labels: Mapping[str, str]
    sidecar: bool = True


def value_matcher(pattern: str) -> tuple[str, str]:
    """StringMatcherWithPrefix / PathMatcher: ("exact" | "prefix" | "suffix" | "regex", value)."""
    if pattern == "*":
        return "regex", ".+"
    if pattern.startswith("*"):
        return "suffix", pattern[1:]
    if pattern.endswith("*"):
        return "prefix", pattern[:-1]
    return "exact", pattern


def _matches(pattern: str, value: str | None) -> bool:
    if value is None:
        return False
    kind, operand = value_matcher(pattern)
    if kind == "regex":
        return re.fullmatch(operand, value) is not None
    if kind == "prefix":
        return value.startswith(operand)
    if kind == "suffix":
        return value.endswith(operand)
    return value == operand


def _any(patterns: Sequence[str], value: str | None) -> bool:
    return any(_matches(p, value) for p in patterns)


def _dot(segment: str) -> str | None:
    """'.' or '..' when the segment is one (`%2E` read as a dot), else None."""
    plain = re.sub("%2e", ".", segment, flags=re.IGNORECASE)
    return plain if plain in (".", "..") else None


def normalized_path(raw: str) -> str:
    """The path Envoy's RBAC filter matches: no query, dot segments removed (RFC 3986 5.2.4)."""
    path = raw.split("?", 1)[0].split("#", 1)[0]
    out: list[str] = []
    segments = path.split("/")[1:]
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        dot = _dot(segment)
        if dot == "..":
            if out:
                out.pop()
        elif dot is None:
            out.append(segment)
        if dot and last:
            out.append("")  # "/a/.." is "/", "/a/." is "/a/"
    return "/" + "/".join(out)


def _peer_namespace(peer: str | None) -> str | None:
    found = re.fullmatch(r".*/ns/([^/]+)/.*", peer or "")
    return found.group(1) if found else None


def _check(pairs: Mapping, allowed: set[str], where: str) -> None:
    unknown = set(pairs) - allowed
    if unknown:
        raise NotImplementedError(f"{where}: {sorted(unknown)} not emulated")


def _source_matches(source: Mapping, request: Request) -> bool:
    _check(source, {"principals", "notPrincipals", "namespaces", "notNamespaces"}, "source")
    namespace = _peer_namespace(request.peer)
    checks = (("principals", request.peer), ("namespaces", namespace))
    return all((key not in source or _any(source[key], value))
               and (f"not{key[0].upper()}{key[1:]}" not in source
                    or not _any(source[f"not{key[0].upper()}{key[1:]}"], value))
               for key, value in checks)


def _operation_matches(operation: Mapping, request: Request) -> bool:
    _check(operation, {"paths", "notPaths", "methods", "notMethods", "ports", "notPorts"}, "operation")
    path = normalized_path(request.path)
    values = {"paths": path, "methods": request.method, "ports": str(request.port)}
    return all((key not in operation or _any([str(v) for v in operation[key]], value))
               and (f"not{key[0].upper()}{key[1:]}" not in operation
                    or not _any([str(v) for v in operation[f"not{key[0].upper()}{key[1:]}"]], value))
               for key, value in values.items())


def _condition_value(key: str, request: Request) -> str | None:
    header = re.fullmatch(r"request\.headers\[(.+)\]", key)
    if header:
        wanted = header.group(1).lower()
        return next((v for k, v in request.headers.items() if k.lower() == wanted), None)
    if key == "source.namespace":
        return _peer_namespace(request.peer)
    if key == "source.principal":
        return request.peer
    if key == "destination.port":
        return str(request.port)
    raise NotImplementedError(f"when: key {key!r} not emulated")


def _condition_matches(condition: Mapping, request: Request) -> bool:
    _check(condition, {"key", "values", "notValues"}, "when")
    value = _condition_value(condition["key"], request)
    return (("values" not in condition or _any(condition["values"], value))
            and ("notValues" not in condition or not _any(condition["notValues"], value)))


def rule_matches(rule: Mapping, request: Request) -> bool:
    _check(rule, {"from", "to", "when"}, "rule")
    return (("from" not in rule or any(_source_matches(f["source"], request) for f in rule["from"]))
            and ("to" not in rule or any(_operation_matches(t["operation"], request) for t in rule["to"]))
            and all(_condition_matches(c, request) for c in rule.get("when", [])))


def applies(policy: Mapping, workload: Workload) -> bool:
    namespace = policy["metadata"].get("namespace")
    if namespace not in (ROOT_NAMESPACE, workload.namespace):
        return False
    spec = policy.get("spec") or {}
    _check(spec, {"action", "selector", "rules"}, "spec")
    wanted = (spec.get("selector") or {}).get("matchLabels", {})
    return all(workload.labels.get(k) == v for k, v in wanted.items())


def decide(policies: Sequence[Mapping], workload: Workload, request: Request) -> tuple[bool, str]:
    """(allowed, why): the sidecar's decision for `request` to `workload`."""
    if not workload.sidecar:
        return True, "no sidecar: nothing is enforced"
    mine = [p for p in policies if p.get("kind") == "AuthorizationPolicy" and applies(p, workload)]
    for policy in mine:
        action = (policy.get("spec") or {}).get("action", "ALLOW")
        if action not in ("ALLOW", "DENY"):
            raise NotImplementedError(f"action {action} not emulated")
    by_action = {a: [p for p in mine if (p.get("spec") or {}).get("action", "ALLOW") == a] for a in ("ALLOW", "DENY")}
    for policy in by_action["DENY"]:
        if any(rule_matches(r, request) for r in (policy.get("spec") or {}).get("rules", [])):
            return False, f"{DENIED} (DENY {policy['metadata']['name']})"
    if not by_action["ALLOW"]:
        return True, "no ALLOW policy applies"
    for policy in by_action["ALLOW"]:
        if any(rule_matches(r, request) for r in (policy.get("spec") or {}).get("rules", [])):
            return True, f"ALLOW {policy['metadata']['name']}"
    return False, f"{DENIED} (no ALLOW policy matches)"


# The Kubeflow mesh, as the manifests and the profile controller write it.
INGRESS_GATEWAY = principal("istio-system", "istio-ingressgateway-service-account")
LOCAL_GATEWAY = principal("istio-system", "cluster-local-gateway-service-account")
ACTIVATOR = principal("knative-serving", "activator")
KFP_UI = principal("kubeflow", "ml-pipeline-ui")
NOTEBOOK_CONTROLLER = principal("kubeflow", "notebook-controller-service-account")
USERID_HEADER = "kubeflow-userid"


def _policy(name: str, namespace: str, spec: dict) -> dict:
    return {"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def kubeflow_mesh(profile: str, owner: str) -> list[dict]:
    """The AuthorizationPolicies that decide a request to a pod of `profile` in Kubeflow 1.9.1 to 1.11:

    - `global-deny-all` (kubeflow/manifests v1.9.1 common/istio-1-22, v1.10.1 common/istio-1-24 and v1.11.0
      common/istio, istio-install/base/deny_all_authorizationpolicy.yaml): `spec: {}` in istio-system;
    - `ns-owner-access-istio`, the profile controller's (kubeflow/kubeflow v1.9.2 and v1.10.0, the versions those
      manifests pin, components/profile-controller/controllers/profile_controller.go getAuthorizationPolicy,
      the same in both; the manifests set USERID_HEADER kubeflow-userid and an empty USERID_PREFIX).
    No PeerAuthentication is set, so the mesh is PERMISSIVE: callers without a sidecar get through in plaintext.
    """
    return [
        _policy("global-deny-all", ROOT_NAMESPACE, {}),
        _policy("ns-owner-access-istio", profile, {"action": "ALLOW", "rules": [
            {"when": [{"key": f"request.headers[{USERID_HEADER}]", "values": [owner]}],
             "from": [{"source": {"principals": [INGRESS_GATEWAY, KFP_UI]}}]},
            {"when": [{"key": "source.namespace", "values": [profile]}]},
            {"to": [{"operation": {"paths": ["/healthz", "/metrics", "/wait-for-drain"]}}]},
            {"from": [{"source": {"principals": [NOTEBOOK_CONTROLLER]}}],
             "to": [{"operation": {"methods": ["GET"], "paths": ["*/api/kernels"]}}]},
        ]}),
    ]
