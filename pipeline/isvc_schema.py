"""The part of KServe's InferenceService (serving.kserve.io/v1beta1) this project writes, as a JSON schema.

Written from the published CRD (kserve/kserve config/crd/full/serving.kserve.io_inferenceservices.yaml,
commit aaac4e2) and the admission webhook's rules (name format, protocol versions). It is stricter
than the CRD on purpose: the API server silently prunes unknown fields of a custom resource, so a
misspelt key would be dropped without an error; here every object lists its allowed keys.
The `kserve` SDK was not used: it pins psutil<6, pandas<3 and python-dateutil<3, below this project's locks.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
_QUANTITY = {"anyOf": [{"type": "integer"}, {  # Kubernetes resource.Quantity, as the CRD spells it
    "type": "string",
    "pattern": rf"^(\+|-)?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$",
}]}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}}


def _object(required: tuple[str, ...], **properties: Any) -> dict:
    return {"type": "object", "required": list(required), "properties": properties, "additionalProperties": False}


INFERENCE_SERVICE_SCHEMA: dict = _object(
    ("apiVersion", "kind", "metadata", "spec"),
    apiVersion={"enum": ["serving.kserve.io/v1beta1"]},
    kind={"enum": ["InferenceService"]},
    metadata=_object(
        ("name", "namespace"),
        name={"type": "string", "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        namespace={"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        labels=_STRING_MAP,
        annotations={"type": "object", "additionalProperties": {"type": "string"}},
    ),
    spec=_object(("predictor",), predictor=_object(
        ("model",),
        minReplicas={"type": "integer"},
        maxReplicas={"type": "integer"},
        serviceAccountName={"type": "string"},
        model=_object(
            ("modelFormat", "storageUri"),
            modelFormat=_object(("name",), name={"type": "string"}, version={"type": "string"}),
            protocolVersion={"enum": ["v1", "v2"]},
            runtime={"type": "string"},
            storageUri={"type": "string", "pattern": r"^(gs|s3|pvc|file|https?|hdfs|webhdfs|oci|hf)://.+"},
            env={"type": "array", "items": _object(("name",), name={"type": "string"}, value={"type": "string"})},
            resources=_object((), limits={"type": "object", "additionalProperties": _QUANTITY},
                              requests={"type": "object", "additionalProperties": _QUANTITY}),
        ),
    )),
)

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "number": (int, float)}


class SchemaError(ValueError):
    """Where the document breaks the schema, as `$.spec.predictor...: reason`."""


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name]) and not (name == "number" and isinstance(value, bool))


def validate(doc: Any, schema: dict = INFERENCE_SERVICE_SCHEMA, path: str = "$") -> None:
    """Check `doc` against the keywords used above (a small subset of JSON Schema)."""
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                return validate(doc, option, path)
            except SchemaError as exc:
                errors.append(str(exc))
        raise SchemaError(" / ".join(errors))
    if "enum" in schema and doc not in schema["enum"]:
        raise SchemaError(f"{path}: {doc!r} is not one of {schema['enum']}")
    if "type" in schema and not _is_type(doc, schema["type"]):
        raise SchemaError(f"{path}: expected {schema['type']}, got {type(doc).__name__}")
    if isinstance(doc, str):
        if len(doc) > schema.get("maxLength", len(doc)):
            raise SchemaError(f"{path}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], doc):
            raise SchemaError(f"{path}: {doc!r} does not match {schema['pattern']}")
    if isinstance(doc, list) and "items" in schema:
        for i, item in enumerate(doc):
            validate(item, schema["items"], f"{path}[{i}]")
    if isinstance(doc, dict):
        for key in schema.get("required", ()):
            if key not in doc:
                raise SchemaError(f"{path}: missing required field {key!r}")
        properties, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
        for key, value in doc.items():
            if key in properties:
                validate(value, properties[key], f"{path}.{key}")
            elif extra is False:
                raise SchemaError(f"{path}: unknown field {key!r} (the API server would drop it)")
            elif isinstance(extra, dict):
                validate(value, extra, f"{path}.{key}")
