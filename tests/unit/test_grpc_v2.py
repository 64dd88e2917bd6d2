"""Open Inference gRPC (serving.grpc_v2) without a container or TorchServe: the request and answer mapping, the
bearer key, and the servicer behind a real grpc.aio server whose gateway backend is scripted."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct

import grpc
import numpy as np
import pytest

from handler.v2_schema import V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT, V2_OUTPUTS
from serving import grpc_v2
from serving.grpc_v2 import RpcRefusal, infer_body, infer_response, pb, pb_grpc
from serving.gateway.app import Gateway
from serving.gateway.grpc_server import GrpcStartError, start_grpc as _start_grpc
from serving.kserve_runtime.torchserve import Upstream
from serving.open_inference import read_v2
from serving.server import free_ports

MODEL = "embedding"
KEY = "s3cret-key"


def framed(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def raw_request(**kw) -> pb.ModelInferRequest:
    images = [b"\x89PNG one", b"two\x00\xff"]
    pixels = np.linspace(0, 1, 784, dtype=np.float32)
    request = pb.ModelInferRequest(model_name=MODEL, id="r1", **kw)
    request.inputs.add(name="image", datatype="BYTES", shape=[2])
    request.inputs.add(name="pixels", datatype="FP32", shape=[1, 784])
    request.raw_input_contents.extend([framed(*images), pixels.tobytes()])
    return request


def test_raw_inputs_become_the_body_the_rest_binary_extension_gives():
    request = raw_request()
    request.parameters["binary_data_output"].bool_param = True  # REST layout choice: meaningless in gRPC
    request.parameters["output_format"].string_param = "tensors"
    request.outputs.add(name="label").parameters["binary_data"].bool_param = True
    body = infer_body(request)
    head = json.dumps({"inputs": [
        {"name": "image", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(request.raw_input_contents[0])}},
        {"name": "pixels", "datatype": "FP32", "shape": [1, 784], "parameters": {"binary_data_size": 784 * 4}}]}).encode()
    rest, _ = read_v2(head + b"".join(request.raw_input_contents), str(len(head)))
    assert [t["data"] for t in body["inputs"]] == [t["data"] for t in rest["inputs"]]
    assert [base64.b64decode(e) for e in body["inputs"][0]["data"]] == [b"\x89PNG one", b"two\x00\xff"]
    assert body["id"] == "r1" and body["parameters"] == {"output_format": "tensors"}
    assert body["outputs"] == [{"name": "label"}]


def test_typed_contents_become_json_data():
    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="image", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"\x89PNG")
    request.inputs.add(name="pixels", datatype="UINT8", shape=[1, 3]).contents.uint_contents.extend([0, 7, 255])
    request.inputs.add(name="f", datatype="FP32", shape=[2]).contents.fp32_contents.extend([0.5, 1.0])
    body = infer_body(request)
    assert [t["data"] for t in body["inputs"]] == [[base64.b64encode(b"\x89PNG").decode()], [0, 7, 255], [0.5, 1.0]]
    assert "id" not in body and "parameters" not in body and "outputs" not in body


def _bad(change) -> pb.ModelInferRequest:
    request = raw_request()
    change(request)
    return request


@pytest.mark.parametrize("request_, message", [
    (_bad(lambda r: r.raw_input_contents.pop()), "raw_input_contents has 1 entries for 2 inputs"),
    (_bad(lambda r: r.raw_input_contents.__setitem__(1, b"\x00" * 7)), "not a whole number of FP32"),
    (_bad(lambda r: r.raw_input_contents.__setitem__(0, b"\x09\x00\x00\x00ab")), "runs past the tensor's end"),
    (_bad(lambda r: r.inputs[0].contents.bytes_contents.append(b"x")), "has typed contents but the request uses raw"),
    (_bad(lambda r: setattr(r.inputs[1], "datatype", "FP8")), "has no binary form"),
])
def test_malformed_raw_requests_are_invalid_argument(request_, message):
    with pytest.raises(RpcRefusal, match=message) as refused:
        infer_body(request_)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("datatype, fill, message", [
    ("FP32", lambda c: c.int_contents.append(1), "carried in contents.fp32_contents, not int_contents"),
    ("FP16", lambda c: None, "send it in raw_input_contents"),
    ("COMPLEX", lambda c: None, "unknown datatype"),
])
def test_malformed_typed_contents_are_invalid_argument(datatype, fill, message):
    request = pb.ModelInferRequest(model_name=MODEL)
    fill(request.inputs.add(name="x", datatype=datatype, shape=[1]).contents)
    with pytest.raises(RpcRefusal, match=message) as refused:
        infer_body(request)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


ANSWER = {"model_name": MODEL, "model_version": "1.0", "id": "r1", "outputs": [
    {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["3", ""]},
    {"name": "distance", "datatype": "FP32", "shape": [2], "data": [0.25, None]},
    {"name": "unknown", "datatype": "BOOL", "shape": [2], "data": [False, True]},
    {"name": "neighbour_labels", "datatype": "BYTES", "shape": [2, 2], "data": [["3", "8"], ["", ""]]},
    {"name": "neighbour_ids", "datatype": "INT64", "shape": [2, 2], "data": [[4, 9], [-1, -1]]},
]}


def test_answers_go_back_as_raw_output_contents_kserve_decodes():
    response = pb.ModelInferResponse.FromString(infer_response(ANSWER, MODEL, "", "").SerializeToString())
    assert (response.model_name, response.model_version, response.id) == (MODEL, "1.0", "r1")
    assert [o.name for o in response.outputs] == [o["name"] for o in ANSWER["outputs"]]
    assert len(response.raw_output_contents) == len(response.outputs)
    assert not any(o.contents.ListFields() for o in response.outputs)
    label, distance, unknown, labels, ids = response.raw_output_contents

    def strings(raw: bytes) -> list[bytes]:  # how KServe's client reads a raw BYTES tensor
        out, at = [], 0
        while at < len(raw):
            (n,) = struct.unpack_from("<I", raw, at)
            out.append(raw[at + 4:at + 4 + n])
            at += 4 + n
        return out

    assert strings(label) == [b"3", b""] and strings(labels) == [b"3", b"8", b"", b""]
    assert list(response.outputs[3].shape) == [2, 2]
    np.testing.assert_array_equal(np.frombuffer(distance, dtype="<f4"), [0.25, np.nan])
    assert np.frombuffer(unknown, dtype=np.bool_).tolist() == [False, True]
    assert np.frombuffer(ids, dtype="<i8").reshape(2, 2).tolist() == [[4, 9], [-1, -1]]


def test_an_answer_without_outputs_is_internal():
    with pytest.raises(RpcRefusal) as refused:
        infer_response({"error": "x"}, MODEL, "", "")
    assert refused.value.code == grpc.StatusCode.INTERNAL


@pytest.mark.parametrize("method, metadata, allowed", [
    ("/inference.GRPCInferenceService/ServerLive", (), True),
    ("/inference.GRPCInferenceService/ServerReady", (), True),
    ("/inference.GRPCInferenceService/ModelReady", (), False),
    ("/inference.GRPCInferenceService/ModelInfer", (("authorization", f"Bearer {KEY}"),), True),
    ("/inference.GRPCInferenceService/ModelInfer", (("authorization", f"bearer {KEY}"),), True),
    ("/inference.GRPCInferenceService/ModelInfer", (("authorization", "Bearer wrong"),), False),
    ("/inference.GRPCInferenceService/ModelInfer", (("authorization", KEY),), False),
    ("/inference.GRPCInferenceService/ModelMetadata", (("x-api-key", KEY),), True),
    ("/inference.GRPCInferenceService/ModelInfer", (("x-api-key", KEY), ("authorization", "Bearer a.b.c")), True),
    ("/inference.GRPCInferenceService/ModelInfer", (("x-api-key", "wrong"), ("authorization", f"Bearer {KEY}")), False),
    ("/inference.GRPCInferenceService/ModelInfer", (("x-api-key", KEY), ("x-api-key", KEY)), False),
    ("/inference.GRPCInferenceService/ModelInfer",
     (("authorization", f"Bearer {KEY}"), ("authorization", "Bearer wrong")), False),
])
def test_the_bearer_key_guards_all_but_the_health_rpcs(method, metadata, allowed):
    assert grpc_v2.BearerKeyInterceptor(KEY.encode()).allowed(method, metadata) is allowed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ScriptedGateway(Gateway):
    """The real Gateway's checks and metadata; TorchServe replaced by a scripted answer."""

    def __init__(self, status: int = 200, payload: dict | None = None) -> None:
        super().__init__(Upstream("http://127.0.0.1:9", "http://127.0.0.1:9", MODEL, ("1.0",), 6553500, 5.0), KEY)
        self.status, self.payload, self.sent = status, payload or ANSWER, []

    async def upstream_alive(self) -> bool:
        return True

    async def model_is_ready(self) -> bool:
        return True

    async def infer_upstream(self, model, version, body):
        self.sent.append((model, version, json.loads(body)))
        return self.status, json.dumps(self.payload).encode()


def call(gateway: Gateway, rpc: str, request, key: str | None = KEY):
    """One RPC through a real grpc.aio server on loopback: (response or None, status code, details)."""
    async def run():
        server, port = grpc_v2.server(gateway, "127.0.0.1:0", 6553500)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                metadata = (("authorization", f"Bearer {key}"),) if key else ()
                try:
                    return await getattr(stub, rpc)(request, metadata=metadata, timeout=10), grpc.StatusCode.OK, ""
                except grpc.aio.AioRpcError as exc:
                    return None, exc.code(), exc.details()
        finally:
            await server.stop(None)
    return asyncio.run(run())


def test_servicer_answers_health_and_metadata_as_rest_does():
    gateway = ScriptedGateway()
    assert call(gateway, "ServerLive", pb.ServerLiveRequest(), key=None)[0].live is True
    assert call(gateway, "ServerReady", pb.ServerReadyRequest(), key=None)[0].ready is True
    assert call(gateway, "ModelReady", pb.ModelReadyRequest(name=MODEL))[0].ready is True
    meta, _, _ = call(gateway, "ModelMetadata", pb.ModelMetadataRequest(name=MODEL))
    rest = gateway.model_metadata(MODEL)
    assert [(o.name, o.datatype, list(o.shape)) for o in meta.outputs] == \
        [(o["name"], o["datatype"], o["shape"]) for o in rest["outputs"]]
    assert [o.name for o in meta.outputs] == [t[0] for t in (*V2_OUTPUTS, *V2_EMBEDDING_OUTPUTS, V2_ERROR_OUTPUT)]
    assert list(meta.versions) == ["1.0"] and [i.name for i in meta.inputs] == ["image", "pixels", "pixels_uint8"]
    server_meta, _, _ = call(gateway, "ServerMetadata", pb.ServerMetadataRequest())
    assert server_meta.name == "torchserve"


@pytest.mark.parametrize("rpc, request_", [
    ("ModelReady", pb.ModelReadyRequest(name="other")),
    ("ModelMetadata", pb.ModelMetadataRequest(name=MODEL, version="9.9")),
    ("ModelInfer", pb.ModelInferRequest(model_name="other")),
])
def test_unknown_models_are_not_found(rpc, request_):
    _, code, details = call(ScriptedGateway(), rpc, request_)
    assert code == grpc.StatusCode.NOT_FOUND and "is not served here" in details


@pytest.mark.parametrize("key", [None, "wrong"])
def test_without_the_key_rpcs_are_unauthenticated(key):
    gateway = ScriptedGateway()
    _, code, details = call(gateway, "ModelInfer", raw_request(), key=key)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in details
    assert gateway.sent == []


def test_a_refusing_replica_answers_unavailable_and_sends_nothing():
    """Once the shutdown refuses requests, a call is refused with the retryable UNAVAILABLE (REST: 503), not left
    to a stopping server, which may cancel it; health calls are still answered."""
    gateway = ScriptedGateway()
    gateway.drain.refusing = True
    _, code, details = call(gateway, "ModelInfer", raw_request())
    assert code == grpc.StatusCode.UNAVAILABLE and "shutting down" in details
    assert gateway.sent == []
    assert call(gateway, "ServerLive", pb.ServerLiveRequest(), key=None)[0].live is True


def test_model_infer_sends_the_v2_body_and_answers_raw_outputs():
    gateway = ScriptedGateway()
    response, code, _ = call(gateway, "ModelInfer", raw_request(model_version="1.0"))
    assert code == grpc.StatusCode.OK
    ((model, version, body),) = gateway.sent
    assert (model, version) == (MODEL, "1.0") and body == infer_body(raw_request(model_version="1.0"))
    assert [o.name for o in response.outputs] == [o["name"] for o in ANSWER["outputs"]]
    assert len(response.raw_output_contents) == len(ANSWER["outputs"])


@pytest.mark.parametrize("status, code", [(400, grpc.StatusCode.INVALID_ARGUMENT), (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
                                          (503, grpc.StatusCode.UNAVAILABLE), (500, grpc.StatusCode.INTERNAL)])
def test_model_server_refusals_keep_their_message(status, code):
    gateway = ScriptedGateway(status, {"error": "input 'pixels': shape [1, 5] is not an image", "status": status})
    _, got, details = call(gateway, "ModelInfer", raw_request())
    assert got == code and details == "input 'pixels': shape [1, 5] is not an image"


def test_a_malformed_tensor_is_invalid_argument_and_never_reaches_the_model():
    gateway = ScriptedGateway()
    _, code, details = call(gateway, "ModelInfer", _bad(lambda r: r.raw_input_contents.__setitem__(1, b"\x00" * 7)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "FP32" in details and gateway.sent == []


def test_a_taken_grpc_port_fails_only_when_the_port_was_asked_for():
    async def run(required: bool):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            return await _start_grpc(ScriptedGateway(), "127.0.0.1", taken.getsockname()[1], required)

    assert asyncio.run(run(False)) is None
    with pytest.raises(GrpcStartError, match="cannot be served on port"):
        asyncio.run(run(True))


def test_workers_share_one_grpc_port_only_with_reuse_port():
    """The python runtime's workers each serve the runtime's gRPC port (reuse_port); the gateway's one server
    refuses a port another process holds."""
    async def run() -> list:
        (port,) = free_ports(1)
        first = await _start_grpc(ScriptedGateway(), "127.0.0.1", port, True, reuse_port=True)
        second = await _start_grpc(ScriptedGateway(), "127.0.0.1", port, True, reuse_port=True)
        try:
            with pytest.raises(GrpcStartError, match="cannot be served on port"):
                await _start_grpc(ScriptedGateway(), "127.0.0.1", port, True)
            answers = []
            for _ in range(2):
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = pb_grpc.GRPCInferenceServiceStub(channel)
                    answers.append((await stub.ServerLive(pb.ServerLiveRequest(), timeout=10)).live)
            return answers
        finally:
            await first.stop(None)
            await second.stop(None)

    assert asyncio.run(run()) == [True, True]


def test_stubs_are_generated_outside_the_tree_and_stale_when_the_proto_changes(tmp_path):
    from serving import grpc_stubs

    site = tmp_path / "site"
    site.mkdir()
    proto = tmp_path / "grpc_predict_v2.proto"
    proto.write_bytes(grpc_stubs.PROTO.read_bytes())
    assert not grpc_stubs.current(site, proto)
    package = grpc_stubs.generate(site, proto)
    assert package == site / grpc_stubs.PACKAGE and grpc_stubs.current(site, proto)
    assert sorted(p.name for p in package.iterdir() if p.suffix == ".py") == [
        "__init__.py", "grpc_predict_v2_pb2.py", "grpc_predict_v2_pb2_grpc.py"]
    proto.write_bytes(proto.read_bytes() + b"\n// changed\n")
    assert not grpc_stubs.current(site, proto)


def test_the_proto_keeps_the_open_inference_field_numbers():
    """Wire compatibility with every Open Inference client: the numbers of kserve's grpc_predict_v2.proto."""
    def numbers(message) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    request, response = pb.ModelInferRequest, pb.ModelInferResponse
    assert numbers(request) == {"model_name": 1, "model_version": 2, "id": 3, "parameters": 4, "inputs": 5,
                                "outputs": 6, "raw_input_contents": 7}
    assert numbers(request.InferInputTensor) == numbers(response.InferOutputTensor) == {
        "name": 1, "datatype": 2, "shape": 3, "parameters": 4, "contents": 5}
    assert numbers(request.InferRequestedOutputTensor) == {"name": 1, "parameters": 2}
    assert numbers(response) == {"model_name": 1, "model_version": 2, "id": 3, "parameters": 4, "outputs": 5,
                                 "raw_output_contents": 6}
    assert numbers(pb.InferParameter) == {"bool_param": 1, "int64_param": 2, "string_param": 3,
                                          "double_param": 4, "uint64_param": 5}
    assert numbers(pb.InferTensorContents) == {
        "bool_contents": 1, "int_contents": 2, "int64_contents": 3, "uint_contents": 4, "uint64_contents": 5,
        "fp32_contents": 6, "fp64_contents": 7, "bytes_contents": 8}
    assert numbers(pb.ModelMetadataResponse) == {"name": 1, "versions": 2, "platform": 3, "inputs": 4, "outputs": 5}
    assert numbers(pb.ModelMetadataResponse.TensorMetadata) == {"name": 1, "datatype": 2, "shape": 3}
    assert numbers(pb.ModelReadyRequest) == numbers(pb.ModelMetadataRequest) == {"name": 1, "version": 2}
    assert numbers(pb.ServerMetadataResponse) == {"name": 1, "version": 2, "extensions": 3}
    assert pb.DESCRIPTOR.package == "inference"
    assert [m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods] == [
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer"]


def test_the_runtime_serves_grpc_v2_and_leaves_its_port_to_the_inference_service():
    import yaml

    from settings import KSERVE_GRPC_PORT, REPO

    (runtime,) = [d for d in yaml.safe_load_all((REPO / "deploy/kserve/servingruntime.yaml").read_text()) if d]
    assert "grpc-v2" in runtime["spec"]["protocolVersions"]
    (container,) = runtime["spec"]["containers"]
    # KServe merges the InferenceService's ports into the runtime's: a grpc-v2 one declares h2c 8081 alone
    # (tests/unit/test_kserve_compose.py composes both and checks them as Knative would).
    assert "ports" not in container
    assert f"--grpc-port={KSERVE_GRPC_PORT}" in container["args"]
