"""The predictor's NetworkPolicy (deploy/kserve/networkpolicy.yaml) for a cluster's own namespace names, and its
Istio AuthorizationPolicy (deploy/kserve/authorizationpolicy.yaml) for another InferenceService name.

The shipped file lets callers reach the predictor's serving ports (REST 8080 and gRPC 8081, which a raw-mode
Service targets directly) and Knative's queue-proxy, and the namespaces `monitoring` (Prometheus) and
`knative-serving` (Knative's autoscaler and activator) reach the metrics and queue-proxy ports. Clusters name those
namespaces otherwise; this writes the same policy with other names, checked against the NetworkPolicy schema
(deploy/schemas) and for the serving ports, without kustomize:

    python -m pipeline.networkpolicy --monitoring-namespace observability | kubectl -n models apply -f -
    python -m pipeline.networkpolicy --istio --inference-service digits | kubectl -n models apply -f -
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import yaml

from settings import KSERVE_GATEWAY_PORT, KSERVE_GRPC_PORT, REPO

from .manifests import ManifestError, validate

POLICY_FILE = REPO / "deploy" / "kserve" / "networkpolicy.yaml"
ISTIO_POLICY_FILE = REPO / "deploy" / "kserve" / "authorizationpolicy.yaml"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
DEFAULT_MONITORING = "monitoring"
DEFAULT_KNATIVE = "knative-serving"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
#: The ports an InferenceService the pipeline writes is served on (pipeline/kserve_deploy/manifest.py
#: predictor_endpoint): the policy must open both to callers, or one protocol is unreachable in raw mode.
SERVING_PORTS = {"REST": KSERVE_GATEWAY_PORT, "gRPC": KSERVE_GRPC_PORT}


def _namespace_peers(policy: dict) -> dict[str, list[dict]]:
    """{namespace name: the matchLabels that select it} across the policy's ingress rules."""
    peers: dict[str, list[dict]] = {}
    for rule in policy["spec"]["ingress"]:
        for peer in rule.get("from", []):
            labels = peer.get("namespaceSelector", {}).get("matchLabels", {})
            if NAMESPACE_LABEL in labels:
                peers.setdefault(labels[NAMESPACE_LABEL], []).append(labels)
    return peers


def network_policy(monitoring_namespace: str = DEFAULT_MONITORING, knative_namespace: str = DEFAULT_KNATIVE,
                   inference_service: str = "embedding", namespace: str = "", path: Path = POLICY_FILE) -> dict:
    """The shipped policy with these namespace names and InferenceService, validated; ManifestError if invalid."""
    for what, name in (("monitoring namespace", monitoring_namespace), ("Knative namespace", knative_namespace)):
        if not DNS_LABEL.match(name):
            raise ManifestError(f"{what} {name!r} is not a DNS-1123 label")
    _check_names(inference_service, namespace)
    policy = copy.deepcopy(yaml.safe_load(Path(path).read_text()))
    peers = _namespace_peers(policy)
    for default in (DEFAULT_MONITORING, DEFAULT_KNATIVE):
        if default not in peers:
            raise ManifestError(f"{path}: no ingress rule selects the namespace {default!r}")
    open_to_all = {p.get("port") for rule in policy["spec"]["ingress"] if "from" not in rule
                   for p in rule.get("ports", [])}
    for what, port in SERVING_PORTS.items():
        if port not in open_to_all:
            raise ManifestError(f"{path}: no ingress rule opens the predictor's {what} port {port} to callers")
    for default, wanted in ((DEFAULT_MONITORING, monitoring_namespace), (DEFAULT_KNATIVE, knative_namespace)):
        for labels in peers[default]:
            labels[NAMESPACE_LABEL] = wanted
    policy["spec"]["podSelector"]["matchLabels"][ISVC_LABEL] = inference_service
    policy["metadata"]["name"] = f"{inference_service}-predictor"  # one policy per InferenceService in a namespace
    if namespace:
        policy["metadata"]["namespace"] = namespace
    validate(policy)
    return policy


def _check_names(inference_service: str, namespace: str) -> None:
    if not DNS_1035.match(inference_service):
        raise ManifestError(f"InferenceService name {inference_service!r} is not a DNS-1035 label")
    if namespace and not DNS_LABEL.match(namespace):
        raise ManifestError(f"namespace {namespace!r} is not a DNS-1123 label")


def authorization_policy(inference_service: str = "embedding", namespace: str = "",
                         path: Path = ISTIO_POLICY_FILE) -> dict:
    """The shipped Istio AuthorizationPolicy for this InferenceService, validated; ManifestError if invalid."""
    _check_names(inference_service, namespace)
    policy = copy.deepcopy(yaml.safe_load(Path(path).read_text()))
    policy["spec"]["selector"]["matchLabels"][ISVC_LABEL] = inference_service
    policy["metadata"]["name"] = f"{inference_service}-predictor"
    if namespace:
        policy["metadata"]["namespace"] = namespace
    validate(policy)
    return policy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.networkpolicy", description=__doc__.split("\n")[0])
    parser.add_argument("--monitoring-namespace", default=DEFAULT_MONITORING,
                        help="namespace of the Prometheus that scrapes the predictor (default %(default)s)")
    parser.add_argument("--knative-namespace", default=DEFAULT_KNATIVE,
                        help="Knative Serving's system namespace (default %(default)s)")
    parser.add_argument("--inference-service", default="embedding", help="the InferenceService's name")
    parser.add_argument("--namespace", default="", help="metadata.namespace (default: kubectl's -n)")
    parser.add_argument("--istio", action="store_true",
                        help="write the Istio AuthorizationPolicy instead (for pods with a sidecar)")
    args = parser.parse_args(argv)
    try:
        policy = (authorization_policy(args.inference_service, args.namespace) if args.istio else
                  network_policy(args.monitoring_namespace, args.knative_namespace, args.inference_service,
                                 args.namespace))
    except ManifestError as exc:
        print(f"networkpolicy: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(policy, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
