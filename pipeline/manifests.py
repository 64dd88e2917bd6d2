"""Validate Kubernetes / KServe manifests against the official schemas stored in deploy/schemas/.

The schemas are the KServe CRDs' openAPIV3Schema and the Kubernetes OpenAPI definitions (sources and
versions: deploy/schemas/README.md). They are OpenAPI 3.0 / Swagger 2.0 schema objects, close to JSON
Schema draft 4; on loading, this module adapts what draft 4 would read differently from the API server:

- `format: int-or-string` (Swagger's IntOrString) becomes `anyOf: [integer, string]`; the CRDs already
  spell int-or-string fields that way;
- `nullable: true` also admits null;
- objects that list `properties` reject other keys, unless marked `x-kubernetes-preserve-unknown-fields`:
  `kubectl apply` asks the API server for strict field validation, which refuses unknown fields
  (without it they would be silently dropped);
- a custom resource's `metadata` (just `type: object` in a CRD) is checked as a Kubernetes ObjectMeta;
- formats `byte` (base64, e.g. Secret data), `int32` and `int64` are checked.

The object's name is also checked the way the API server (and KServe's webhook) would.
"""

from __future__ import annotations

import base64
import binascii
import functools
import gzip
import json
import re
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft4Validator, FormatChecker
from jsonschema.exceptions import ValidationError, best_match

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "deploy" / "schemas"
OBJECT_META = "_objectmeta-v1"

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# kind -> (pattern, max length, what it is); kinds not listed get a DNS-1123 subdomain (253).
_NAME_RULES: dict[str, tuple[re.Pattern[str], int, str]] = {
    "InferenceService": (_DNS1035_LABEL, 63, "a DNS-1035 label (KServe webhook)"),
    "Role": (re.compile(r"(?!\.\.?$)[^/%]+"), 253, "a path segment name"),
    "RoleBinding": (re.compile(r"(?!\.\.?$)[^/%]+"), 253, "a path segment name"),
}


class ManifestError(ValueError):
    """A manifest the API server would refuse: `Kind name: path: reason`."""


def _file_stem(api_version: str, kind: str) -> str:
    group, _, version = api_version.rpartition("/")
    return f"{kind.lower()}-{group or 'core'}-{version}"


def _read(stem: str) -> dict | None:
    for path in (SCHEMA_DIR / f"{stem}.json", SCHEMA_DIR / f"{stem}.json.gz"):
        if path.is_file():
            data = path.read_bytes()
            return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
    return None


def _adapt(node: Any) -> Any:
    """OpenAPI schema object -> JSON Schema draft 4 with the API server's strictness (module docstring)."""
    if isinstance(node, list):
        return [_adapt(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: (v if k in ("enum", "default", "example") else
                {p: _adapt(s) for p, s in v.items()} if k in ("properties", "definitions") else _adapt(v))
            for k, v in node.items()}
    if node.get("format") == "int-or-string":
        rest = {k: v for k, v in node.items() if k not in ("type", "format")}
        node = {**rest, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        node["additionalProperties"] = False
    if node.get("nullable") is True:
        node = {"anyOf": [{"type": "null"}, {k: v for k, v in node.items() if k != "nullable"}]}
    return node


_FORMATS = FormatChecker([])


@_FORMATS.checks("byte", raises=(binascii.Error, ValueError))
def _is_base64(value: object) -> bool:
    if isinstance(value, str):
        base64.b64decode(value, validate=True)
    return True


@_FORMATS.checks("int32")
def _is_int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_FORMATS.checks("int64")
def _is_int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@functools.cache
def _validator(api_version: str, kind: str) -> Draft4Validator | None:
    """The validator for one apiVersion/kind, built once; None when no schema is stored for it."""
    schema = _read(_file_stem(api_version, kind))
    if schema is None:
        return None
    meta = schema.get("properties", {}).get("metadata")
    if meta == {"type": "object"}:  # a CRD: check metadata as the ObjectMeta the API server decodes it into
        object_meta = _read(OBJECT_META)
        if object_meta is None:
            raise FileNotFoundError(f"{SCHEMA_DIR / OBJECT_META}.json")
        schema = {**schema, "properties": {**schema["properties"], "metadata": {"$ref": object_meta["$ref"]}},
                  "definitions": {**schema.get("definitions", {}), **object_meta["definitions"]}}
    # Not check_schema()d here (0.6 s for the InferenceService): tests/unit/test_manifests.py checks the stored files.
    return Draft4Validator(_adapt(schema), format_checker=_FORMATS)


def _where(error: ValidationError) -> str:
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or "(document)"


def _check_name(kind: str, metadata: dict) -> str | None:
    """Why the API server would refuse metadata.name / metadata.namespace, or None."""
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return "metadata.name: required (a non-empty string)"
    pattern, limit, what = _NAME_RULES.get(kind, (_DNS1123_SUBDOMAIN, 253, "a DNS-1123 subdomain"))
    if len(name) > limit or not pattern.fullmatch(name):
        return f"metadata.name: {name!r} is not {what} of at most {limit} characters"
    namespace = metadata.get("namespace")
    if namespace is not None and (len(namespace) > 63 or not re.fullmatch(_DNS1123_LABEL, namespace)):
        return f"metadata.namespace: {namespace!r} is not a DNS-1123 label of at most 63 characters"
    return None


def validate(manifest: dict) -> None:
    """Raise ManifestError unless `manifest` passes the official schema of its apiVersion/kind."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"manifest: expected a mapping, got {type(manifest).__name__}")
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    label = f"{kind or '(no kind)'} {name or '(no name)'}"
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise ManifestError(f"{label}: apiVersion and kind must be strings")
    well_formed = re.fullmatch(r"([a-z0-9.-]+/)?v[0-9a-z]+", api_version) and re.fullmatch(r"[A-Za-z0-9]+", kind)
    validator = _validator(api_version, kind) if well_formed else None  # no stray paths into the file name
    if validator is None:
        raise ManifestError(f"{label}: no schema for apiVersion {api_version!r} kind {kind!r} in {SCHEMA_DIR}")
    error = best_match(validator.iter_errors(manifest))
    if error is not None:
        raise ManifestError(f"{label}: {_where(error)}: {error.message}")
    if not isinstance(metadata, dict):
        raise ManifestError(f"{label}: metadata: required")
    reason = _check_name(kind, metadata)
    if reason:
        raise ManifestError(f"{label}: {reason}")


def validate_file(path: str | Path) -> list[dict]:
    """Validate every document of a YAML file (empty documents skipped); return the documents."""
    with open(path, encoding="utf-8") as fh:
        docs = [doc for doc in yaml.safe_load_all(fh) if doc is not None]
    for index, doc in enumerate(docs):
        try:
            validate(doc)
        except ManifestError as exc:
            raise ManifestError(f"{path} (document {index + 1}): {exc}") from None
    return docs


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_QUANTITY_FACTOR = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity ("500m", "1.5", "2Gi", "768Mi") as a plain number (cores or bytes).

    Covers the suffixes resource requests use; exponent forms ("1e3") are refused as unsupported here.
    """
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise ManifestError(f"not a Kubernetes quantity this project reads: {value!r}")
    return float(match.group(1)) * _QUANTITY_FACTOR[match.group(2)]


def engine_limit_args(limits: dict[str, str]) -> list[str]:
    """podman/docker `run` options that enforce a Kubernetes container's `resources.limits` as the kubelet does:
    a CFS quota of that many cores, and a memory cgroup limit with no swap above it."""
    args = []
    if "cpu" in limits:
        args += ["--cpus", f"{quantity(limits['cpu']):g}"]
    if "memory" in limits:
        memory = f"{int(quantity(limits['memory']))}b"
        args += ["--memory", memory, "--memory-swap", memory]
    return args
