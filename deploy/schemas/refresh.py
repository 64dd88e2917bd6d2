"""Regenerate the schema files in this directory from their upstream sources (see README.md).

    python deploy/schemas/refresh.py --kserve-git KSERVE_GIT_DIR --kserve-ref v0.20.0 --swagger swagger.json

KSERVE_GIT_DIR is a clone of github.com/kserve/kserve (a bare one works); swagger.json is the Kubernetes
OpenAPI v2 document (kubernetes/kubernetes api/openapi-spec/swagger.json of a release branch, or the
copy kubernetes-client/python ships as kubernetes/swagger.json.unprocessed). The files keep the upstream
schemas as they are except: descriptions are dropped, and the Kubernetes ones are cut down to one kind
plus the definitions it references (`$ref` stays `#/definitions/<name>`). pipeline/manifests.py adapts
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


def kserve(git_dir: str, ref: str) -> None:
    for name, wanted in KSERVE_CRDS.items():
        text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{ref}:config/crd/full/{name}"],
                              check=True, capture_output=True, text=True).stdout
        crd = next(d for d in yaml.safe_load_all(text) if d)
        version = next(v for v in crd["spec"]["versions"] if v["name"] == wanted)
        api_version = f"{crd['spec']['group']}/{wanted}"
        _write(file_stem(api_version, crd["spec"]["names"]["kind"]), _strip(version["schema"]["openAPIV3Schema"]))


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
    parser.add_argument("--swagger", type=Path, help="Kubernetes OpenAPI v2 swagger.json")
    args = parser.parse_args()
    if args.kserve_git:
        kserve(args.kserve_git, args.kserve_ref)
    if args.swagger:
        kubernetes(args.swagger)


if __name__ == "__main__":
    main()
