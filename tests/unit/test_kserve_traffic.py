"""The traffic emulation of support.kserve_traffic against upstream's own test cases (named on each test), then the
canary sequence KServe documents (split, promote; split, take back with 0) run through the three functions in the
order the controllers run them."""

from __future__ import annotations

from support.kserve_traffic import TAG_ROUTING, ksvc_traffic, propagate, route_traffic

TAGGED = {TAG_ROUTING: "true"}


def test_create_knative_service_cases():
    """kserve v0.15.2 ksvc_reconciler_test.go TestCreateKnativeService: status LatestRolledoutRevision
    test-revision-1, tag routing on."""
    split = ksvc_traffic(20, TAGGED, "test-revision-1")
    assert [t["percent"] for t in split] == [20, 80]
    assert split[0]["tag"] == "latest" and split[0]["latestRevision"] is True
    assert split[1] == {"revisionName": "test-revision-1", "latestRevision": False, "percent": 80, "tag": "prev"}
    assert ksvc_traffic(None, TAGGED, "test-revision-1") == [{"latestRevision": True, "percent": 100,
                                                              "tag": "latest"}]
    assert ksvc_traffic(100, TAGGED, "test-revision-1") == [{"latestRevision": True, "percent": 100,
                                                             "tag": "latest"}]


def test_no_split_before_a_first_rollout_and_no_tag_without_the_annotation():
    """The branch conditions of createKnativeService: `CanaryTrafficPercent != nil && lastRolledoutRevision != ""`
    and the tag only under EnableRoutingTagAnnotationKey "true" (the prev tag always)."""
    assert ksvc_traffic(20, TAGGED, "") == [{"latestRevision": True, "percent": 100, "tag": "latest"}]
    assert ksvc_traffic(20, {}, "r1") == [{"latestRevision": True, "percent": 20},
                                          {"revisionName": "r1", "latestRevision": False, "percent": 80,
                                           "tag": "prev"}]


def test_propagate_status_cases():
    """kserve v0.15.2 inference_service_status_test.go TestPropagateStatus: a first revision at 100% becomes the
    rolled-out one; a rolled-out revision at 90% of itself stays rolled out."""
    first = [{"revisionName": "test-predictor-default-0001", "percent": 100, "latestRevision": True}]
    assert propagate({}, first, "test-predictor-default-0001", "")["latest"] == "test-predictor-default-0001"
    ninety = [{"revisionName": "test-predictor-default-0001", "percent": 90, "latestRevision": True}]
    rolled = {"latest": "test-predictor-default-0001"}
    assert propagate(rolled, ninety, "test-predictor-default-0001", "test-predictor-default-0001") == rolled


def _reconcile(canary, rolled, latest_ready, latest_created, ready):
    traffic = route_traffic(ksvc_traffic(canary, TAGGED, rolled.get("latest", "")), latest_ready, ready,
                            "isvc-predictor", "ns")
    return traffic, propagate(rolled, traffic, latest_ready, latest_created)


def test_a_canary_split_then_promoted():
    rolled = {"latest": "r1"}
    # r2 created, not ready: the latest tag still resolves to r1, so r1 has all of it.
    traffic, rolled = _reconcile(20, rolled, "r1", "r2", {"r1"})
    assert [(t["tag"], t["revisionName"], t["percent"]) for t in traffic] == [("latest", "r1", 20),
                                                                                ("prev", "r1", 80)]
    assert rolled == {"latest": "r1"}
    traffic, rolled = _reconcile(20, rolled, "r2", "r2", {"r1", "r2"})
    assert [(t["tag"], t["revisionName"], t["percent"]) for t in traffic] == [("latest", "r2", 20),
                                                                                ("prev", "r1", 80)]
    assert traffic[0]["url"] == "http://latest-isvc-predictor.ns.example.com"
    assert rolled == {"latest": "r1"}
    traffic, rolled = _reconcile(None, rolled, "r2", "r2", {"r1", "r2"})
    assert [(t["revisionName"], t["percent"]) for t in traffic] == [("r2", 100)]
    assert rolled == {"latest": "r2", "previous": "r1"}


def test_a_rolled_out_revision_taken_back_with_canary_zero():
    """KServe's documented rollback: canaryTrafficPercent 0 after a promotion puts the traffic on the previous
    rolled-out revision (the split-over-one-revision branch of PropagateStatus, then the next reconcile)."""
    rolled = {"latest": "r2", "previous": "r1"}
    traffic, rolled = _reconcile(0, rolled, "r2", "r2", {"r1", "r2"})
    assert [(t["revisionName"], t["percent"]) for t in traffic] == [("r2", 0), ("r2", 100)]
    assert rolled["latest"] == "r1"
    traffic, rolled = _reconcile(0, rolled, "r2", "r2", {"r1", "r2"})
    assert [(t["tag"], t["revisionName"], t["percent"]) for t in traffic] == [("latest", "r2", 0),
                                                                                ("prev", "r1", 100)]


def test_a_route_waits_for_a_named_revision_that_is_not_ready():
    assert route_traffic([{"revisionName": "r9", "latestRevision": False, "percent": 100}], "r1", {"r1"},
                         "isvc-predictor", "ns") is None
    assert route_traffic([{"latestRevision": True, "percent": 100}], "", set(), "isvc-predictor", "ns") is None
