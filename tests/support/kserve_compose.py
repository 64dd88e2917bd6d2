"""How KServe composes a predictor pod from a ServingRuntime and an InferenceService, and whether that pod can run.

KServe does not replace the runtime's container with the InferenceService's: it merges the two with Kubernetes'
strategic merge patch, then concatenates their args. What comes out must then pass Knative's webhook (serverless,
"Knative" from KServe 0.16) or Kubernetes' own validation of the Deployment KServe writes (RawDeployment,
"Standard" from 0.16). Each piece below is written from the upstream source at the tags Kubeflow ships, cited next
to it; tests/unit/test_kserve_compose.py checks each piece against upstream's own test cases for it.

- ``strategic_merge_patch``: the apply side of k8s.io/apimachinery's strategic merge patch (directives included), on
  a schema of patch strategies and merge keys (``Field``), like apimachinery's PatchMetaFromStruct;
- ``merge_runtime_containers`` / ``compose``: KServe's MergeRuntimeContainers and the predictor reconciler around
  it (which runtime container, which protocol);
- ``core_container_errors``: the Kubernetes API server's container checks that decide this composition (ports,
  one handler per probe, probe ports);
- ``knative_defaults`` / ``knative_container_errors`` / ``knative_deployment_container``: Knative Serving's
  revision defaulting, its webhook's container checks and the Deployment its revision reconciler writes;
- ``pod_errors``, ``serving_port`` and ``executed_probes``: per deployment mode, why the pod would be refused, where
  traffic reaches it, and which port and path each probe really calls.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------- the releases

RAW, KNATIVE = "raw", "knative"
MODES = (RAW, KNATIVE)


@dataclass(frozen=True)
class Release:
    """A KServe release and what its go.mod pins (read with `git show <tag>:go.mod` in kserve/kserve)."""

    kserve: str
    knative_serving: str
    k8s_api: str
    #: The deploymentMode annotation's names for RAW and KNATIVE in this release (0.16 renamed them and still
    #: accepts the old names: pkg/constants/constants.go at v0.16.0).
    mode_names: tuple[str, str] = ("RawDeployment", "Serverless")


#: KServe as the Kubeflow releases ship it (1.9.1: 0.13.1; 1.10.0: 0.14.1; 1.10.1/1.10.2: 0.15.0; 1.11: 0.15.2;
#: 26.03: 0.16.0). MergeRuntimeContainers is the same function at every one of these tags, and the Knative checks
#: emulated here read the same at knative.dev/serving v0.39.3, v0.42.2 and v0.44.0 (compared with git diff).
KSERVE_RELEASES = (
    Release("0.13.1", "0.39.3", "0.28.4"),
    Release("0.14.1", "0.42.2", "0.30.4"),
    Release("0.15.0", "0.44.0", "0.32.3"),
    Release("0.15.2", "0.44.0", "0.32.3"),
    Release("0.16.0", "0.44.0", "0.33.1", ("Standard", "Knative")),
)


# ---------------------------------------------------------------- strategic merge patch

class StrategicMergeError(ValueError):
    """A patch apimachinery would refuse to apply."""


@dataclass(frozen=True)
class Field:
    """The patch metadata of one field: Go's `patchStrategy` and `patchMergeKey` struct tags, and the schema of the
    field's value (of its items, for a list). A field without tags merges maps key by key and replaces lists."""

    strategies: tuple[str, ...] = ()
    merge_key: str = ""
    schema: dict[str, Field] | None = None


#: Schema = {json field name: Field}; a name not listed has no strategy (PatchMetaFromStruct would refuse it; the
#: JSON KServe patches with comes from typed structs, so every name it holds is a declared field).
Schema = dict[str, Field]

_DIRECTIVE, _DELETE, _REPLACE, _MERGE = "$patch", "delete", "replace", "merge"
_DELETE_FROM_PRIMITIVES, _RETAIN_KEYS, _SET_ORDER = "$deleteFromPrimitiveList", "$retainKeys", "$setElementOrder"
_RETAIN_KEYS_STRATEGY = "retainKeys"
#: Go's sort.SliceStable sorts blocks of this many with insertion sort before merging blocks (sort/zsortfunc.go
#: stable_func); every list merged here is shorter, so only that stage is emulated.
_GO_STABLE_BLOCK = 20


def strategic_merge_patch(original: dict, patch: dict, schema: Schema | None) -> dict:
    """`patch` applied to `original` as a strategic merge patch; neither argument is modified.

    Emulates k8s.io/apimachinery pkg/util/strategicpatch/patch.go (tags v0.28.4, v0.32.3 and v0.33.2, where
    the apply path is unchanged) StrategicMergePatch -> StrategicMergeMapPatchUsingLookupPatchMeta, whose merge
    options are MergeParallelList and IgnoreUnmatchedNulls.
    """
    if not isinstance(original, dict) or not isinstance(patch, dict):
        raise StrategicMergeError("original and patch must be JSON objects")
    return _merge_map(copy.deepcopy(original), copy.deepcopy(patch), schema)


def _field(schema: Schema | None, key: str) -> Field:
    return (schema or {}).get(key, Field())


def _strategy(field: Field) -> str:
    """The strategy besides retainKeys (patch.go extractRetainKeysPatchStrategy)."""
    others = [s for s in field.strategies if s != _RETAIN_KEYS_STRATEGY]
    if len(field.strategies) > 2 or len(others) > 1:
        raise StrategicMergeError(f"unexpected patch strategy: {list(field.strategies)}")
    return others[0] if others else ""


def _go_equal(a: Any, b: Any) -> bool:
    """Go's == on two interface{} values decoded from JSON: same dynamic type and value."""
    return type(a) is type(b) and a == b


def _go_key(value: Any) -> tuple:
    """A value as a Go map key of interface{} type (type and value)."""
    return type(value), value


def _merge_map(original: dict | None, patch: dict, schema: Schema | None) -> dict:
    """patch.go mergeMap (mutates both arguments, as upstream does)."""
    if _DIRECTIVE in patch:
        return _map_directive(patch[_DIRECTIVE], patch)
    original = {} if original is None else original
    _apply_retain_keys(original, patch)
    _merge_set_element_order(original, patch, schema)
    for key, value in list(patch.items()):
        if key not in patch:  # consumed by $setElementOrder
            continue
        is_delete_list = False
        if key.startswith(_DELETE_FROM_PRIMITIVES):  # patch.go preprocessDeletionListForMerging
            key, is_delete_list = _extract_key(key, _DELETE_FROM_PRIMITIVES), True
        if value is None:  # IgnoreUnmatchedNulls: a null deletes the key and is not kept
            original.pop(key, None)
            continue
        if key not in original or type(original[key]) is not type(value):
            if not is_delete_list:
                kept, keep = _remove_directives(value)
                if keep:
                    original[key] = kept
                else:
                    original.pop(key, None)
            continue
        field = _field(schema, key)
        if isinstance(value, dict):  # patch.go mergeMapHandler
            original[key] = value if _strategy(field) == _REPLACE else _merge_map(original[key], value, field.schema)
        elif isinstance(value, list):
            original[key] = _merge_slice_handler(original[key], value, field, is_delete_list)
        else:
            kept, keep = _remove_directives(value)
            if keep:
                original[key] = kept
            else:
                original.pop(key, None)
    return original


def _map_directive(directive: Any, patch: dict) -> dict:
    """patch.go handleDirectiveInMergeMap: `$patch: replace` keeps the patch, `$patch: delete` empties the map."""
    if directive == _REPLACE:
        patch.pop(_DIRECTIVE)
        return patch
    if directive == _DELETE:
        return {}
    raise StrategicMergeError(f"Unknown patch type: {directive} in map: {patch}")


def _remove_directives(value: Any) -> tuple[Any, bool]:
    """patch.go removeDirectives: drops maps carrying `$patch` (and says whether `value` itself stays)."""
    if isinstance(value, dict):
        if _DIRECTIVE in value:
            return None, False
        for key in list(value):
            kept, keep = _remove_directives(value[key])
            if keep:
                value[key] = kept
            else:
                del value[key]
        return value, True
    if isinstance(value, list):
        out = []
        for item in value:
            kept, keep = _remove_directives(item)
            if keep:
                out.append(kept)
        return out, True
    return value, True


def _extract_key(key: str, prefix: str) -> str:
    """patch.go extractKey: `<prefix>/<field>` -> field."""
    head, sep, rest = key.partition("/")
    if not sep or head != prefix:
        raise StrategicMergeError(f"invalid patch key {key!r} for {prefix}")
    return rest


def _apply_retain_keys(original: dict, patch: dict) -> None:
    """patch.go applyRetainKeysDirective (MergeParallelList): keys of `original` not listed are cleared."""
    if _RETAIN_KEYS not in patch:
        return
    keys = patch.pop(_RETAIN_KEYS)
    if not isinstance(keys, list):
        raise StrategicMergeError("invalid patch: the $retainKeys list is malformed")
    allowed = {_go_key(k) for k in keys}
    for key, value in patch.items():
        if value is None or key.startswith(_DELETE_FROM_PRIMITIVES) or key.startswith(_SET_ORDER):
            continue
        if _go_key(key) not in allowed:
            raise StrategicMergeError("invalid patch: a field of the patch is not in its $retainKeys list")
    for key in list(original):
        if _go_key(key) not in allowed:
            del original[key]


def _merge_set_element_order(original: dict, patch: dict, schema: Schema | None) -> None:
    """patch.go mergePatchIntoOriginal: merges each list named by a `$setElementOrder/<field>` and orders it by that
    list (then the patch, then the live list)."""
    for key in [k for k in list(patch) if k.startswith(_SET_ORDER)]:
        order = patch.pop(key)
        if not isinstance(order, list):
            raise StrategicMergeError(f"invalid {key}: not a list")
        name = _extract_key(key, _SET_ORDER)
        found_original, found_patch = name in original, name in patch
        original_list, patch_list = original.get(name), patch.get(name)
        if found_original and not isinstance(original_list, list) or found_patch and not isinstance(patch_list,
                                                                                                    list):
            raise StrategicMergeError(f"{name}: not a list")
        field = _field(schema, name)
        _strategy(field)  # refuses malformed strategies, as upstream does here
        _validate_patch_with_set_order(patch_list or [], order, field.merge_key)
        if found_original and not found_patch:
            merged = original_list
        elif found_patch and not found_original:
            merged = _remove_directives(patch_list)[0]
        elif found_original and found_patch:
            merged = _merge_slice_handler(original_list, patch_list, field, False)
        else:
            continue
        patch_items, server_only = _partition(merged, order, field.merge_key)
        kind = _element_kind(original_list or [], patch_list or [])
        original[name] = _normalize_element_order(patch_items, server_only, order, original_list or [],
                                                  field.merge_key, kind)
        patch.pop(name, None)


def _validate_patch_with_set_order(patch_list: list, order: list, merge_key: str) -> None:
    """patch.go validatePatchWithSetOrderList: the patch list's items appear in the order list, in its order."""
    if not order or not patch_list:
        return
    items = _split_delete_items(patch_list)[0] if merge_key else patch_list
    i = j = 0
    while i < len(items) and j < len(order):
        if isinstance(items[i], dict) and _DIRECTIVE in items[i]:
            i += 1
            continue
        if merge_key:
            if not isinstance(items[i], dict) or not isinstance(order[j], dict):
                raise StrategicMergeError("items of a merging list must be maps")
            same = _go_equal(items[i].get(merge_key), order[j].get(merge_key))
        else:
            same = _go_equal(items[i], order[j])
        if same:
            i += 1
        j += 1
    if i < len(items) and j >= len(order):
        raise StrategicMergeError(f"The order in patch list:\n{patch_list}\n doesn't match {_SET_ORDER} list:\n"
                                  f"{order}\n")


def _merge_slice_handler(original: Any, patch: Any, field: Field, is_delete_list: bool) -> list:
    """patch.go mergeSliceHandler: a list merges only under `patchStrategy: merge` (or as a deletion list);
    otherwise the patch's list replaces the original's."""
    if not isinstance(original, list) or not isinstance(patch, list):
        raise StrategicMergeError("invalid types: expected two lists")
    if _strategy(field) == _MERGE or is_delete_list:
        return _merge_slice(original, patch, field.schema, field.merge_key, is_delete_list)
    return patch


def _element_kind(*lists: list) -> str:
    """patch.go sliceElementType: "map" or "scalar"; every element of one Go type, no lists of lists."""
    seen: type | None = None
    for items in lists:
        for item in items:
            if seen is None:
                if isinstance(item, list):
                    raise StrategicMergeError("lists of lists are not supported")
                seen = type(item)
            elif type(item) is not seen:
                raise StrategicMergeError(f"list element types are not identical: {list(lists)}")
    if seen is None:
        raise StrategicMergeError("no elements in any of the given slices")
    return "map" if seen is dict else "scalar"


def _merge_slice(original: list, patch: list, schema: Schema | None, merge_key: str, is_delete_list: bool) -> list:
    """patch.go mergeSlice: scalars are unioned (deduplicated); maps are matched by the merge key and merged, the
    unmatched appended; then the order is normalized (normalizeElementOrder)."""
    if not original and not patch:
        return original
    kind = _element_kind(original, patch)
    if kind != "map":
        if is_delete_list:  # patch.go deleteFromSlice
            doomed = {_go_key(v) for v in patch}
            return [v for v in original if _go_key(v) not in doomed]
        merged = _dedupe_scalars(original + patch)
    else:
        if not merge_key:
            raise StrategicMergeError("cannot merge lists without merge key")
        original, patch = _merge_slice_special_elements(original, patch, merge_key)
        merged = list(original)
        for item in patch:  # patch.go mergeSliceWithoutSpecialElements
            if merge_key not in item:
                raise StrategicMergeError(f"map: {item} does not contain declared merge key: {merge_key}")
            at = _find_by_key(merged, merge_key, item[merge_key])
            if at is None:
                merged.append(item)
            else:
                merged[at] = _merge_map(merged[at], item, schema)
    patch_items, server_only = _partition(merged, patch, merge_key)
    return _normalize_element_order(patch_items, server_only, patch, original, merge_key, kind)


def _merge_slice_special_elements(original: list, patch: list, merge_key: str) -> tuple[list, list]:
    """patch.go mergeSliceWithSpecialElements: `$patch: delete` items remove their match from the original,
    `$patch: replace` makes the rest of the patch the whole list."""
    plain, replace = [], False
    for item in patch:
        if not isinstance(item, dict):
            raise StrategicMergeError("items of a merging list must be maps")
        if _DIRECTIVE not in item:
            plain.append(item)
        elif item[_DIRECTIVE] == _DELETE:
            if merge_key not in item:
                raise StrategicMergeError(f"map: {item} does not contain declared merge key: {merge_key}")
            original = [o for o in original if not _go_equal(o.get(merge_key), item[merge_key])]
        elif item[_DIRECTIVE] == _REPLACE:
            replace = True
        elif item[_DIRECTIVE] == _MERGE:
            raise StrategicMergeError("merging lists cannot yet be specified in the patch")
        else:
            raise StrategicMergeError(f"Unknown patch type: {item[_DIRECTIVE]} in map: {item}")
    return (plain, []) if replace else (original, plain)


def _find_by_key(items: list, merge_key: str, value: Any) -> int | None:
    """patch.go findMapInSliceBasedOnKeyValue."""
    for at, item in enumerate(items):
        if not isinstance(item, dict):
            raise StrategicMergeError(f"value for key {at} is not a map")
        if merge_key in item and _go_equal(item[merge_key], value):
            return at
    return None


def _dedupe_scalars(items: list) -> list:
    """patch.go deduplicateScalars, step for step: a duplicate is overwritten by the last item (order changes)."""
    s = list(items)
    last = len(s) - 1
    i = 0
    while i < last:
        j = i + 1
        while j <= last:
            if _go_equal(s[i], s[j]):
                s[j] = s[last]
                s = s[:last]
                last -= 1
                j -= 1
            j += 1
        i += 1
    return s


def _partition(items: list, by: list, merge_key: str) -> tuple[list, list]:
    """patch.go partitionMapsByPresentInList / partitionPrimitivesByPresentInList: (in `by`, not in `by`)."""
    inside, outside = [], []
    if not merge_key:
        present = {_go_key(v) for v in by if not isinstance(v, (dict, list))}
        for item in items:
            (inside if not isinstance(item, (dict, list)) and _go_key(item) in present else outside).append(item)
        return inside, outside
    for item in items:
        if not isinstance(item, dict) or merge_key not in item:
            raise StrategicMergeError(f"map: {item} does not contain declared merge key: {merge_key}")
        (outside if _find_by_key(by, merge_key, item[merge_key]) is None else inside).append(item)
    return inside, outside


def _index(items: list, value: Any, merge_key: str, kind: str) -> int:
    """patch.go index: position of `value` in `items` by merge key (maps) or by value (scalars); -1 if absent."""
    def key_of(item: Any) -> Any:
        if kind == "map":
            return item.get(merge_key) if isinstance(item, dict) else None
        return item
    wanted = key_of(value)
    for at, item in enumerate(items):
        got = key_of(item)
        if (got is None and wanted is None) or _go_equal(got, wanted):
            return at
    return -1


def _split_delete_items(items: list) -> tuple[list, list]:
    """patch.go extractToDeleteItems: (items, items marked `$patch: delete`)."""
    keep, doomed = [], []
    for item in items:
        if not isinstance(item, dict):
            raise StrategicMergeError(f"expected a map, got {item!r}")
        (doomed if item.get(_DIRECTIVE) == _DELETE else keep).append(item)
    return keep, doomed


def _go_stable_sort(items: list, less: Any) -> list:
    """Go's sort.SliceStable for up to one block (sort/zsortfunc.go insertionSort_func), with `less` called as
    upstream calls it: less(items[j], items[j-1])."""
    if len(items) > _GO_STABLE_BLOCK:
        raise StrategicMergeError(f"lists of more than {_GO_STABLE_BLOCK} items are not emulated")
    s = list(items)
    for i in range(1, len(s)):
        j = i
        while j > 0 and less(s[j], s[j - 1]):
            s[j], s[j - 1] = s[j - 1], s[j]
            j -= 1
    return s


def _normalize_slice_order(items: list, order: list, merge_key: str, kind: str) -> list:
    """patch.go normalizeSliceOrder: sorted by position in `order` (items not in it compare as smaller)."""
    doomed: list = []
    if kind == "map":
        for item in [*items, *order]:
            if not isinstance(item, dict) or merge_key not in item:
                raise StrategicMergeError(f"map: {item} does not contain declared merge key: {merge_key}")
        items, doomed = _split_delete_items(items)

    def less(a: Any, b: Any) -> bool:
        ia = _index(order, a, merge_key, kind)
        if ia >= 0:
            ib = _index(order, b, merge_key, kind)
            if ib >= 0:
                return ia < ib
        return True
    return _go_stable_sort(items, less) + doomed


def _normalize_element_order(patch_items: list, server_only: list, patch_order: list, server_order: list,
                             merge_key: str, kind: str) -> list:
    """patch.go normalizeElementOrder and mergeSortedSlice: the patch's items in the patch's order, the live-only
    items in the live order, interleaved where both are in the live list; otherwise the patch's item comes first."""
    right = _normalize_slice_order(patch_items, patch_order, merge_key, kind)
    left = _normalize_slice_order(server_only, server_order, merge_key, kind)
    out, i, j = [], 0, 0
    while i < len(left) or j < len(right):
        if i >= len(left):
            out.append(right[j])
            j += 1
        elif j >= len(right):
            out.append(left[i])
            i += 1
        else:
            li, ri = _index(server_order, left[i], merge_key, kind), _index(server_order, right[j], merge_key, kind)
            if li >= 0 and ri >= 0 and li < ri:
                out.append(left[i])
                i += 1
            else:
                out.append(right[j])
                j += 1
    return out


#: core/v1 Container's patch strategies: the struct tags in k8s.io/api core/v1/types.go (identical at v0.28.4,
#: v0.32.3 and v0.33.1). Nothing nested in a Container (probes, env's valueFrom, resources, securityContext,
#: lifecycle) has a tag: nested maps merge key by key, nested lists are replaced.
CONTAINER: Schema = {
    "ports": Field(("merge",), "containerPort"),
    "env": Field(("merge",), "name"),
    "volumeMounts": Field(("merge",), "mountPath"),
    "volumeDevices": Field(("merge",), "devicePath"),
}


# ---------------------------------------------------------------- KServe's merge

#: Plain (non-pointer) integer and bool fields with `omitempty` somewhere in a core/v1 Container (Probe's timings,
#: ContainerPort.hostPort, VolumeMount.readOnly, Container.stdin/stdinOnce/tty): Go's json.Marshal leaves out
#: their zero values. Pointer fields (securityContext's runAsUser, allowPrivilegeEscalation, a probe's
#: terminationGracePeriodSeconds) keep theirs.
_OMITTED_WHEN_ZERO = frozenset({"initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold",
                                "failureThreshold", "hostPort", "readOnly", "stdin", "stdinOnce", "tty"})
#: Maps (ResourceList) with `omitempty`: left out when empty. Every other object in a Container is a struct (kept).
_MAPS_OMITTED_WHEN_EMPTY = frozenset({"limits", "requests"})


def _omit_empty(value: Any) -> Any:
    if isinstance(value, list):
        return [_omit_empty(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        item = _omit_empty(item)
        if item is None or item == "" or item == [] or (item == {} and key in _MAPS_OMITTED_WHEN_EMPTY):
            continue
        if key in _OMITTED_WHEN_ZERO and item in (0, False) and not isinstance(item, float):
            continue
        out[key] = item
    return out


def go_json(container: dict) -> dict:
    """A core/v1 Container as Go's json.Marshal writes it: `omitempty` fields without their zero values, `name`
    always written (its tag has no omitempty), `resources` always written (a struct)."""
    out = _omit_empty(copy.deepcopy(container))
    out["name"] = container.get("name") or ""
    out.setdefault("resources", {})
    return out


def merge_runtime_containers(runtime: dict, predictor: dict) -> dict:
    """The container KServe runs: kserve/kserve pkg/controller/v1beta1/inferenceservice/utils/utils.go
    MergeRuntimeContainers (the same at v0.13.1, v0.14.1, v0.15.0, v0.15.2 and v0.16.0): both containers through
    json.Marshal, the predictor's applied to the runtime's as a strategic merge patch with core/v1 Container's
    patch metadata, the result read back into a Container; an empty name becomes the runtime's (`name` has no
    omitempty, so an unnamed predictor container patches it to ""); args are the runtime's then the predictor's."""
    merged = go_json(strategic_merge_patch(go_json(runtime), go_json(predictor), CONTAINER))
    if not merged["name"]:
        merged["name"] = runtime.get("name") or ""
    args = [*(runtime.get("args") or []), *(predictor.get("args") or [])]
    if args:
        merged["args"] = args
    else:
        merged.pop("args", None)
    return merged


#: ModelSpec's fields that are not its inline core/v1 Container (kserve/kserve pkg/apis/serving/v1beta1
#: predictor_model.go ModelSpec and predictor.go PredictorExtensionSpec, same at v0.13.1 and v0.15.2).
MODEL_SPEC_KEYS = frozenset({"modelFormat", "runtime", "storageUri", "runtimeVersion", "protocolVersion", "storage"})
#: kserve/kserve pkg/constants/constants.go InferenceServiceContainerName.
KSERVE_CONTAINER = "kserve-container"


class ComposeError(ValueError):
    """KServe would not make a pod of this runtime and InferenceService."""


def model_container(manifest: dict) -> dict:
    """The core/v1 Container an InferenceService's `spec.predictor.model` carries inline."""
    model = manifest["spec"]["predictor"]["model"]
    return {key: copy.deepcopy(value) for key, value in model.items() if key not in MODEL_SPEC_KEYS}


def compose(runtime: dict, manifest: dict) -> dict:
    """The predictor's serving container as KServe's predictor reconciler makes it from a (Cluster)ServingRuntime
    and an InferenceService: kserve/kserve pkg/controller/v1beta1/inferenceservice/components/predictor.go
    (v0.13.1 and v0.15.2) Reconcile -- the runtime named by `model.runtime`, the InferenceService's protocolVersion
    among the runtime's protocolVersions (IsProtocolVersionSupported), the runtime container named
    kserve-container, merged with the model's container by MergeRuntimeContainers."""
    model = manifest["spec"]["predictor"]["model"]
    wanted = model.get("runtime")
    if wanted and wanted != runtime["metadata"]["name"]:
        raise ComposeError(f"the InferenceService names runtime {wanted}, not {runtime['metadata']['name']}")
    protocol = model.get("protocolVersion")
    if protocol and protocol not in runtime["spec"].get("protocolVersions", []):
        raise ComposeError(f"runtime {runtime['metadata']['name']} does not support protocol version {protocol}")
    containers = [c for c in runtime["spec"].get("containers", []) if c.get("name") == KSERVE_CONTAINER]
    if not containers:
        raise ComposeError("failed to find kserve-container in ServingRuntime containers")
    return merge_runtime_containers(containers[0], model_container(manifest))


# ---------------------------------------------------------------- Kubernetes' container checks

_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
#: The handler fields of a core/v1 ProbeHandler, in the order validateHandler looks at them.
_CORE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")


def _valid_port_name(name: str) -> bool:
    """k8s.io/apimachinery pkg/util/validation/validation.go IsValidPortName (an IANA_SVC_NAME)."""
    return (len(name) <= 15 and bool(_PORT_NAME.match(name)) and "--" not in name
            and any(c.isalpha() for c in name))


def _port_errors(port: Any, where: str) -> list[str]:
    """kubernetes/kubernetes pkg/apis/core/validation/validation.go ValidatePortNumOrName."""
    if isinstance(port, int) and not isinstance(port, bool):
        return [] if 1 <= port <= 65535 else [f"{where}: Invalid value: {port}: must be between 1 and 65535"]
    if isinstance(port, str) and _valid_port_name(port):
        return []
    return [f"{where}: Invalid value: {port!r}: not a port number or IANA_SVC_NAME"]


def core_container_errors(container: dict, path: str = "spec.containers[0]") -> list[str]:
    """Why the API server would refuse this container in a pod template (the checks that bear on composition).

    kubernetes/kubernetes pkg/apis/core/validation/validation.go (read at the stored master commit 000f2605;
    the rules below are unchanged since before Kubernetes 1.28): validateContainerPorts (port names valid IANA
    names and unique, containerPort required and in range, protocol TCP/UDP/SCTP), validateLivenessProbe /
    validateReadinessProbe / validateStartupProbe -> validateProbe -> validateHandler ("may not specify more than
    1 handler type", "must specify a handler type", each handler's port), liveness and startup successThreshold 1.
    Defaults the API server applies first (core/v1 defaults.go: protocol TCP, successThreshold 1) are applied.
    """
    errors: list[str] = []
    names: set[str] = set()
    for i, port in enumerate(container.get("ports") or []):
        where = f"{path}.ports[{i}]"
        name = port.get("name") or ""
        if name:
            if not _valid_port_name(name):
                errors.append(f"{where}.name: Invalid value: {name!r}")
            elif name in names:
                errors.append(f"{where}.name: Duplicate value: {name!r}")
            else:
                names.add(name)
        number = port.get("containerPort") or 0
        if not number:
            errors.append(f"{where}.containerPort: Required value")
        elif not 1 <= number <= 65535:
            errors.append(f"{where}.containerPort: Invalid value: {number}")
        if (port.get("protocol") or "TCP") not in ("TCP", "UDP", "SCTP"):
            errors.append(f"{where}.protocol: Unsupported value: {port['protocol']!r}")
    for kind in _PROBES:
        probe = container.get(kind)
        if probe is None:
            continue
        where = f"{path}.{kind}"
        handlers = [h for h in _CORE_HANDLERS if probe.get(h) is not None]
        if not handlers:
            errors.append(f"{where}: Required value: must specify a handler type")
        for extra in handlers[1:]:
            errors.append(f"{where}.{extra}: Forbidden: may not specify more than 1 handler type")
        if handlers and handlers[0] in ("httpGet", "tcpSocket", "grpc"):
            errors += _port_errors(probe[handlers[0]].get("port", 0), f"{where}.{handlers[0]}.port")
        for timing in ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold",
                       "failureThreshold"):
            if (probe.get(timing) or 0) < 0:
                errors.append(f"{where}.{timing}: Invalid value: must be greater than or equal to 0")
        if kind != "readinessProbe" and (probe.get("successThreshold") or 1) != 1:
            errors.append(f"{where}.successThreshold: Invalid value: {probe['successThreshold']}: must be 1")
    return errors


# ---------------------------------------------------------------- Knative Serving

#: knative.dev/serving pkg/apis/serving/k8s_validation.go reservedPorts (v0.39.3 and v0.44.0): the queue-proxy's
#: 8012 (http), 8013 (h2c), 8022 (admin), 9090 and 9091 (metrics) and the profiling port 8008.
KNATIVE_RESERVED_PORTS = frozenset({8012, 8013, 8022, 9090, 9091, 8008})
#: k8s_validation.go validPortNames.
KNATIVE_PORT_NAMES = frozenset({"", "h2c", "http1"})
#: knative.dev/serving pkg/apis/serving/v1 DefaultUserPort, and the name validateContainersPorts gives an
#: unnamed port.
KNATIVE_DEFAULT_PORT, KNATIVE_DEFAULT_PORT_NAME = 8080, "http"
#: The handler fields in the order Knative's validateProbe lists them.
_KNATIVE_HANDLERS = ("httpGet", "tcpSocket", "exec", "grpc")


def knative_defaults(container: dict) -> dict:
    """The serving container after Knative's defaulting webhook (which runs before its validation):
    knative.dev/serving pkg/apis/serving/v1/revision_defaults.go applyProbes (v0.39.3) /
    applyUserContainerDefaultReadinessProbe and applyReadinessProbeDefaults (v0.44.0): a readiness probe without
    a handler becomes a TCP probe of the serving port, successThreshold 1, and with periodSeconds set,
    failureThreshold 3 and timeoutSeconds 1 where unset."""
    out = copy.deepcopy(container)
    probe = out.setdefault("readinessProbe", {})
    if not any(probe.get(h) is not None for h in _KNATIVE_HANDLERS):
        probe["tcpSocket"] = {}
    if not probe.get("successThreshold"):
        probe["successThreshold"] = 1
    if probe.get("periodSeconds"):
        probe["failureThreshold"] = probe.get("failureThreshold") or 3
        probe["timeoutSeconds"] = probe.get("timeoutSeconds") or 1
    return out


def _knative_serving_port(containers: list[dict]) -> tuple[dict, list[str]]:
    """k8s_validation.go validateContainersPorts: the serving port (name "http" and 8080 when unset) and the
    error when more than one port is declared across the containers."""
    count, port = 0, {}
    for c in containers:
        if c.get("ports"):
            count += len(c["ports"])
            port = dict(c["ports"][0])
    port["name"] = port.get("name") or KNATIVE_DEFAULT_PORT_NAME
    port["containerPort"] = port.get("containerPort") or KNATIVE_DEFAULT_PORT
    errors = []
    if count == 0 and len(containers) > 1:
        errors.append("ports: missing field(s)")
    if count > 1:
        errors.append("ports: more than one container port is set (Only a single port is allowed across all "
                      "containers)")
    return port, errors


def _knative_probe_errors(probe: dict | None, port: dict, where: str) -> list[str]:
    """k8s_validation.go validateProbe (the serving container's): exactly one handler; a probe port given by name
    must be the serving port's name (a port given by number is not checked)."""
    if probe is None:
        return []
    errors, handlers = [], []
    for handler in _KNATIVE_HANDLERS:
        if probe.get(handler) is None:
            continue
        handlers.append(handler)
        named = probe[handler].get("port") if handler in ("httpGet", "tcpSocket") else None
        if isinstance(named, str) and named and named != port["name"]:
            errors.append(f"{where}.{handler}.port: invalid value: {named} (Probe port must match container port)")
    if not handlers:
        errors.append(f"{where}: expected exactly one, got neither "
                      f"({', '.join(f'{where}.{h}' for h in _KNATIVE_HANDLERS)})")
    elif len(handlers) > 1:
        errors.append(f"{where}: expected exactly one, got both ({', '.join(f'{where}.{h}' for h in handlers)})")
    return errors


def _knative_readiness_errors(probe: dict | None, port: dict) -> list[str]:
    """k8s_validation.go validateReadinessProbe."""
    where = "readinessProbe"
    if probe is None:
        return []
    errors = _knative_probe_errors(probe, port, where)
    value = {k: probe.get(k) or 0 for k in ("periodSeconds", "initialDelaySeconds", "successThreshold",
                                            "timeoutSeconds", "failureThreshold")}
    if value["periodSeconds"] < 0:
        errors.append(f"{where}.periodSeconds: expected 0 <= {value['periodSeconds']} <= 2147483647")
    if value["initialDelaySeconds"] < 0:
        errors.append(f"{where}.initialDelaySeconds: expected 0 <= {value['initialDelaySeconds']} <= 2147483647")
    if value["successThreshold"] < 1:
        errors.append(f"{where}.successThreshold: expected 1 <= {value['successThreshold']} <= 2147483647")
    if value["periodSeconds"] == 0:  # Knative's aggressive probing: no failureThreshold or timeoutSeconds
        if value["failureThreshold"]:
            errors.append(f"{where}.failureThreshold: failureThreshold is disallowed when periodSeconds is zero")
        if value["timeoutSeconds"]:
            errors.append(f"{where}.timeoutSeconds: timeoutSeconds is disallowed when periodSeconds is zero")
    else:
        if value["timeoutSeconds"] < 1:
            errors.append(f"{where}.timeoutSeconds: expected 1 <= {value['timeoutSeconds']} <= 2147483647")
        if value["failureThreshold"] < 1:
            errors.append(f"{where}.failureThreshold: expected 1 <= {value['failureThreshold']} <= 2147483647")
    return errors


def knative_container_errors(container: dict) -> list[str]:
    """Why Knative's webhook refuses a revision whose only container is this one (the checks that bear on
    composition): knative.dev/serving pkg/apis/serving/k8s_validation.go at v0.39.3 and v0.44.0 --
    ValidatePodSpec's validateContainersPorts, then ValidateContainer (v0.39.3) / ValidateUserContainer (v0.44.0):
    validateProbe on the liveness probe, validateReadinessProbe, and validateContainerPorts on the serving port
    (validateContainerPortBasic: reserved ports and range; protocol TCP; name empty, http1 or h2c)."""
    port, errors = _knative_serving_port([container])
    errors += _knative_probe_errors(container.get("livenessProbe"), port, "livenessProbe")
    errors += _knative_readiness_errors(container.get("readinessProbe"), port)
    ports = container.get("ports") or []
    if ports:
        first = ports[0]
        number = first.get("containerPort") or 0
        if number in KNATIVE_RESERVED_PORTS:
            errors.append(f"ports.containerPort: invalid value: {number} is a reserved port")
        if not 0 <= number <= 65535:
            errors.append(f"ports.containerPort: expected 0 <= {number} <= 65535")
        if (first.get("protocol") or "TCP") != "TCP":
            errors.append(f"ports.protocol: invalid value: {first['protocol']}")
        if (first.get("name") or "") not in KNATIVE_PORT_NAMES:
            errors.append(f"ports: Port name {first['name']} is not allowed (Name must be empty, or one of: "
                          "'h2c', 'http1')")
        if first.get("hostPort"):
            errors.append("ports.hostPort: must not set the field(s)")
    return errors


def knative_deployment_container(container: dict) -> dict:
    """The serving container in the Deployment Knative's revision reconciler writes:
    knative.dev/serving pkg/reconciler/revision/resources/deploy.go makeServingContainer (v0.39.3 and v0.44.0) --
    its one port becomes `user-port` (buildContainerPorts), HTTP/TCP/gRPC readiness probes move to the queue-proxy
    (makeContainer), and an HTTP or TCP liveness probe is pointed at the serving port (rewriteUserProbe /
    rewriteUserLivenessProbe)."""
    port = serving_port(container, KNATIVE)
    out = copy.deepcopy(container)
    out["ports"] = [{"name": "user-port", "containerPort": port.number, "protocol": "TCP"}]
    readiness = out.get("readinessProbe")
    if readiness and any(readiness.get(h) is not None for h in ("httpGet", "tcpSocket", "grpc")):
        del out["readinessProbe"]
    liveness = out.get("livenessProbe")
    if liveness:
        for handler in ("httpGet", "tcpSocket"):
            if liveness.get(handler) is not None:
                liveness[handler]["port"] = port.number
                break
    return out


# ---------------------------------------------------------------- what the pod does

def kserve_raw_deployment_container(container: dict) -> dict:
    """The serving container in the Deployment KServe writes in raw mode: kserve/kserve
    pkg/controller/v1beta1/inferenceservice/reconcilers/deployment/deployment_reconciler.go
    setDefaultPodSpec (v0.13.1 and v0.15.2) -- without a readiness probe, kserve-container gets a TCP probe of its
    first port (8080 when it declares none)."""
    out = copy.deepcopy(container)
    if out.get("name") == KSERVE_CONTAINER and out.get("readinessProbe") is None:
        ports = out.get("ports") or []
        out["readinessProbe"] = {"tcpSocket": {"port": ports[0]["containerPort"] if ports else 8080},
                                 "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
                                 "failureThreshold": 3}
    return out


def pod_errors(container: dict, mode: str) -> list[str]:
    """Every reason the pod of this serving container would not run in `mode`: raw, the API server's checks of the
    Deployment KServe writes; Knative, its webhook's checks of the defaulted revision, then the API server's of the
    Deployment Knative writes."""
    if mode == RAW:
        return core_container_errors(kserve_raw_deployment_container(container))
    if mode != KNATIVE:
        raise ValueError(f"unknown deployment mode {mode!r}")
    defaulted = knative_defaults(container)
    return knative_container_errors(defaulted) + core_container_errors(knative_deployment_container(defaulted))


@dataclass(frozen=True)
class Port:
    number: int
    name: str
    #: Routed as HTTP/2 cleartext (gRPC) rather than HTTP/1.
    h2c: bool


def serving_port(container: dict, mode: str, release: Release = KSERVE_RELEASES[-1]) -> Port:
    """Where requests reach the container.

    Raw: the Service KServe writes targets the first declared port, 8080 when none (kserve/kserve
    pkg/controller/v1beta1/inferenceservice/reconcilers/service/service_reconciler.go createService at v0.13.1,
    createDefaultSvc at v0.15.2); from 0.15 its appProtocol is kubernetes.io/h2c when the port's name contains
    "h2c" or "grpc" (getAppProtocol, isGrpcPort). Knative: the first declared port, 8080 when none, HTTP/2 when it
    is named h2c (knative.dev/serving pkg/reconciler/revision/resources/deploy.go getUserPort, and the revision's
    GetProtocol)."""
    ports = container.get("ports") or []
    first = ports[0] if ports else {}
    number = first.get("containerPort") or KNATIVE_DEFAULT_PORT
    name = first.get("name") or ""
    if mode == KNATIVE:
        return Port(number, name, name == "h2c")
    h2c = tuple(int(p) for p in release.kserve.split(".")) >= (0, 15, 0) and ("h2c" in name or "grpc" in name)
    return Port(number, name, h2c)


@dataclass(frozen=True)
class Probe:
    handler: str
    port: int | None
    path: str = ""


def _resolve_port(port: Any, container: dict) -> int | None:
    if isinstance(port, int) and not isinstance(port, bool):
        return port or None
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return declared["containerPort"]
    return None


def executed_probes(container: dict, mode: str) -> dict[str, Probe]:
    """The probes as they are really run, {"readinessProbe": Probe, "livenessProbe": Probe} (absent: not run).

    Raw: the kubelet runs each probe at its own port, KServe's default readiness probe added first. Knative: the
    queue-proxy runs the readiness probe against 127.0.0.1 at the port the probe gives by number, else at the
    serving port (knative.dev/serving pkg/reconciler/revision/resources/queue.go makeQueueContainer, v0.39.3 and
    v0.44.0; an exec readiness probe stays with the kubelet and the queue-proxy adds a TCP probe of the serving
    port); the kubelet runs the liveness probe, whose HTTP or TCP port Knative has replaced with the serving port
    (knative_deployment_container)."""
    out: dict[str, Probe] = {}
    if mode == RAW:
        running = kserve_raw_deployment_container(container)
        for kind in ("readinessProbe", "livenessProbe"):
            if running.get(kind):
                out[kind] = _probe(running[kind], lambda port: _resolve_port(port, running))
        return out
    defaulted = knative_defaults(container)
    user_port = serving_port(defaulted, KNATIVE).number
    out["readinessProbe"] = _probe(defaulted["readinessProbe"], lambda port: port if isinstance(port, int) and
                                   not isinstance(port, bool) and port else user_port)
    liveness = knative_deployment_container(defaulted).get("livenessProbe")
    if liveness:
        out["livenessProbe"] = _probe(liveness, lambda port: _resolve_port(port, defaulted))
    return out


def _probe(probe: dict, port_of: Any) -> Probe:
    handler = next((h for h in _CORE_HANDLERS if probe.get(h) is not None), "")
    action = probe.get(handler) or {}
    if handler == "exec":
        return Probe(handler, None)
    return Probe(handler, port_of(action.get("port", 0)), action.get("path", "/") if handler == "httpGet" else "")
