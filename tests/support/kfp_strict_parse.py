"""Parse JSON into Kubeflow Pipelines' protobuf messages the way a backend does, in whichever Python runs it.

Run as a script by the interpreter of the environment under test (.venv for the newest messages,
build/kfp-oldest-venv for the oldest supported backend's):
  stdin:  [{"message": "PipelineSpec" | "PlatformSpec" | "PipelineDeploymentConfig" | "KubernetesExecutorConfig",
            "json": {...}}, ...]
  stdout: {"versions": {distribution: version}, "errors": [null or the parser's message, one per item]}
Strict as the Go API server and driver are (protojson / jsonpb without DiscardUnknown): json_format.ParseDict
with ignore_unknown_fields=False. Imports nothing but protobuf and the two generated modules; kfp-kubernetes'
package __init__ needs the kfp SDK, so its kubernetes_executor_config_pb2 is loaded from its file.
"""

import importlib.metadata
import importlib.util
import json
import sys


def _executor_config_module():
    package = importlib.util.find_spec("kfp.kubernetes")
    path = f"{package.submodule_search_locations[0]}/kubernetes_executor_config_pb2.py"
    spec = importlib.util.spec_from_file_location("kubernetes_executor_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    k8s = _executor_config_module()
    messages = {"PipelineSpec": pipeline_spec_pb2.PipelineSpec, "PlatformSpec": pipeline_spec_pb2.PlatformSpec,
                "PipelineDeploymentConfig": pipeline_spec_pb2.PipelineDeploymentConfig,
                "KubernetesExecutorConfig": k8s.KubernetesExecutorConfig}
    errors = []
    for item in json.load(sys.stdin):
        try:
            json_format.ParseDict(item["json"], messages[item["message"]](), ignore_unknown_fields=False)
            errors.append(None)
        except json_format.ParseError as exc:
            errors.append(" ".join(str(exc).split()))
    versions = {name: importlib.metadata.version(name)
                for name in ("kfp-kubernetes", "kfp-pipeline-spec", "protobuf")}
    json.dump({"versions": versions, "errors": errors}, sys.stdout)


if __name__ == "__main__":
    main()
