"""How KServe and Knative split a serverless predictor's traffic between revisions: canaryTrafficPercent, tag
routing, and the rolled-out revisions KServe tracks in status. Plain functions the Kubernetes stand-in
(support.k8s_standin) composes in the order the controllers run them; tests/unit/test_kserve_traffic.py checks each
against the upstream test cases named below.

Derived from, at the tags the supported releases ship (the code is the same in each):
- kserve/kserve v0.13.1 and v0.15.2, pkg/controller/v1beta1/inferenceservice/reconcilers/knative/
  ksvc_reconciler.go, createKnativeService: the Knative Service's spec.traffic (`ksvc_traffic`); its tests:
  ksvc_reconciler_test.go TestCreateKnativeService.
- kserve/kserve v0.15.2, pkg/apis/serving/v1beta1/inference_service_status.go, PropagateStatus: latest and previous
  rolled-out revision (`propagate`); its tests: inference_service_status_test.go TestPropagateStatus.
- knative/serving knative-v1.15.3, pkg/reconciler/route/traffic/traffic.go: a latestRevision target resolves to
  the Configuration's latestReadyRevisionName (addConfigurationTarget), targets with the same tag, revision and
  latestRevision merge (mergeIfNecessary), each tagged target gets the URL of hostname `{tag}-{route}`
  (computeURL, domains.HostnameFromTemplate's default "{{.Tag}}-{{.Name}}") and status lists one entry per target
  (targetToStatus), 0% targets included.
"""

from __future__ import annotations

from typing import Any

#: pkg/constants/constants.go EnableRoutingTagAnnotationKey.
TAG_ROUTING = "serving.kserve.io/enable-tag-routing"
#: The tags createKnativeService gives the candidate and the revision it is measured against.
LATEST_TAG, PREV_TAG = "latest", "prev"


def ksvc_traffic(canary_percent: int | None, annotations: dict[str, str], latest_rolled_out: str) -> list[dict]:
    """The Knative Service's spec.traffic KServe writes: a split only when canaryTrafficPercent is set and a revision
    has been rolled out before; else all traffic on the latest revision."""
    tagged = annotations.get(TAG_ROUTING) == "true"
    if canary_percent is not None and latest_rolled_out:
        targets = [{"latestRevision": True, "percent": canary_percent, **({"tag": LATEST_TAG} if tagged else {})}]
        if canary_percent < 100:
            targets.append({"revisionName": latest_rolled_out, "latestRevision": False,
                            "percent": 100 - canary_percent, "tag": PREV_TAG})
        return targets
    return [{"latestRevision": True, "percent": 100, **({"tag": LATEST_TAG} if tagged else {})}]


def route_traffic(targets: list[dict], latest_ready: str, ready: set[str], route: str, namespace: str,
                  domain: str = "example.com") -> list[dict] | None:
    """The Route's status.traffic for `targets`, or None while one cannot be resolved (no ready revision for a
    latestRevision target, or a named revision not ready): Knative then keeps the route as it was."""
    resolved: list[dict] = []
    for target in targets:
        name = latest_ready if target.get("latestRevision") else target.get("revisionName", "")
        if not name or name not in ready:
            return None
        same = next((r for r in resolved if (r.get("tag"), r["revisionName"], r["latestRevision"])
                     == (target.get("tag"), name, bool(target.get("latestRevision")))), None)
        if same is not None:
            same["percent"] += target["percent"]
            continue
        entry: dict[str, Any] = {"revisionName": name, "percent": target["percent"],
                                 "latestRevision": bool(target.get("latestRevision"))}
        if target.get("tag"):
            entry = {"tag": target["tag"], **entry, "url": f"http://{target['tag']}-{route}.{namespace}.{domain}"}
        resolved.append(entry)
    return resolved


def propagate(rolled: dict[str, str], traffic: list[dict], latest_ready: str, latest_created: str) -> dict[str, str]:
    """KServe's PropagateStatus for the rolled-out revisions: {"latest": ..., "previous": ...} after it reads the
    Knative Service's status traffic."""
    out = dict(rolled)
    per_revision: dict[str, int] = {}
    for target in traffic:
        per_revision[target["revisionName"]] = per_revision.get(target["revisionName"], 0) + target["percent"]
    for target in traffic:
        if target["revisionName"] != latest_ready or not target.get("latestRevision"):
            continue
        if out.get("latest", "") != latest_ready:
            if target["percent"] == 100:
                out["previous"], out["latest"] = out.get("latest", ""), latest_ready
        elif latest_ready == latest_created and target["percent"] < 100:
            # Traffic split over the same revision: a rollout of the latest revision taken back (canary 0).
            if per_revision.get(target["revisionName"]) == 100 and out.get("previous"):
                out["latest"] = out["previous"]
    return out
