"""The operator API stand-in's printing (support.kube_operator) against upstream's own cases: apimachinery's
HumanDuration tests (kubernetes v1.32.0 staging/src/k8s.io/apimachinery/pkg/util/duration/duration_test.go,
TestHumanDuration and TestHumanDurationBoundaries), KServe's printer columns on the status the KServe stand-in
reports, and the selectors kubectl sends. The whole server runs under the real kubectl in
tests/e2e/test_kserve_container.py."""

from __future__ import annotations

import json
import time

import pytest
from support.k8s_standin import KubernetesStandin
from support.kube_operator import (ISVC_COLUMNS, OperatorAPI, SelectorError, _event_cells, human_duration,
                                  jsonpath_first, matches)

from pipeline.kserve_deploy.manifest import inference_service

S, M, H = 1.0, 60.0, 3600.0
D, Y = 24 * H, 365 * 24 * H
MS = 0.001

#: TestHumanDuration and TestHumanDurationBoundaries, in seconds (1 ns as the smallest step upstream uses).
UPSTREAM = [
    (S, "1s"), (70 * S, "70s"), (190 * S, "3m10s"), (70 * M, "70m"), (47 * H, "47h"), (49 * H, "2d1h"),
    ((8 * 24 + 2) * H, "8d"), (367 * D, "367d"), ((365 * 2 * 24 + 25) * H, "2y1d"), ((365 * 8 * 24 + 2) * H, "8y"),
    (-2 * S, "<invalid>"), (-2 * S + 1e-9, "0s"), (0, "0s"), (S - MS, "0s"), (2 * M - MS, "119s"), (2 * M, "2m"),
    (2 * M + S, "2m1s"), (10 * M - MS, "9m59s"), (10 * M, "10m"), (10 * M + S, "10m"), (3 * H - MS, "179m"),
    (3 * H, "3h"), (3 * H + M, "3h1m"), (8 * H - MS, "7h59m"), (8 * H, "8h"), (8 * H + 59 * M, "8h"),
    (2 * D - MS, "47h"), (2 * D, "2d"), (2 * D + H, "2d1h"), (8 * D - MS, "7d23h"), (8 * D, "8d"),
    (8 * D + 23 * H, "8d"), (2 * Y - MS, "729d"), (2 * Y, "2y"), (2 * Y + 23 * H, "2y"),
    (2 * Y + 23 * H + 59 * M, "2y"), (2 * Y + D - MS, "2y"), (2 * Y + D, "2y1d"), (3 * Y, "3y"), (4 * Y, "4y"),
    (5 * Y, "5y"), (6 * Y, "6y"), (7 * Y, "7y"), (8 * Y - MS, "7y364d"), (8 * Y, "8y"), (8 * Y + 364 * D, "8y"),
    (9 * Y, "9y"),
]


@pytest.mark.parametrize("seconds, want", UPSTREAM)
def test_human_duration_is_apimachinerys(seconds, want):
    assert human_duration(seconds) == want


def test_selectors_as_kubectl_sends_them():
    labels = {"serving.kserve.io/inferenceservice": "embedding", "component": "predictor"}
    assert matches(labels, "serving.kserve.io/inferenceservice=embedding")
    assert matches(labels, "serving.kserve.io/inferenceservice==embedding,component=predictor")
    assert not matches(labels, "serving.kserve.io/inferenceservice=other")
    assert matches(labels, "component!=transformer") and not matches(labels, "component!=predictor")
    assert matches(labels, "")


def test_kserve_printer_columns_on_a_canary_split():
    """The InferenceService's columns, evaluated as the CRD's JSONPaths on the status the KServe stand-in reports:
    a ready first revision takes all the traffic; with canaryTrafficPercent 20 a second one takes 20 and the
    previous one (tagged prev) 80."""
    standin = KubernetesStandin()
    manifest = inference_service("embedding", "models", "s3://models/embedding/1.0/", "v1", "embedding", "1.0")
    path = "/apis/serving.kserve.io/v1beta1/namespaces/models/inferenceservices"
    auth = {"authorization": f"Bearer {standin.token}", "content-type": "application/merge-patch+json"}
    assert standin.handle("POST", path, auth, json.dumps(manifest).encode())[0] == 201
    table = OperatorAPI(standin)._table("inferenceservices", [standin.isvc("models", "embedding")], {})
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", *[n for n, _, _ in ISVC_COLUMNS]]
    cells = dict(zip(names, table["rows"][0]["cells"]))
    assert (cells["Ready"], cells["Latest"], cells["Prev"]) == ("True", 100, None)
    assert cells["LatestReadyRevision"] == "embedding-predictor-00001" and cells["Age"].endswith("s")
    patch = {"spec": {"predictor": {"canaryTrafficPercent": 20, "model": {"storageUri": "s3://models/e/2.0/"}}}}
    assert standin.handle("PATCH", f"{path}/embedding", auth, json.dumps(patch).encode())[0] == 200
    isvc = standin.isvc("models", "embedding")
    cells = dict(zip(names, OperatorAPI(standin)._table("inferenceservices", [isvc], {})["rows"][0]["cells"]))
    assert (cells["Latest"], cells["Prev"]) == (20, 80)
    assert (cells["LatestReadyRevision"], cells["PrevRolledoutRevision"]) == ("embedding-predictor-00002",
                                                                              "embedding-predictor-00001")
    assert jsonpath_first(isvc, ".status.conditions[?(@.type=='Nope')].status") is None


def test_event_rows_as_print_event_prints_them():
    """printEvent's cells: the last seen time alone (the `(xN over ...)` form is kubectl describe's), the count as
    a number; an events.k8s.io event (the scheduler's) dated by its eventTime, its source its reporting component."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    involved = {"kind": "Pod", "name": "p", "namespace": "models", "fieldPath": "spec.containers{kserve-container}"}
    kubelet = {"metadata": {"name": "p.1"}, "involvedObject": involved, "type": "Normal", "reason": "Started",
               "message": "Started container kserve-container ", "count": 2, "source": {"component": "kubelet",
                                                                                         "host": "node"},
               "firstTimestamp": now, "lastTimestamp": now}
    assert _event_cells(kubelet) == ["0s", "Normal", "Started", "pod/p", "spec.containers{kserve-container}",
                                     "kubelet, node", "Started container kserve-container", "0s", 2, "p.1"]
    scheduler = {**kubelet, "reason": "Scheduled", "count": 0, "source": {}, "firstTimestamp": None,
                 "lastTimestamp": None, "eventTime": now, "reportingComponent": "default-scheduler",
                 "involvedObject": {**involved, "fieldPath": ""}}
    cells = _event_cells(scheduler)
    assert (cells[0], cells[5], cells[7], cells[8]) == ("0s", "default-scheduler", "0s", 1)


def test_an_unparsable_selector_is_refused_not_ignored():
    with pytest.raises(SelectorError):
        matches({"a": "b"}, "a in (b,c)")
    with pytest.raises(SelectorError):
        matches({"a": "b"}, "!a")
