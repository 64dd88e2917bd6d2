"""tests/support/kserve_compose.py against upstream's own test cases for each function it emulates.

- KServe's TestMergeRuntimeContainers (pkg/controller/v1beta1/inferenceservice/utils/utils_test.go; the one case,
  "BasicMerge", is the same at v0.13.1, v0.14.1, v0.15.2 and v0.16.0);
- apimachinery's strategic merge patch cases (pkg/util/strategicpatch/patch_test.go at v0.28.4,
  strategicMergePatchRawTestCases, schema MergeItem): the patches upstream applies in TestStrategicMergePatch,
  the two-way patch to Original and the three-way patch to Current;
- Knative's TestContainerValidation (pkg/apis/serving/k8s_validation_test.go at v0.39.3; the same cases at
  v0.44.0) for the port and probe rules, and TestMakePodSpec / TestMakeQueueContainer
  (pkg/reconciler/revision/resources/deploy_test.go, queue_test.go at v0.39.3) for which port each probe calls;
- Kubernetes' one-handler-per-probe and port-name rules (pkg/apis/core/validation/validation.go validateHandler,
  validateContainerPorts), on cases written here (upstream's own cases for them were not read).

Then every InferenceService the pipeline writes, merged with the shipped ClusterServingRuntime, through them all.

Inputs and expected outputs are transcribed as data; nothing of upstream's code is.
"""

from __future__ import annotations

import pytest
import yaml
from support.kserve_compose import (CONTAINER, KNATIVE, KSERVE_RELEASES, MODES, RAW, Field, Port, Probe,
                                    StrategicMergeError, compose, core_container_errors, executed_probes,
                                    knative_container_errors, knative_deployment_container, merge_runtime_containers,
                                    pod_errors, serving_port, strategic_merge_patch)

from pipeline.kserve_deploy import GRPC_PROTOCOL, PROTOCOLS, cluster_runtime, inference_service
from pipeline.networkpolicy import network_policy
from serving.runtimes import DEFAULT_SERVING_RUNTIME, SERVING_RUNTIMES

# ---------------------------------------------------------------- KServe: MergeRuntimeContainers


def test_kserve_merge_runtime_containers_basic_merge():
    """utils_test.go TestMergeRuntimeContainers "BasicMerge": env merged by name (the runtime's order kept, the new
    one appended), resources merged key by key, args concatenated, the runtime's name and image kept."""
    runtime = {"name": "kserve-container", "image": "default-image", "args": ["--foo=bar", "--test=dummy"],
               "env": [{"name": "PORT", "value": "8080"}, {"name": "PORT2", "value": "8081"}],
               "resources": {"limits": {"cpu": "1", "memory": "2Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}}}
    predictor = {"args": ["--new-arg=baz"],
                 "env": [{"name": "PORT2", "value": "8082"}, {"name": "Some", "value": "Var"}],
                 "resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}
    assert merge_runtime_containers(runtime, predictor) == {
        "name": "kserve-container", "image": "default-image", "args": ["--foo=bar", "--test=dummy", "--new-arg=baz"],
        "env": [{"name": "PORT", "value": "8080"}, {"name": "PORT2", "value": "8082"},
                {"name": "Some", "value": "Var"}],
        "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}}}


def test_a_runtime_and_a_predictor_that_both_declare_ports_and_probes_merge_into_an_invalid_pod():
    """The composition issue #37 describes, on a synthetic runtime: ports merge by containerPort (the predictor's
    new one first, as normalizeElementOrder puts a patch item absent from the live list), probes merge field by
    field into two handlers. Kubernetes refuses the probes, Knative the ports too."""
    runtime = {"name": "kserve-container", "image": "img", "ports": [{"name": "http1", "containerPort": 8080}],
               "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 2}}
    predictor = {"ports": [{"name": "h2c", "containerPort": 8081}],
                 "readinessProbe": {"tcpSocket": {"port": 8081}, "periodSeconds": 5}}
    merged = merge_runtime_containers(runtime, predictor)
    assert merged["ports"] == [{"name": "h2c", "containerPort": 8081}, {"name": "http1", "containerPort": 8080}]
    assert merged["readinessProbe"] == {"httpGet": {"path": "/ready", "port": 8080}, "tcpSocket": {"port": 8081},
                                        "periodSeconds": 5}
    assert core_container_errors(merged) == [
        "spec.containers[0].readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type"]
    knative = pod_errors(merged, KNATIVE)
    assert any("more than one container port is set" in e for e in knative)
    assert any(e.startswith("readinessProbe: expected exactly one, got both") for e in knative)


def test_zero_values_and_an_unnamed_predictor_follow_go_json():
    """json.Marshal leaves out omitempty zero values, so a predictor cannot zero a runtime's probe timing; `name`
    has no omitempty, so the merge writes "" and MergeRuntimeContainers puts the runtime's name back."""
    runtime = {"name": "kserve-container", "image": "img", "livenessProbe": {"tcpSocket": {"port": 8080},
                                                                              "initialDelaySeconds": 20}}
    merged = merge_runtime_containers(runtime, {"livenessProbe": {"initialDelaySeconds": 0}, "ports": []})
    assert merged == {"name": "kserve-container", "image": "img", "resources": {},
                      "livenessProbe": {"tcpSocket": {"port": 8080}, "initialDelaySeconds": 20}}


# ---------------------------------------------------------------- apimachinery: strategic merge patch

#: patch_test.go's MergeItem and RetainKeysMergeItem as patch metadata (their struct tags).
MERGE_ITEM: dict[str, Field] = {}
RETAIN_KEYS_ITEM: dict[str, Field] = {}
MERGE_ITEM.update({
    "mergingList": Field(("merge",), "name", MERGE_ITEM), "nonMergingList": Field((), "", MERGE_ITEM),
    "mergingIntList": Field(("merge",)), "mergeItemPtr": Field(("merge",), "name", MERGE_ITEM),
    "replacingItem": Field(("replace",)), "retainKeysMap": Field(("retainKeys",), "", RETAIN_KEYS_ITEM),
    "retainKeysMergingList": Field(("merge", "retainKeys"), "name", MERGE_ITEM)})
RETAIN_KEYS_ITEM.update({"mergingIntList": Field(("merge",)), "mergingList": Field(("merge",), "name", MERGE_ITEM),
                         "nonMergingList": Field((), "", MERGE_ITEM)})

#: (description, Original, TwoWay, Modified or TwoWayResult, Current, ThreeWay, Result) of
#: strategicMergePatchRawTestCases: the cases on merging lists of maps (how ports, env and volumeMounts merge),
#: non-merging lists (how args and command are replaced), nested maps and scalar lists. Not emulated, so left out:
#: "add map and delete map from merging list" (three-way, with and without conflict), whose expected order comes
#: from Go slice aliasing after a `$patch: delete` inside mergePatchIntoOriginal; KServe's patches carry no
#: directives. Of the 92 raw cases this file's first draft ran, the other 90 passed in both directions.
SMP_CASES = [
    ('merge lists of maps',
     {'mergingList': [{'name': 1}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 4}, {'name': 1}, {'name': 2}, {'name': 3}],
      'mergingList': [{'name': 4, 'value': 4}, {'name': 3, 'value': 3}]},
     {'mergingList': [{'name': 4, 'value': 4}, {'name': 1}, {'name': 2, 'value': 2}, {'name': 3, 'value': 3}]},
     {'mergingList': [{'name': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 4}, {'name': 1}, {'name': 2}, {'name': 3}],
      'mergingList': [{'name': 4, 'value': 4}, {'name': 3, 'value': 3}]},
     {'mergingList': [{'name': 4, 'value': 4},
                      {'name': 1, 'other': 'a'},
                      {'name': 2, 'value': 2, 'other': 'b'},
                      {'name': 3, 'value': 3}]}),
    ('merge lists of maps with conflict',
     {'mergingList': [{'name': 1}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}, {'name': 3}],
      'mergingList': [{'name': 3, 'value': 3}]},
     {'mergingList': [{'name': 1}, {'name': 2, 'value': 2}, {'name': 3, 'value': 3}]},
     {'mergingList': [{'name': 1, 'other': 'a'}, {'name': 2, 'value': 3, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}, {'name': 3}],
      'mergingList': [{'name': 2, 'value': 2}, {'name': 3, 'value': 3}]},
     {'mergingList': [{'name': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}, {'name': 3, 'value': 3}]}),
    ('add field to map in merging list with conflict',
     {'mergingList': [{'name': 1}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}], 'mergingList': [{'name': 1, 'value': 1}]},
     {'mergingList': [{'name': 1, 'value': 1}, {'name': 2, 'value': 2}]},
     {'mergingList': [{'name': 1, 'other': 'a'}, {'name': 3, 'value': 2, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}],
      'mergingList': [{'name': 1, 'value': 1}, {'name': 2, 'value': 2}]},
     {'mergingList': [{'name': 1, 'value': 1, 'other': 'a'},
                      {'name': 2, 'value': 2},
                      {'name': 3, 'value': 2, 'other': 'b'}]}),
    ('add an item that already exists in current object in merging list',
     {'mergingList': [{'name': 1, 'value': 'a'}, {'name': 2}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}, {'name': 3}], 'mergingList': [{'name': 3}]},
     {'mergingList': [{'name': 1, 'value': 'a'}, {'name': 2}, {'name': 3}]},
     {'mergingList': [{'name': 1, 'value': 'a', 'other': 'x'}, {'name': 2}, {'name': 3}]},
     {},
     {'mergingList': [{'name': 1, 'value': 'a', 'other': 'x'}, {'name': 2}, {'name': 3}]}),
    ('replace map field value in merging list',
     {'mergingList': [{'name': 1, 'value': 1}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}], 'mergingList': [{'name': 1, 'value': 'a'}]},
     {'mergingList': [{'name': 1, 'value': 'a'}, {'name': 2, 'value': 2}]},
     {'mergingList': [{'name': 1, 'value': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}], 'mergingList': [{'name': 1, 'value': 'a'}]},
     {'mergingList': [{'name': 1, 'value': 'a', 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]}),
    ('delete map from merging list',
     {'mergingList': [{'name': 1}, {'name': 2}]},
     {'$setElementOrder/mergingList': [{'name': 2}], 'mergingList': [{'name': 1, '$patch': 'delete'}]},
     {'mergingList': [{'name': 2}]},
     {'mergingList': [{'name': 1}, {'name': 2, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 2}], 'mergingList': [{'name': 1, '$patch': 'delete'}]},
     {'mergingList': [{'name': 2, 'other': 'b'}]}),
    ('delete field from map in merging list',
     {'mergingList': [{'name': 1, 'value': 1}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}], 'mergingList': [{'name': 1, 'value': None}]},
     {'mergingList': [{'name': 1}, {'name': 2, 'value': 2}]},
     {'mergingList': [{'name': 1, 'value': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}], 'mergingList': [{'name': 1, 'value': None}]},
     {'mergingList': [{'name': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]}),
    ('replace non merging list nested in merging list',
     {'mergingList': [{'name': 1, 'nonMergingList': [{'name': 1}, {'name': 2, 'value': 2}]}, {'name': 2}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}],
      'mergingList': [{'name': 1, 'nonMergingList': [{'name': 1, 'value': 1}]}]},
     {'mergingList': [{'name': 1, 'nonMergingList': [{'name': 1, 'value': 1}]}, {'name': 2}]},
     {'mergingList': [{'name': 1, 'other': 'a', 'nonMergingList': [{'name': 1}, {'name': 2, 'value': 2}]},
                      {'name': 2, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}],
      'mergingList': [{'name': 1, 'nonMergingList': [{'name': 1, 'value': 1}]}]},
     {'mergingList': [{'name': 1, 'other': 'a', 'nonMergingList': [{'name': 1, 'value': 1}]},
                      {'name': 2, 'other': 'b'}]}),
    ('add field to map in merging list nested in merging list',
     {'mergingList': [{'name': 1, 'mergingList': [{'name': 1}, {'name': 2, 'value': 2}]}, {'name': 2}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}],
      'mergingList': [{'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}],
                       'name': 1,
                       'mergingList': [{'name': 1, 'value': 1}]}]},
     {'mergingList': [{'name': 1, 'mergingList': [{'name': 1, 'value': 1}, {'name': 2, 'value': 2}]},
                      {'name': 2}]},
     {'mergingList': [{'name': 1, 'other': 'a', 'mergingList': [{'name': 1}, {'name': 2, 'value': 2}]},
                      {'name': 2, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}],
      'mergingList': [{'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}],
                       'name': 1,
                       'mergingList': [{'name': 1, 'value': 1}]}]},
     {'mergingList': [{'name': 1,
                       'other': 'a',
                       'mergingList': [{'name': 1, 'value': 1}, {'name': 2, 'value': 2}]},
                      {'name': 2, 'other': 'b'}]}),
    ('add map to merging list by pointer',
     {'mergeItemPtr': [{'name': 1}]},
     {'$setElementOrder/mergeItemPtr': [{'name': 1}, {'name': 2}], 'mergeItemPtr': [{'name': 2}]},
     {'mergeItemPtr': [{'name': 1}, {'name': 2}]},
     {'mergeItemPtr': [{'name': 1, 'other': 'a'}, {'name': 3}]},
     {'$setElementOrder/mergeItemPtr': [{'name': 1}, {'name': 2}], 'mergeItemPtr': [{'name': 2}]},
     {'mergeItemPtr': [{'name': 1, 'other': 'a'}, {'name': 2}, {'name': 3}]}),
    ('merge lists of scalars',
     {'mergingIntList': [1, 2]},
     {'$setElementOrder/mergingIntList': [1, 2, 3], 'mergingIntList': [3]},
     {'mergingIntList': [1, 2, 3]},
     {'mergingIntList': [1, 2, 4]},
     {'$setElementOrder/mergingIntList': [1, 2, 3], 'mergingIntList': [3]},
     {'mergingIntList': [1, 2, 3, 4]}),
    ('add an item in a list and preserve order',
     {'mergingList': [{'name': 1}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 3}, {'name': 1}, {'name': 2}],
      'mergingList': [{'name': 3, 'value': 3}]},
     {'mergingList': [{'name': 3, 'value': 3}, {'name': 1}, {'name': 2, 'value': 2}]},
     {'mergingList': [{'name': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]},
     {'$setElementOrder/mergingList': [{'name': 3}, {'name': 1}, {'name': 2}],
      'mergingList': [{'name': 3, 'value': 3}]},
     {'mergingList': [{'name': 3, 'value': 3}, {'name': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]}),
    ('change an item in a list and preserve order',
     {'mergingList': [{'name': 1}, {'name': 3, 'value': 3}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 2}, {'name': 3}, {'name': 1}],
      'mergingList': [{'name': 3, 'value': 'x'}]},
     {'mergingList': [{'name': 2, 'value': 2}, {'name': 3, 'value': 'x'}, {'name': 1}]},
     {'mergingList': [{'name': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}, {'name': 3, 'value': 3}]},
     {'$setElementOrder/mergingList': [{'name': 2}, {'name': 3}, {'name': 1}],
      'mergingList': [{'name': 3, 'value': 'x'}]},
     {'mergingList': [{'name': 2, 'value': 2, 'other': 'b'},
                      {'name': 3, 'value': 'x'},
                      {'name': 1, 'other': 'a'}]}),
    ('set elements order in a list with server-only items',
     {'mergingList': [{'name': 1}, {'name': 3, 'value': 3}, {'name': 4, 'value': 4}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 4}, {'name': 2}, {'name': 3}, {'name': 1}]},
     {'mergingList': [{'name': 4, 'value': 4}, {'name': 2, 'value': 2}, {'name': 3, 'value': 3}, {'name': 1}]},
     {'mergingList': [{'name': 1, 'other': 'a'},
                      {'name': 3, 'value': 3},
                      {'name': 4, 'value': 4},
                      {'name': 2, 'value': 2},
                      {'name': 9}]},
     {'$setElementOrder/mergingList': [{'name': 4}, {'name': 2}, {'name': 3}, {'name': 1}]},
     {'mergingList': [{'name': 4, 'value': 4},
                      {'name': 2, 'value': 2},
                      {'name': 3, 'value': 3},
                      {'name': 1, 'other': 'a'},
                      {'name': 9}]}),
    ('nested patch merge with empty list',
     {'name': 'hi'},
     {'mergingList': [{'name': 'hello'}, {'$patch': 'delete', 'name': 'doesntexist'}]},
     {'name': 'hi', 'mergingList': [{'name': 'hello'}]},
     {'name': 'hi', 'mergingList': [{'name': 'hello2'}]},
     {'$setElementOrder/mergingList': [{'name': 'hello'}, {'name': 'doesntexist'}],
      'mergingList': [{'name': 'hello'}]},
     {'name': 'hi', 'mergingList': [{'name': 'hello'}, {'name': 'hello2'}]}),
    ('add duplicate field to map in merging list',
     {'mergingList': [{'name': 1}, {'name': 2, 'value': 2}]},
     {'$setElementOrder/mergingList': [{'name': 1}, {'name': 2}], 'mergingList': [{'name': 1, 'value': 1}]},
     {'mergingList': [{'name': 1, 'value': 1}, {'name': 2, 'value': 2}]},
     {'mergingList': [{'name': 1, 'value': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]},
     {},
     {'mergingList': [{'name': 1, 'value': 1, 'other': 'a'}, {'name': 2, 'value': 2, 'other': 'b'}]}),
]


@pytest.mark.parametrize("case", SMP_CASES, ids=[c[0] for c in SMP_CASES])
def test_apimachinery_strategic_merge_patch_cases(case):
    _, original, two_way, modified, current, three_way, result = case
    assert strategic_merge_patch(original, two_way, MERGE_ITEM) == modified
    assert strategic_merge_patch(current, three_way, MERGE_ITEM) == result


def test_strategic_merge_patch_leaves_its_arguments_alone():
    original, patch = {"mergingList": [{"name": 1}]}, {"mergingList": [{"name": 2}]}
    assert strategic_merge_patch(original, patch, MERGE_ITEM) == {"mergingList": [{"name": 2}, {"name": 1}]}
    assert original == {"mergingList": [{"name": 1}]} and patch == {"mergingList": [{"name": 2}]}


@pytest.mark.parametrize("original, patch, message", [
    ({"mergingList": [{"name": 0}]}, {"mergingList": [{"value": 1}]}, "does not contain declared merge key: name"),
    ({"mergingList": [{"name": 0}]}, {"mergingList": [{"name": 1, "$patch": "merge"}]},
     "merging lists cannot yet be specified"),
    ({"mergingIntList": [[0]]}, {"mergingIntList": [[1]]}, "lists of lists"),
    ({"mergingIntList": [0]}, {"mergingIntList": ["1"]}, "list element types are not identical"),
])
def test_strategic_merge_patch_refuses_what_apimachinery_refuses(original, patch, message):
    with pytest.raises(StrategicMergeError, match=message):
        strategic_merge_patch(original, patch, MERGE_ITEM)


def test_container_lists_merge_by_their_keys_and_the_rest_is_replaced():
    """core/v1 Container: ports by containerPort, env by name, volumeMounts by mountPath; command and args (no
    strategy) replaced; nested maps merged key by key."""
    runtime = {"command": ["a"], "ports": [{"containerPort": 1, "name": "x"}], "env": [{"name": "A", "value": "1"}],
               "volumeMounts": [{"mountPath": "/m", "name": "v"}], "securityContext": {"runAsUser": 1, "x": 2}}
    patch = {"command": ["b"], "ports": [{"containerPort": 1, "protocol": "TCP"}], "env": [{"name": "A", "value": "2"}],
             "volumeMounts": [{"mountPath": "/n", "name": "w"}], "securityContext": {"runAsUser": 3}}
    assert strategic_merge_patch(runtime, patch, CONTAINER) == {
        "command": ["b"], "ports": [{"containerPort": 1, "name": "x", "protocol": "TCP"}],
        "env": [{"name": "A", "value": "2"}],
        "volumeMounts": [{"mountPath": "/n", "name": "w"}, {"mountPath": "/m", "name": "v"}],
        "securityContext": {"runAsUser": 3, "x": 2}}


# ---------------------------------------------------------------- Knative: the serving container's checks

#: (name, container, [(path, phrase)]) from k8s_validation_test.go TestContainerValidation: the cases on ports and
#: probes (errors of rules not emulated here, such as disallowed fields, are not part of any case kept).
KNATIVE_CASES = [
    ("has valid unnamed user port", {"image": "foo", "ports": [{"containerPort": 8181}]}, []),
    ("has valid user port http1", {"image": "foo", "ports": [{"name": "http1"}]}, []),
    ("has valid user port h2c", {"image": "foo", "ports": [{"name": "h2c"}]}, []),
    ("has more than one ports with valid names", {"image": "foo", "ports": [{"name": "h2c"}, {"name": "http1"}]},
     [("ports", "more than one container port is set")]),
    ("has an empty port set", {"image": "foo", "ports": [{}]}, []),
    ("has more than one unnamed port", {"image": "foo", "ports": [{"containerPort": 8080}, {"containerPort": 8181}]},
     [("ports", "more than one container port is set")]),
    ("has tcp protocol", {"image": "foo", "ports": [{"protocol": "TCP"}]}, []),
    ("has invalid protocol", {"image": "foo", "ports": [{"protocol": "tdp"}]}, [("ports.protocol", "invalid value")]),
    ("has host port", {"image": "foo", "ports": [{"hostPort": 80}]}, [("ports.hostPort", "must not set")]),
    ("has invalid port name", {"image": "foo", "ports": [{"name": "foobar"}]},
     [("ports", "Port name foobar is not allowed")]),
    ("invalid with no handler", {"image": "foo", "readinessProbe": {
        "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
        "httpGet": {"path": "/"}}, "livenessProbe": {}}, [("livenessProbe", "expected exactly one, got neither")]),
    ("invalid with multiple handlers", {"image": "foo", "readinessProbe": {
        "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
        "httpGet": {"path": "/"}, "exec": {}, "tcpSocket": {}}},
     [("readinessProbe", "expected exactly one, got both")]),
    ("valid liveness http probe with a different container port", {"image": "foo", "livenessProbe": {
        "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
        "httpGet": {"path": "/", "port": 5000}}}, []),
    ("valid liveness tcp probe with a different container port", {"image": "foo", "livenessProbe": {
        "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
        "tcpSocket": {"port": 5000}}}, []),
    ("valid readiness http probe with a different container port", {"image": "foo", "readinessProbe": {
        "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
        "httpGet": {"path": "/", "port": 5000}}}, []),
    ("valid readiness tcp probe with a different container port", {"image": "foo", "readinessProbe": {
        "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
        "tcpSocket": {"port": 5000}}}, []),
    ("valid readiness http probe with port", {"image": "foo", "readinessProbe": {
        "successThreshold": 1, "httpGet": {"port": "http"}}}, []),
    ("invalid readiness probe (has failureThreshold while using special probe)", {"image": "foo", "readinessProbe": {
        "periodSeconds": 0, "failureThreshold": 2, "successThreshold": 1, "httpGet": {"path": "/"}}},
     [("readinessProbe.failureThreshold", "disallowed when periodSeconds is zero")]),
    ("invalid readiness probe (has timeoutSeconds while using special probe)", {"image": "foo", "readinessProbe": {
        "periodSeconds": 0, "timeoutSeconds": 2, "successThreshold": 1, "httpGet": {"path": "/"}}},
     [("readinessProbe.timeoutSeconds", "disallowed when periodSeconds is zero")]),
    ("out of bounds probe values", {"image": "foo", "readinessProbe": {
        "periodSeconds": -1, "timeoutSeconds": 0, "successThreshold": 0, "failureThreshold": 0,
        "initialDelaySeconds": -1, "httpGet": {}}},
     [("readinessProbe.periodSeconds", "expected 0 <= -1"), ("readinessProbe.timeoutSeconds", "expected 1 <= 0"),
      ("readinessProbe.successThreshold", "expected 1 <= 0"), ("readinessProbe.failureThreshold", "expected 1 <= 0"),
      ("readinessProbe.initialDelaySeconds", "expected 0 <= -1")]),
    ("invalid liveness tcp probe (has port)", {"image": "foo", "livenessProbe": {"tcpSocket": {"port": "imap"}}},
     [("livenessProbe.tcpSocket.port", "Probe port must match container port")]),
    ("valid liveness tcp probe with correct port", {"image": "foo", "ports": [{"containerPort": 8888}],
                                                    "livenessProbe": {"tcpSocket": {"port": 8888}}}, []),
    ("valid grpc probe", {"image": "foo", "readinessProbe": {
        "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3,
        "grpc": {"port": 46}}}, []),
    ("has container port value too large", {"image": "foo", "ports": [{"containerPort": 65536}]},
     [("ports.containerPort", "expected 0 <= 65536 <= 65535")]),
    *[(f"port conflicts with {port}", {"image": "foo", "ports": [{"containerPort": port}]},
       [("ports.containerPort", f"{port} is a reserved port")]) for port in (8008, 8013, 8012, 9090, 9091, 8022)],
]


@pytest.mark.parametrize("case", KNATIVE_CASES, ids=[c[0] for c in KNATIVE_CASES])
def test_knative_container_validation_cases(case):
    _, container, want = case
    errors = knative_container_errors(container)
    assert len(errors) == len(want), errors
    for path, phrase in want:
        assert any(e.startswith(f"{path}:") and phrase in e for e in errors), (path, phrase, errors)


#: (name, serving container, {probe kind: (handler, port, path)}) from deploy_test.go TestMakePodSpec and
#: queue_test.go TestMakeQueueContainer: the queue-proxy runs the readiness probe at the port the probe names by
#: number (its SERVING_READINESS_PROBE), the kubelet the liveness probe at the serving port.
KNATIVE_PROBE_CASES = [
    ("with http readiness probe", {"image": "busybox", "readinessProbe": {"httpGet": {"path": "/", "port": 8080}}},
     {"readinessProbe": ("httpGet", 8080, "/")}),
    ("with grpc readiness probe", {"image": "busybox", "readinessProbe": {"grpc": {"port": 8080}}},
     {"readinessProbe": ("grpc", 8080, "")}),
    ("with tcp readiness probe", {"image": "busybox", "readinessProbe": {"tcpSocket": {"port": 12345}}},
     {"readinessProbe": ("tcpSocket", 12345, "")}),
    ("with HTTP liveness probe", {"image": "busybox", "readinessProbe": {"tcpSocket": {"port": 8080}},
                                  "livenessProbe": {"httpGet": {"path": "/"}}},
     {"readinessProbe": ("tcpSocket", 8080, ""), "livenessProbe": ("httpGet", 8080, "/")}),
    ("with tcp liveness probe", {"image": "busybox", "readinessProbe": {"tcpSocket": {"port": 8080}},
                                 "livenessProbe": {"tcpSocket": {}}},
     {"readinessProbe": ("tcpSocket", 8080, ""), "livenessProbe": ("tcpSocket", 8080, "")}),
    ("custom readiness probe port", {"image": "busybox", "ports": [{"containerPort": 1955, "name": "h2c"}],
                                     "readinessProbe": {"tcpSocket": {"host": "127.0.0.1", "port": 8087}}},
     {"readinessProbe": ("tcpSocket", 8087, "")}),
]


@pytest.mark.parametrize("case", KNATIVE_PROBE_CASES, ids=[c[0] for c in KNATIVE_PROBE_CASES])
def test_knative_runs_each_probe_where_upstream_does(case):
    _, container, want = case
    assert executed_probes(container, KNATIVE) == {kind: Probe(*p) for kind, p in want.items()}


def test_knative_keeps_an_exec_readiness_probe_with_the_kubelet_and_rewrites_liveness_ports():
    """deploy_test.go "with shell readiness probe": the exec probe stays on the user container; an HTTP liveness
    probe on another port is pointed at the serving port (rewriteUserProbe)."""
    container = {"image": "busybox", "ports": [{"name": "h2c", "containerPort": 8081}],
                 "readinessProbe": {"exec": {"command": ["echo", "hello"]}},
                 "livenessProbe": {"httpGet": {"path": "/live", "port": 8080}}}
    deployed = knative_deployment_container(container)
    assert deployed["readinessProbe"] == {"exec": {"command": ["echo", "hello"]}}
    assert deployed["livenessProbe"] == {"httpGet": {"path": "/live", "port": 8081}}
    assert deployed["ports"] == [{"name": "user-port", "containerPort": 8081, "protocol": "TCP"}]
    assert serving_port(container, KNATIVE) == Port(8081, "h2c", True)


# ---------------------------------------------------------------- Kubernetes and KServe raw mode

@pytest.mark.parametrize("probe, errors", [
    ({"httpGet": {"path": "/", "port": 8080}}, []),
    ({"httpGet": {"path": "/", "port": 8080}, "tcpSocket": {"port": 8081}},
     ["spec.containers[0].livenessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type"]),
    ({"exec": {"command": ["true"]}, "grpc": {"port": 1}, "tcpSocket": {"port": 2}},
     ["spec.containers[0].livenessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type",
      "spec.containers[0].livenessProbe.grpc: Forbidden: may not specify more than 1 handler type"]),
    ({"periodSeconds": 5}, ["spec.containers[0].livenessProbe: Required value: must specify a handler type"]),
    ({"tcpSocket": {"port": 70000}}, ["spec.containers[0].livenessProbe.tcpSocket.port: Invalid value: 70000: must "
                                      "be between 1 and 65535"]),
    ({"tcpSocket": {"port": "h2c"}, "successThreshold": 2},
     ["spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1"]),
])
def test_kubernetes_allows_one_handler_per_probe(probe, errors):
    assert core_container_errors({"name": "c", "image": "i", "livenessProbe": probe}) == errors


def test_kubernetes_port_names_are_unique_iana_names():
    ports = [{"name": "h2c", "containerPort": 8081}, {"name": "h2c", "containerPort": 8082},
             {"name": "Bad_Name", "containerPort": 1}, {"containerPort": 0, "protocol": "HTTP"}]
    assert core_container_errors({"name": "c", "image": "i", "ports": ports}) == [
        "spec.containers[0].ports[1].name: Duplicate value: 'h2c'",
        "spec.containers[0].ports[2].name: Invalid value: 'Bad_Name'",
        "spec.containers[0].ports[3].containerPort: Required value",
        "spec.containers[0].ports[3].protocol: Unsupported value: 'HTTP'"]


def test_raw_mode_defaults_a_tcp_readiness_probe_and_targets_the_first_port():
    """KServe raw mode: deployment_reconciler.go setDefaultPodSpec probes the first port (8080 without one) when the
    container has no readiness probe; service_reconciler.go targets the first port, as h2c from 0.15 on when its
    name says so."""
    bare = {"name": "kserve-container", "image": "i"}
    assert executed_probes(bare, RAW) == {"readinessProbe": Probe("tcpSocket", 8080)}
    grpc = {**bare, "ports": [{"name": "h2c", "containerPort": 8081}, {"name": "http1", "containerPort": 8080}]}
    assert executed_probes(grpc, RAW) == {"readinessProbe": Probe("tcpSocket", 8081)}
    assert serving_port(grpc, RAW, KSERVE_RELEASES[0]) == Port(8081, "h2c", False)  # 0.13: no appProtocol
    assert serving_port(grpc, RAW, KSERVE_RELEASES[-1]) == Port(8081, "h2c", True)
    assert serving_port(bare, RAW) == Port(8080, "", False)


# ---------------------------------------------------------------- the project's manifests, composed

#: serving.kserve_runtime's listeners, named by its flags (serving/kserve_runtime/cli.py): REST (HTTP/1.1: the
#: KServe v1 and v2 paths and the probes' /v2/health/live and /v2/health/ready) and Open Inference gRPC.
LISTENER_FLAGS = {"--http-port": "http", "--grpc-port": "grpc"}
#: What the gateway answers 200 only while a worker of the model is READY (serving/gateway/app.py
#: ready -> serving/kserve_runtime/torchserve.py ready).
MODEL_LOADED_PATH = "/v2/health/ready"
#: Knative's queue-proxy ports (knative.dev/networking BackendHTTPPort, BackendHTTP2Port): where requests reach a
#: serverless pod before the queue-proxy calls the serving port over the pod's loopback.
QUEUE_PROXY_HTTP, QUEUE_PROXY_H2C = 8012, 8013


#: Each serving runtime's shipped ClusterServingRuntime (serving.runtimes.SERVING_RUNTIMES): both go through every
#: check.
RUNTIMES = tuple(SERVING_RUNTIMES)


def shipped_runtime(runtime: str = DEFAULT_SERVING_RUNTIME) -> dict:
    (doc,) = [d for d in yaml.safe_load_all(SERVING_RUNTIMES[runtime].manifest.read_text()) if d]
    assert doc["metadata"]["name"] == SERVING_RUNTIMES[runtime].cluster_runtime
    return doc


def written(protocol: str, runtime: str = DEFAULT_SERVING_RUNTIME) -> dict:
    """The InferenceService the pipeline's deploy task writes for `protocol` and the serving runtime."""
    return inference_service("embedding", "models", "s3://models/embedding/1.0", protocol, "embedding", "1.0",
                             cluster_runtime(runtime))


def listeners(container: dict) -> dict[int, str]:
    """{port: "http" | "grpc"} the container's process listens on, read from its (merged) args."""
    out = {}
    for arg in container.get("args", []):
        flag, _, value = arg.partition("=")
        if flag in LISTENER_FLAGS:
            out[int(value)] = LISTENER_FLAGS[flag]
    return out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_runtime_declares_no_ports_and_no_probes_as_kserve_torchserve_does(runtime):
    """kserve/kserve config/runtimes/kserve-torchserve.yaml (v0.13.1, v0.15.2) declares neither: whatever a runtime
    declares, an InferenceService can only add to (ports merge by containerPort, probes field by field)."""
    (container,) = shipped_runtime(runtime)["spec"]["containers"]
    assert not {"ports", "readinessProbe", "livenessProbe", "startupProbe"} & set(container)
    assert set(listeners(container).values()) == {"http", "grpc"}


@pytest.mark.parametrize("release", KSERVE_RELEASES, ids=[f"kserve-{r.kserve}" for r in KSERVE_RELEASES])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_written_inference_service_composes_into_a_pod_that_is_ready_when_the_model_is(runtime, protocol, mode,
                                                                                               release):
    """The shipped ClusterServingRuntime merged with each InferenceService the pipeline writes, as KServe merges
    them, passes Knative's and Kubernetes' checks in both modes; requests reach the listener of the protocol
    (h2c-routed for gRPC under Knative), readiness calls the path that means the model is loaded, on the REST
    listener, and liveness calls something the pod answers on the port it really calls."""
    container = compose(shipped_runtime(runtime), written(protocol, runtime))
    assert pod_errors(container, mode) == []
    listening = listeners(container)
    port = serving_port(container, mode, release)
    assert listening.get(port.number) == ("grpc" if protocol == GRPC_PROTOCOL else "http")
    if mode == KNATIVE:
        assert port.h2c == (protocol == GRPC_PROTOCOL)
    probes = executed_probes(container, mode)
    ready = probes["readinessProbe"]
    assert (ready.handler, ready.path, listening.get(ready.port)) == ("httpGet", MODEL_LOADED_PATH, "http")
    live = probes["livenessProbe"]
    if live.handler == "httpGet":
        assert listening.get(live.port) == "http"
    else:
        assert live.handler == "tcpSocket" and live.port in listening


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_network_policy_lets_requests_reach_every_composed_predictor(runtime, protocol, mode):
    """deploy/kserve/networkpolicy.yaml opens, to the ingress path, the port each composed predictor is reached on:
    raw, the Service's target port; Knative, the queue-proxy's port for the protocol; and the runtime's metrics
    port to the monitoring namespace."""
    policy = network_policy()
    anyone = {p["port"] for rule in policy["spec"]["ingress"] if "from" not in rule for p in rule["ports"]}
    container = compose(shipped_runtime(runtime), written(protocol, runtime))
    port = serving_port(container, mode)
    reached_on = port.number if mode == RAW else QUEUE_PROXY_H2C if port.h2c else QUEUE_PROXY_HTTP
    assert reached_on in anyone
    metrics = int(shipped_runtime(runtime)["spec"]["annotations"]["prometheus.kserve.io/port"])
    monitoring = {p["port"] for rule in policy["spec"]["ingress"] for peer in rule.get("from", [])
                  if peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
                  == "monitoring" for p in rule["ports"]}
    assert metrics in monitoring
