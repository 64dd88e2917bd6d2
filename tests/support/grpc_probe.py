"""Call the served model over Open Inference gRPC with KServe's own InferenceGRPCClient; print what it read, as JSON.

Runs inside a KServe client virtual environment (scripts/client-venvs.sh), never the project's: it imports only
kserve, grpc and numpy. Usage:

    python -I grpc_probe.py HOST:PORT MODEL KEY INPUT.json [JWT]

INPUT.json: {"pngs": [base64 PNG, ...], "pixels": [[28 x 28 uint8], ...]} (the same digits). Prints
{"version", "checks": {...}, "metadata": {"inputs": [...], "outputs": [[name, datatype, shape], ...]},
"refusals": {case: [status code name, details]}, "cases": {case: {typed output: values}}}.

With JWT, HOST:PORT is Kubeflow's ingress (support.istio_ingress) and the calls are made as docs/kserve.md tells a
caller there: the Kubeflow token as `authorization: Bearer`, the key in `x-api-key`. Prints {"version", "ready",
"labels": [...], "refusals": {case: [status code name, details]}}.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from importlib.metadata import version

import grpc
import numpy as np

TYPED = ("label", "distance", "confidence", "unknown", "neighbour_labels", "neighbour_distances")


def _plain(array: np.ndarray) -> list:
    if array.dtype == np.object_:
        return [_plain(a) if isinstance(a, np.ndarray) else
                (a.decode() if isinstance(a, bytes) else str(a)) for a in array]
    return np.where(np.isnan(array), None, array).tolist() if array.dtype.kind == "f" else array.tolist()


async def refused(call) -> list:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return [exc.code().name, exc.details()]
    return ["OK", ""]


def through_ingress(address: str, model: str, key: str, token: str, pngs: list[bytes]) -> dict:
    from kserve import InferenceGRPCClient, InferInput, InferRequest
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    both = (("authorization", f"Bearer {token}"), ("x-api-key", key))

    def infer_request() -> InferRequest:
        tensor = InferInput("image", [len(pngs)], "BYTES")
        tensor.set_data_from_numpy(np.array(pngs, dtype=np.object_), binary_data=True)
        return InferRequest(model, [tensor])

    async def run() -> dict:
        client = InferenceGRPCClient(address, timeout=60, channel_args=[("grpc.enable_retries", 0)])
        stub = client._client_stub
        try:
            ready = await stub.ModelReady(pb.ModelReadyRequest(name=model), metadata=both)
            response = await client.infer(infer_request(), headers=both)
            labels = _plain(response.get_output_by_name("label").as_numpy())
            cases = {"key as the bearer": (("authorization", f"Bearer {key}"),),
                     "token without the key": (("authorization", f"Bearer {token}"),),
                     "token with a wrong key": (("authorization", f"Bearer {token}"), ("x-api-key", "wrong")),
                     "nothing": ()}
            refusals = {case: await refused(client.infer(infer_request(), headers=headers))
                        for case, headers in cases.items()}
            refusals["server ready, nothing"] = await refused(stub.ServerReady(pb.ServerReadyRequest()))
        finally:
            await client.close()
        return {"ready": ready.ready, "labels": labels, "refusals": refusals}

    return asyncio.run(run())


def main() -> None:
    from kserve import InferenceGRPCClient, InferInput, InferRequest, InferResponse
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    address, model, key, inputs = sys.argv[1:5]
    if len(sys.argv) > 5:
        pngs = [base64.b64decode(p) for p in json.loads(open(inputs).read())["pngs"]]
        print(json.dumps({**through_ingress(address, model, key, sys.argv[5], pngs), "version": version("kserve")}))
        return
    given = json.loads(open(inputs).read())
    pngs = [base64.b64decode(p) for p in given["pngs"]]
    pixels = np.array(given["pixels"], dtype=np.uint8)
    n = len(pngs)
    auth = (("authorization", f"Bearer {key}"),)

    def request(name: str, shape: list[int], datatype: str, data: np.ndarray, raw: bool, model_name: str = model):
        tensor = InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(data, binary_data=raw)  # raw: raw_input_contents, else typed contents
        return InferRequest(model_name, [tensor])

    async def run() -> dict:
        client = InferenceGRPCClient(address, timeout=60, channel_args=[("grpc.enable_retries", 0)])
        out: dict = {"checks": {}, "refusals": {}, "cases": {}}
        try:
            checks = out["checks"]
            checks["server live, no key"] = await client.is_server_live()
            checks["server ready, no key"] = await client.is_server_ready()
            checks["model ready"] = await client.is_model_ready(model, headers=auth)
            meta = await client._client_stub.ModelMetadata(pb.ModelMetadataRequest(name=model), metadata=auth)
            out["metadata"] = {"inputs": [[t.name, t.datatype, list(t.shape)] for t in meta.inputs],
                               "outputs": [[t.name, t.datatype, list(t.shape)] for t in meta.outputs],
                               "versions": list(meta.versions)}
            raw = np.array(pngs, dtype=np.object_)
            fp32 = (pixels.astype(np.float32) / 255.0).reshape(n, 1, 28, 28)
            sent = {
                "BYTES raw": request("image", [n], "BYTES", raw, True),
                "FP32 raw": request("pixels", [n, 1, 28, 28], "FP32", fp32, True),
                "FP32 contents": request("pixels", [n, 784], "FP32", fp32.reshape(n, 784), False),
            }
            for case, infer_request in sent.items():
                response = await client.infer(infer_request, headers=auth)
                out["cases"][case] = {name: _plain(response.get_output_by_name(name).as_numpy()) for name in TYPED}
            # InferInput encodes typed BYTES contents as UTF-8 text only: image bytes go in the message by hand.
            typed_bytes = pb.ModelInferRequest(model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
                name="image", datatype="BYTES", shape=[n], contents=pb.InferTensorContents(bytes_contents=pngs))])
            response = InferResponse.from_grpc(await client._client_stub.ModelInfer(typed_bytes, metadata=auth))
            out["cases"]["BYTES contents"] = {name: _plain(response.get_output_by_name(name).as_numpy())
                                              for name in TYPED}
            good = request("image", [n], "BYTES", raw, True)
            out["refusals"]["no key"] = await refused(client.infer(good))
            out["refusals"]["wrong key"] = await refused(
                client.infer(good, headers=(("authorization", "Bearer not-the-key"),)))
            out["refusals"]["model ready, no key"] = await refused(client.is_model_ready(model))
            out["refusals"]["FP32 raw, 7 bytes"] = await refused(client._client_stub.ModelInfer(pb.ModelInferRequest(
                model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(name="pixels", datatype="FP32",
                                                                                shape=[1, 784])],
                raw_input_contents=[b"\x00" * 7]), metadata=auth))
            out["refusals"]["FP32 of 5 pixels"] = await refused(client.infer(
                request("pixels", [1, 5], "FP32", np.zeros((1, 5), dtype=np.float32), True), headers=auth))
            out["refusals"]["unknown model"] = await refused(client.infer(
                request("image", [n], "BYTES", raw, True, model_name="no-such-model"), headers=auth))
        finally:
            await client.close()
        return out

    result = asyncio.run(run())
    result["version"] = version("kserve")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
