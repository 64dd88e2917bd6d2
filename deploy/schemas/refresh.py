"""Regenerate the schema files in this directory from their upstream sources (see README.md).

    python deploy/schemas/refresh.py --kserve-git KSERVE_GIT_DIR --kserve-ref v0.20.0 --swagger swagger.json \
        --istio-git ISTIO_GIT_DIR --istio-ref 1.24.3

KSERVE_GIT_DIR and ISTIO_GIT_DIR are clones of github.com/kserve/kserve and github.com/istio/istio (bare ones
work); swagger.json is the Kubernetes OpenAPI v2 document (kubernetes/kubernetes api/openapi-spec/swagger.json of
a release branch, or the copy kubernetes-client/python ships as kubernetes/swagger.json.unprocessed). The files
keep the upstream schemas as they are except: descriptions are dropped, the Kubernetes ones are cut down to one
kind plus the definitions it references (`$ref` stays `#/definitions/<name>`), and a CRD schema that leaves out
apiVersion, kind and metadata (Istio's) gets them as the API server implies them for every custom resource. pipeline/manifests.py adapts
them to JSON Schema when it loads them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
GZIP_ABOVE = 500_000  # bytes of minified JSON
KSERVE_CRDS = {  # file in config/crd/full/ -> served version to take
    "serving.kserve.io_inferenceservices.yaml": "v1beta1",
    "serving.kserve.io_servingruntimes.yaml": "v1alpha1",
    "serving.kserve.io_clusterservingruntimes.yaml": "v1alpha1",
}
ISTIO_CRD_FILE = "manifests/charts/base/files/crd-all.gen.yaml"
ISTIO_CRDS = {"AuthorizationPolicy": "v1"}  # kind -> served version to take
K8S_KINDS = [  # definition names in the Kubernetes OpenAPI document
    "io.k8s.api.core.v1.ServiceAccount",
    "io.k8s.api.core.v1.Secret",
    "io.k8s.api.rbac.v1.Role",
    "io.k8s.api.rbac.v1.RoleBinding",
    "io.k8s.api.networking.v1.NetworkPolicy",
]
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def file_stem(api_version: str, kind: str) -> str:
    """`apps/v1`, `Deployment` -> `deployment-apps-v1` (the core group is `core`)."""
    group, _, version = api_version.rpartition("/")
    return f"{kind.lower()}-{group or 'core'}-{version}"


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _write(stem: str, schema: dict) -> None:
    data = json.dumps(schema, separators=(",", ":"), sort_keys=True).encode()
    for old in HERE.glob(f"{stem}.json*"):
        old.unlink()
    if len(data) > GZIP_ABOVE:
        (HERE / f"{stem}.json.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    else:
        (HERE / f"{stem}.json").write_bytes(data)


def _closure(definitions: dict, root: str) -> dict:
    seen: dict[str, Any] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = definitions[name]

        def refs(node: Any) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    if key == "$ref":
                        todo.append(value.rsplit("/", 1)[-1])
                    else:
                        refs(value)
            elif isinstance(node, list):
                for value in node:
                    refs(value)
        refs(seen[name])
    return {"$ref": f"#/definitions/{root}", "definitions": _strip(seen)}


def _write_crd(crd: dict, wanted: str) -> None:
    version = next(v for v in crd["spec"]["versions"] if v["name"] == wanted)
    api_version = f"{crd['spec']['group']}/{wanted}"
    schema = _strip(version["schema"]["openAPIV3Schema"])
    for implied, kind in (("apiVersion", "string"), ("kind", "string"), ("metadata", "object")):
        schema["properties"].setdefault(implied, {"type": kind})
    _write(file_stem(api_version, crd["spec"]["names"]["kind"]), schema)


def _git_show(git_dir: str, ref: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{ref}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def kserve(git_dir: str, ref: str) -> None:
    for name, wanted in KSERVE_CRDS.items():
        _write_crd(next(d for d in yaml.safe_load_all(_git_show(git_dir, ref, f"config/crd/full/{name}")) if d),
                   wanted)


def istio(git_dir: str, ref: str) -> None:
    crds = [d for d in yaml.safe_load_all(_git_show(git_dir, ref, ISTIO_CRD_FILE)) if d]
    for kind, wanted in ISTIO_CRDS.items():
        _write_crd(next(d for d in crds if d["spec"]["names"]["kind"] == kind), wanted)


def kubernetes(swagger: Path) -> None:
    definitions = json.loads(swagger.read_text())["definitions"]
    for name in K8S_KINDS:
        gvk = definitions[name]["x-kubernetes-group-version-kind"][0]
        api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
        _write(file_stem(api_version, gvk["kind"]), _closure(definitions, name))
    _write("_objectmeta-v1", _closure(definitions, OBJECT_META))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kserve-git", help="git dir of a kserve/kserve clone")
    parser.add_argument("--kserve-ref", default="v0.20.0")
    parser.add_argument("--istio-git", help="git dir of an istio/istio clone")
    parser.add_argument("--istio-ref", default="1.24.3")
    parser.add_argument("--swagger", type=Path, help="Kubernetes OpenAPI v2 swagger.json")
    args = parser.parse_args()
    if args.kserve_git:
        kserve(args.kserve_git, args.kserve_ref)
    if args.istio_git:
        istio(args.istio_git, args.istio_ref)
    if args.swagger:
        kubernetes(args.swagger)


if __name__ == "__main__":
    main()
